"""BERT (Devlin et al. 2019), as transformers' ``BertFor*``: its registry entry.

The folder holds all of it: ``config.py`` (transformers' BertConfig fields), ``model.py`` (the model classes and
their FLOPs), ``stages.py`` (its pipeline stages for --pp), and the tensor-parallel plan and the rest below.
"""

from __future__ import annotations

from types import ModuleType

from bertgpu.models.bert.config import BertConfig
from bertgpu.models.config import PRESETS
from bertgpu.models.spec import Architecture


def _module() -> ModuleType:
    from bertgpu.models.bert import model

    return model


def _preset(name: str, vocab_size: int, vocab: list[str] | None) -> BertConfig:
    return BertConfig.preset(name, vocab_size=vocab_size)


_COLWISE, _ROWWISE = ("colwise", 1), ("rowwise", 1)

ARCHITECTURE = Architecture(
    "bert",
    BertConfig,
    _module,
    "BertForPreTraining",
    head_classes={
        "sequence": "BertForSequenceClassification",
        "token": "BertForTokenClassification",
        "span": "BertForQuestionAnswering",
    },
    tokenizer_json=False,
    lora_targets=(
        "query",
        "key",
        "value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
        "dense",
    ),
    presets=tuple(PRESETS),
    preset=_preset,
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
    stages="bertgpu.models.bert.stages",
    pooler=True,
    hf_reads_mean_pooling=False,
    pooling_words=(
        "the pooler, tanh(W h_[CLS])",
        "mean of the last hidden states (classifier_pooling mean in config.json: transformers' "
        "BertForSequenceClassification ignores it and reads the untrained pooler, so use bertgpu predict)",
    ),
)
