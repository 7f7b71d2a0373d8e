"""ModernBERT (Warner et al. 2024), as transformers' ``ModernBertFor*``: its registry entry.

The folder holds all of it: ``config.py`` (transformers' ModernBertConfig fields), ``model.py`` (rotary, GeGLU,
local and global attention; the model classes and their FLOPs), ``stages.py`` (its pipeline stages for --pp),
and the tensor-parallel plan of its fused weights below.
"""

from __future__ import annotations

from types import ModuleType

from bertgpu.models.config import PRESETS
from bertgpu.models.modernbert.config import OWN_SHAPES, ModernBertConfig
from bertgpu.models.spec import Architecture


def _module() -> ModuleType:
    from bertgpu.models.modernbert import model

    return model


def _preset(name: str, vocab_size: int, vocab: list[str] | None) -> ModernBertConfig:
    ids = {t: i for i, t in enumerate(vocab or [])}  # a ModernBERT config records its special tokens' ids
    return ModernBertConfig.preset(
        name,
        vocab_size,
        pad_token_id=ids.get("[PAD]", 0),
        cls_token_id=ids.get("[CLS]"),
        sep_token_id=ids.get("[SEP]"),
    )


_ROWWISE = ("rowwise", 1)

ARCHITECTURE = Architecture(
    "modernbert",
    ModernBertConfig,
    _module,
    "ModernBertForMaskedLM",
    head_classes={
        "sequence": "ModernBertForSequenceClassification",
        "token": "ModernBertForTokenClassification",
        "span": "ModernBertForQuestionAnswering",
    },
    tokenizer_json=True,
    lora_targets=(),  # --lora-rank fine-tunes BERT's linear layers only
    presets=(*PRESETS, *OWN_SHAPES),
    preset=_preset,
    mlp_widths=3,
    # The fused Wqkv (q, k, v) and Wi (input, gate): each process the matching rows of every chunk.
    tp_plan={"attn.Wqkv": ("colwise", 3), "attn.Wo": _ROWWISE, "mlp.Wi": ("colwise", 2), "mlp.Wo": _ROWWISE},
    tp_fused="fused Q/K/V and GeGLU weights",
    stages="bertgpu.models.modernbert.stages",
    pooler=False,
    hf_reads_mean_pooling=True,
    pooling_words=(
        "[CLS] through the head",
        "mean of the last hidden states (classifier_pooling mean, as transformers reads it)",
    ),
)
