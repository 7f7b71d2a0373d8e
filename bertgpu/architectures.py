"""Which architecture a model is, and its classes: the one place the tasks dispatch on it.

``bert`` is ``bertgpu.model`` (BERT as Devlin et al., transformers' ``BertFor*``), ``modernbert`` is
``bertgpu.modernbert`` (transformers' ``ModernBertFor*``). A config is a ``config.ModelConfig`` or a
``config.ModernBertConfig``; a config.json says which by its ``model_type``
(``ModelConfig.load`` returns either).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import nn

from .config import OWN_SHAPES, PRESETS, ModelConfig, ModernBertConfig
from .errors import UserError


@dataclass(frozen=True)
class Architecture:
    """What the rest of bertgpu asks of an architecture, one entry each (``ARCHITECTURES``), so that no
    other module branches on which one a model is (torchtitan's TrainSpec; issue 39 moves the rest here)."""

    name: str  # --arch, and the config's model_type
    title: str  # as a model card names it
    config_class: type
    masked_lm_class: str  # transformers' class of a pretraining checkpoint
    classification_class: str  # transformers' class of a fine-tuned classifier
    nsp: bool  # a next-sentence head (and a pooler) beside the masked-LM head
    tokenizer_json: bool  # transformers reads its tokenizer from tokenizer.json only (no slow one to convert)
    lora: bool  # --lora-rank can fine-tune it (PEFT's targets are BERT's linear layers)


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        "bert",
        "BERT",
        ModelConfig,
        "BertForPreTraining",
        "BertForSequenceClassification",
        nsp=True,
        tokenizer_json=False,
        lora=True,
    ),
    "modernbert": Architecture(
        "modernbert",
        "ModernBERT",
        ModernBertConfig,
        "ModernBertForMaskedLM",
        "ModernBertForSequenceClassification",
        nsp=False,
        tokenizer_json=True,
        lora=False,
    ),
}
ARCHS = tuple(ARCHITECTURES)


def arch_of(config: Any) -> str:
    return "modernbert" if config.model_type == "modernbert" else "bert"


def of(config: Any) -> Architecture:
    """The registry entry of the architecture ``config`` (a model's config) is."""
    return ARCHITECTURES[arch_of(config)]


def presets(arch: str) -> list[str]:
    return [*PRESETS, *OWN_SHAPES] if arch == "modernbert" else list(PRESETS)


def preset(arch: str, name: str, vocab_size: int, vocab: list[str] | None = None) -> Any:
    """The preset ``name`` of ``arch`` for a vocab of ``vocab_size`` tokens (``vocab``: its tokens, whose
    [PAD], [CLS] and [SEP] ids a ModernBERT config records)."""
    if arch == "bert":
        return ModelConfig.preset(name, vocab_size=vocab_size)
    ids = {t: i for i, t in enumerate(vocab or [])}
    return ModernBertConfig.preset(
        name,
        vocab_size,
        pad_token_id=ids.get("[PAD]", 0),
        cls_token_id=ids.get("[CLS]"),
        sep_token_id=ids.get("[SEP]"),
    )


def with_dropout(config: Any, p: float) -> Any:
    """``config`` with every dropout probability at ``p``."""
    if arch_of(config) == "modernbert":
        return config.with_dropout(p)
    return dataclasses.replace(config, hidden_dropout_prob=p, attention_probs_dropout_prob=p)


def for_finetuning(config: Any, dropout: float, pooling: str) -> Any:
    """``config`` as fine-tuning trains it: every dropout probability, the classifier's included, at ``dropout``,
    and the classifier reading ``pooling`` ("pooler": BERT's pooler, ModernBERT's [CLS]; or "mean")."""
    if arch_of(config) == "modernbert":
        return dataclasses.replace(
            config.with_dropout(dropout),
            classifier_dropout=dropout,
            classifier_pooling="mean" if pooling == "mean" else "cls",
        )
    return dataclasses.replace(
        with_dropout(config, dropout),
        classifier_dropout=None,  # follows hidden_dropout_prob
        classifier_pooling="mean" if pooling == "mean" else None,
    )


def pooling_of(config: Any) -> str:
    """What a classification config's classifier reads: "pooler" or "mean" (finetune --pooling's names)."""
    return "mean" if config.classifier_pooling == "mean" else "pooler"


def pretraining_model(config: Any, pad_vocab_multiple: int = 1) -> nn.Module:
    """BertForPreTraining or ModernBertForMaskedLM: forward(input_ids, token_type_ids, attention_mask,
    mlm_positions) -> (mlm_logits, nsp_logits; zeros for ModernBERT)."""
    if arch_of(config) == "modernbert":
        from .modernbert import ModernBertForMaskedLM

        return ModernBertForMaskedLM(config, pad_vocab_multiple=pad_vocab_multiple)
    from .model import BertForPreTraining

    return BertForPreTraining(config, pad_vocab_multiple=pad_vocab_multiple)


def use_document_attention(model: nn.Module, on: bool = True) -> nn.Module:
    """Let ``model`` read ``attention_mask`` as document numbers (a --pack row's: 1, 2, ... per document, 0 on
    padding) and keep each token's attention within its document (``BertModel.documents``,
    ``ModernBertModel.documents``), or (``on`` False) as the 0/1 key padding again."""
    from .model import BertModel
    from .modernbert import ModernBertModel

    for module in model.modules():
        if isinstance(module, (BertModel, ModernBertModel)):
            module.documents = on
    return model


def prefer_flex_attention(model: nn.Module, device: str) -> nn.Module:
    """A ModernBERT on CUDA attends through FlexAttention (block masks: the blocks outside a local layer's
    window are skipped, no L x L mask is held), where this torch has it; elsewhere through SDPA."""
    inner = getattr(model, "model", None)
    if device == "cuda" and getattr(inner, "attention", None) == "sdpa":
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError:
            return model
        inner.attention = "flex"
    return model


def classification_model(config: Any) -> nn.Module:
    if arch_of(config) == "modernbert":
        from .modernbert import ModernBertForSequenceClassification

        return ModernBertForSequenceClassification(config)
    from .model import BertForSequenceClassification

    return BertForSequenceClassification(config)


def encoder(model: nn.Module) -> nn.Module:
    """The bare encoder inside a classifier (what a pretrained checkpoint's weights are loaded into when
    the head is fresh). ModernBERT's classifier takes the whole file: its ``head`` is the masked-LM head's
    transform, which transformers also loads from a ModernBertForMaskedLM; the classifier stays new."""
    return model if arch_of(model.config) == "modernbert" else model.bert


def mlm_head_missing(model: nn.Module, missing: list[str]) -> bool:
    """Whether loading left the masked-LM head of ``model`` (a pretraining model) without weights."""
    prefixes = getattr(model, "mlm_head_prefixes", ("cls.predictions",))
    return any(name.startswith(prefixes) for name in missing)


def class_names(config: Any) -> tuple[str, str]:
    """transformers' (masked-LM, sequence-classification) class names of this architecture."""
    entry = of(config)
    return entry.masked_lm_class, entry.classification_class


def training_flops_per_sequence(config: Any, seq_len: int, num_predictions: int) -> float:
    if arch_of(config) == "modernbert":
        from .modernbert import training_flops_per_sequence as flops
    else:
        from .model import training_flops_per_sequence as flops
    return flops(config, seq_len, num_predictions)


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
    """An --arch that contradicts the model directory's own."""
    if arch != arch_of(config):
        raise UserError(f"--arch {arch}, but {where} is a {arch_of(config)} model: leave --arch out or give another")
