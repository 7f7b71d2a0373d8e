"""Which architecture a model is, and all that differs between architectures: one ``Architecture`` entry
each in ``ARCHITECTURES``, the one place the rest of bertgpu asks (torchtitan's TrainSpec).

``bert`` is ``bertgpu.model`` (BERT as Devlin et al., transformers' ``BertFor*``), ``modernbert`` is
``bertgpu.modernbert`` (transformers' ``ModernBertFor*``). A config is a ``config.ModelConfig`` or a
``config.ModernBertConfig``; a config.json says which by its ``model_type`` (``ModelConfig.load`` returns the
class ``config.MODEL_CONFIGS`` names for it). Other modules ask ``of(config)`` (or ``by_name(--arch)``) for the
entry, or call a model's own methods (``model_interface.EncoderModel``); none branches on which architecture
it is, nor probes a model with ``getattr``/``hasattr`` (tests/test_architecture.py checks both).

A third architecture is one new file plus its entry here (and its config class in config.py, where every
configuration is). The file (like ``modernbert.py``) provides:

- its model classes, named as transformers names them (the entry's ``masked_lm_class`` and
  ``classification_class``), each an ``EncoderModel`` that declares its tied weights, the prefixes of its
  encoder and masked-LM head, where it holds the bare encoder, and defines ``encoder_layers()`` and
  ``use_documents()`` (and, where they differ from the defaults, ``encoder_to_load()``, ``freeze_unread()``,
  ``use_flex_attention()``); the masked-LM model's
  forward(input_ids, token_type_ids, attention_mask, mlm_positions) returns (mlm_logits, nsp_logits or zeros
  [B, 2]), the classifier's forward(input_ids, token_type_ids, attention_mask) the logits;
- ``training_flops_per_sequence(config, seq_len, num_predictions)``, for MFU.

Its config class (config.py, listed in ``config.MODEL_CONFIGS``, which --arch's choices are) has ``model_type``,
``title``, ``nsp``, ``preset()``, ``with_dropout()``, ``for_finetuning()``, ``from_hf_dict()``, ``to_hf_dict()``
and ``classifier_pooling``. Pipeline parallelism
(``--pp``) needs a module of stages in bertgpu/parallel/ (``Stage`` and ``keep``, as ``bert_stages.py``); the
rest of the parallel layout (tensor parallelism, activation checkpointing, FSDP) is the entry's ``tp_plan``
over ``encoder_layers()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from torch import nn

from .config import OWN_SHAPES, PRESETS, ModelConfig, ModernBertConfig
from .errors import UserError


def _bert() -> ModuleType:
    from . import model

    return model


def _modernbert() -> ModuleType:
    from . import modernbert

    return modernbert


def _bert_preset(name: str, vocab_size: int, vocab: list[str] | None) -> ModelConfig:
    return ModelConfig.preset(name, vocab_size=vocab_size)


def _modernbert_preset(name: str, vocab_size: int, vocab: list[str] | None) -> ModernBertConfig:
    ids = {t: i for i, t in enumerate(vocab or [])}  # a ModernBERT config records its special tokens' ids
    return ModernBertConfig.preset(
        name,
        vocab_size,
        pad_token_id=ids.get("[PAD]", 0),
        cls_token_id=ids.get("[CLS]"),
        sep_token_id=ids.get("[SEP]"),
    )


@dataclass(frozen=True)
class Architecture:
    """What the rest of bertgpu asks of an architecture, one entry each (``ARCHITECTURES``)."""

    name: str  # --arch, and the config's model_type
    config_class: type  # config.py's: its model_type, title (as a model card names it) and nsp
    module: Callable[[], ModuleType]  # its own module (imported when first asked): model classes, FLOPs
    masked_lm_class: str  # transformers' class of a pretraining checkpoint, and ours of that name
    classification_class: str  # transformers' class of a fine-tuned classifier, and ours
    tokenizer_json: bool  # transformers reads its tokenizer from tokenizer.json only (no slow one to convert)
    lora: bool  # --lora-rank can fine-tune it (PEFT's targets are BERT's linear layers)
    presets: tuple[str, ...]  # pretrain --model's preset names
    preset: Callable[[str, int, list[str] | None], Any]  # (name, vocab_size, vocab's tokens) -> its config
    # Activations of the intermediate width that one token's MLP keeps for the backward pass, in units of
    # intermediate_size (memory.py): BERT's input and GELU output of W1; a GeGLU's Wi output (2) and product.
    mlp_widths: int
    # Tensor parallelism of every encoder layer: submodule -> ("colwise" or "rowwise", chunks), chunks > 1 for a
    # weight that stacks that many matrices by rows (split as strided shards: parallel/modernbert_tp.py).
    tp_plan: Mapping[str, tuple[str, int]]
    tp_fused: str  # what the fused weights are, for --tp's one-line errors ("": none)
    stages: str  # the module of bertgpu/parallel/ that cuts it into pipeline stages (parallel/ sits above this one)
    pooler: bool  # a pooler (tanh(W h_[CLS])) that NSP trains and fine-tuning's --pooling pooler reads
    hf_reads_mean_pooling: bool  # transformers' classifier reads classifier_pooling "mean" from config.json
    # The model card's words for what the classifier reads: with --pooling pooler, with --pooling mean.
    pooling_words: tuple[str, str]

    @property
    def title(self) -> str:
        return self.config_class.title

    @property
    def nsp(self) -> bool:
        """A next-sentence head (and a pooler) beside the masked-LM head."""
        return self.config_class.nsp


_COLWISE, _ROWWISE = ("colwise", 1), ("rowwise", 1)

ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        "bert",
        ModelConfig,
        _bert,
        "BertForPreTraining",
        "BertForSequenceClassification",
        tokenizer_json=False,
        lora=True,
        presets=tuple(PRESETS),
        preset=_bert_preset,
        mlp_widths=2,
        tp_plan={
            "attention.self.query": _COLWISE,
            "attention.self.key": _COLWISE,
            "attention.self.value": _COLWISE,
            "attention.output.dense": _ROWWISE,
            "intermediate.dense": _COLWISE,
            "output.dense": _ROWWISE,
        },
        tp_fused="",
        stages="bert_stages",
        pooler=True,
        hf_reads_mean_pooling=False,
        pooling_words=(
            "the pooler, tanh(W h_[CLS])",
            "mean of the last hidden states (classifier_pooling mean in config.json: transformers' "
            "BertForSequenceClassification ignores it and reads the untrained pooler, so use bertgpu predict)",
        ),
    ),
    "modernbert": Architecture(
        "modernbert",
        ModernBertConfig,
        _modernbert,
        "ModernBertForMaskedLM",
        "ModernBertForSequenceClassification",
        tokenizer_json=True,
        lora=False,
        presets=(*PRESETS, *OWN_SHAPES),
        preset=_modernbert_preset,
        mlp_widths=3,
        # The fused Wqkv (q, k, v) and Wi (input, gate): each process the matching rows of every chunk.
        tp_plan={"attn.Wqkv": ("colwise", 3), "attn.Wo": _ROWWISE, "mlp.Wi": ("colwise", 2), "mlp.Wo": _ROWWISE},
        tp_fused="fused Q/K/V and GeGLU weights",
        stages="modernbert_stages",
        pooler=False,
        hf_reads_mean_pooling=True,
        pooling_words=(
            "[CLS] through the head",
            "mean of the last hidden states (classifier_pooling mean, as transformers reads it)",
        ),
    ),
}
ARCHS = tuple(ARCHITECTURES)
DEFAULT = ARCHS[0]  # pretrain --arch's default, and the architecture of a run record that names none


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


def classification_model(config: Any) -> nn.Module:
    return _class(config, of(config).classification_class)(config)


def encoder(model: nn.Module) -> nn.Module:
    """What a pretrained checkpoint's weights are loaded into when the classifier's head is fresh: BERT's bare
    encoder; ModernBERT's whole classifier (``EncoderModel.encoder_to_load``)."""
    return model.encoder_to_load()


def mlm_head_missing(model: nn.Module, missing: list[str]) -> bool:
    """Whether loading left the masked-LM head of ``model`` (a pretraining model) without weights."""
    return any(name.startswith(model.mlm_head_prefixes) for name in missing)


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
