"""Which architecture a model is: the registry of one ``Architecture`` entry per architecture (torchtitan's
TrainSpec), the one place the rest of bertgpu asks.

Each architecture is a folder of ``bertgpu/models/``: ``bert/`` (BERT as Devlin et al., transformers' ``BertFor*``)
and ``modernbert/`` (transformers' ``ModernBertFor*``). A config is one of their ``EncoderConfig`` classes; a
config.json says which by its ``model_type`` (``load_config``). Other modules ask ``of(config)`` (or
``by_name(--arch)``) for the entry, or call a model's own methods (``interface.EncoderModel``); none imports an
architecture's folder (this registry imports each one's package, its entry), branches on which architecture it
is, names its modules or parameters, nor probes a model with ``getattr``/``hasattr`` (tests/test_architecture.py
checks all four).

A third architecture is one new folder plus its line in ``ARCHITECTURES`` below. The folder provides:

- ``config.py``: its ``EncoderConfig`` (models/config.py), a dataclass of transformers' field names, with
  ``model_type``, ``title``, ``nsp``, ``preset()``, ``with_dropout()``, ``for_finetuning()``, ``from_hf_dict()``,
  ``to_hf_dict()`` and ``classifier_pooling``;
- ``model.py``: its model classes, named as transformers names them (the entry's ``masked_lm_class`` and
  ``head_classes``), each an ``EncoderModel`` that declares its tied weights, the prefixes of its
  encoder and masked-LM head, where it holds the bare encoder, its tensors with a row per vocabulary word, and
  defines ``encoder_layers()`` and ``use_documents()`` (and, where they differ from the defaults, the NSP
  head's prefixes, the file keys it ignores, a fine-tuning head's kind and modules, ``encoder_to_load()``,
  ``freeze_unread()``, ``use_flex_attention()``, ``use_varlen_attention()``, ``use_fused_qkv()``,
  ``use_next_sentence()``); the masked-LM model's forward(input_ids, token_type_ids, attention_mask,
  mlm_positions) returns (mlm_logits, nsp_logits or zeros [B, 2]), each fine-tuning head's
  forward(input_ids, token_type_ids, attention_mask) its logits (sequence [B, num_labels], token
  [B, L, num_labels], span [B, L, 2]: start, then end); and
  ``training_flops_per_sequence(config, seq_len, num_predictions)``, for MFU;
- ``stages.py``: its pipeline stages (``Stage`` and ``keep``) for ``--pp``;
- ``__init__.py``: its ``ARCHITECTURE`` entry (models/spec.py), with the tensor-parallel plan over
  ``encoder_layers()`` (activation checkpointing and FSDP need nothing more).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.errors import UserError
from bertgpu.models import bert, modernbert
from bertgpu.models.spec import Architecture

if TYPE_CHECKING:
    from torch import nn

# One entry per architecture, each in its own folder (bertgpu/models/<name>/__init__.py); the first is the default.
ARCHITECTURES: dict[str, Architecture] = {entry.name: entry for entry in (bert.ARCHITECTURE, modernbert.ARCHITECTURE)}
ARCHS = tuple(ARCHITECTURES)
CONFIGS: dict[str, type] = {entry.name: entry.config_class for entry in ARCHITECTURES.values()}
DEFAULT = ARCHS[0]  # pretrain --arch's default, and the architecture of a run record that names none
# --lora-targets' choices, as its help lists them: the linear layers of every architecture --lora-rank fine-tunes.
LORA_CHOICES = tuple(dict.fromkeys(name for entry in ARCHITECTURES.values() for name in entry.lora_targets))


def arch_of(config: Any) -> str:
    return config.model_type if config.model_type in ARCHITECTURES else DEFAULT


def of(config: Any) -> Architecture:
    """The registry entry of the architecture ``config`` (a model's config) is."""
    return ARCHITECTURES[arch_of(config)]


def by_name(name: str | None) -> Architecture:
    """The entry of an --arch (a run record's "arch"; none or an unknown one: the default's)."""
    return ARCHITECTURES.get(name or DEFAULT, ARCHITECTURES[DEFAULT])


def presets(arch: str) -> list[str]:
    return list(ARCHITECTURES[arch].presets)


def preset(arch: str, name: str, vocab_size: int, vocab: list[str] | None = None) -> Any:
    """The preset ``name`` of ``arch`` for a vocab of ``vocab_size`` tokens (``vocab``: its tokens, whose
    [PAD], [CLS] and [SEP] ids a ModernBERT config records)."""
    return ARCHITECTURES[arch].preset(name, vocab_size, vocab)


def with_dropout(config: Any, p: float) -> Any:
    """``config`` with every dropout probability at ``p``."""
    return config.with_dropout(p)


def for_finetuning(config: Any, dropout: float, pooling: str) -> Any:
    """``config`` as fine-tuning trains it: every dropout probability, the classifier's included, at ``dropout``,
    and the classifier reading ``pooling`` ("pooler": BERT's pooler, ModernBERT's [CLS]; or "mean")."""
    return config.for_finetuning(dropout, pooling)


def pooling_of(config: Any) -> str:
    """What a classification config's classifier reads: "pooler" or "mean" (finetune --pooling's names)."""
    return "mean" if config.classifier_pooling == "mean" else "pooler"


def _class(config: Any, name: str) -> type[nn.Module]:
    return vars(of(config).module())[name]


def pretraining_model(config: Any, pad_vocab_multiple: int = 1) -> nn.Module:
    """BertForPreTraining or ModernBertForMaskedLM: forward(input_ids, token_type_ids, attention_mask,
    mlm_positions) -> (mlm_logits, nsp_logits; zeros for ModernBERT)."""
    return _class(config, of(config).masked_lm_class)(config, pad_vocab_multiple=pad_vocab_multiple)


def use_document_attention(model: nn.Module, on: bool = True) -> nn.Module:
    """Let ``model`` read ``attention_mask`` as document numbers (a --pack row's: 1, 2, ... per document, 0 on
    padding) and keep each token's attention within its document (``BertModel.documents``,
    ``ModernBertModel.documents``), or (``on`` False) as the 0/1 key padding again."""
    model.use_documents(on)
    return model


def prefer_flex_attention(model: nn.Module, device: str) -> nn.Module:
    """A model on CUDA attends through FlexAttention where its architecture has it (ModernBERT: block masks,
    the blocks outside a local layer's window skipped, no L x L mask held) and this torch has it; elsewhere
    as it was built (SDPA)."""
    if device == "cuda":
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError:
            return model
        model.use_flex_attention()
    return model


def head_class_name(config: Any, head: str) -> str:
    """transformers' class (and ours) of the fine-tuning ``head`` ("sequence", "token" or "span") of ``config``'s
    architecture: what a fine-tuned directory's config.json names in ``architectures``."""
    classes = of(config).head_classes
    if head not in classes:
        raise ValueError(f"no fine-tuning head {head!r} (heads: {', '.join(classes)})")
    return classes[head]


def head_model(config: Any, head: str) -> nn.Module:
    """A new model of ``config`` with the fine-tuning ``head`` ("sequence": BertForSequenceClassification, "token":
    BertForTokenClassification, "span": BertForQuestionAnswering, or ModernBERT's); forward(input_ids,
    token_type_ids, attention_mask) -> logits [B, num_labels], [B, L, num_labels] or [B, L, 2]."""
    return _class(config, head_class_name(config, head))(config)


def classification_model(config: Any) -> nn.Module:
    """A new sequence classifier of ``config`` (``head_model(config, "sequence")``)."""
    return head_model(config, "sequence")


def encoder(model: nn.Module) -> nn.Module:
    """What a pretrained checkpoint's weights are loaded into when the classifier's head is fresh: BERT's bare
    encoder; ModernBERT's whole classifier (``EncoderModel.encoder_to_load``)."""
    return model.encoder_to_load()


def mlm_head_missing(model: nn.Module, missing: list[str]) -> bool:
    """Whether loading left the masked-LM head of ``model`` (a pretraining model) without weights."""
    return any(name.startswith(model.mlm_head_prefixes) for name in missing)


def nsp_head_missing(model: nn.Module, missing: list[str]) -> bool:
    """Whether loading left the next-sentence head of ``model`` (a pretraining model that has one) without weights."""
    return any(name.startswith(model.nsp_head_prefixes) for name in missing)


def class_names(config: Any) -> tuple[str, str]:
    """transformers' (masked-LM, sequence-classification) class names of this architecture."""
    entry = of(config)
    return entry.masked_lm_class, entry.classification_class


def training_flops_per_sequence(config: Any, seq_len: int, num_predictions: int) -> float:
    return of(config).module().training_flops_per_sequence(config, seq_len, num_predictions)


def training_flops(config: Any, sequences: float, tokens: float, masked: float) -> float:
    """Model FLOPs of training on ``sequences`` rows holding ``tokens`` real (non-padding) tokens and
    ``masked`` scored masked slots in all, for MFU on real tokens: padding and empty prediction slots are
    no work. ``training_flops_per_sequence`` of the mean row (tokens/sequences real tokens, masked/sequences
    predictions) times the rows: exact for every term linear in the tokens (the matmuls of the layers and the
    heads); the attention's scores and weighted sum are charged each real token attending the row's mean real
    length (a lower bound of its sum over rows of their squared lengths; at most a few percent of the total
    at 128 tokens)."""
    if sequences <= 0:
        return 0.0
    return sequences * training_flops_per_sequence(config, tokens / sequences, masked / sequences)


def check_arch(arch: str, config: Any, where: str) -> None:
    """An --arch that contradicts the model directory's own. The default is what --arch says when left out,
    so it contradicts nothing: the directory's own architecture is kept."""
    if arch != DEFAULT and arch != arch_of(config):
        raise UserError(f"--arch {arch}, but {where} is a {arch_of(config)} model: leave --arch out or give another")


def config_from_hf_dict(d: dict[str, Any]) -> Any:
    """The configuration a Hugging Face config.json dict describes: its ``model_type``'s class (BERT's when it
    names none); keys that class does not model are ignored."""
    kind = CONFIGS.get(d.get("model_type", DEFAULT))
    if kind is None:
        raise UserError(f"not a BERT or ModernBERT config (model_type={d.get('model_type')!r})")
    return kind.from_hf_dict(d)


def load_config(path: str | os.PathLike) -> Any:
    """The configuration of a config.json file or of a directory holding one."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return config_from_hf_dict(json.load(f))
    except FileNotFoundError:
        raise UserError(f"model config not found: {path}") from None
    except (json.JSONDecodeError, TypeError, AttributeError) as e:
        raise UserError(f"{path}: not a valid BERT config.json ({e})") from None


def saved_class(path: str | os.PathLike) -> str | None:
    """The transformers class a model directory's config.json names (its ``architectures``' first), if any."""
    try:
        names = json.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    return names[0] if names and isinstance(names[0], str) else None
