"""BERT's configuration, with the field names of transformers' BertConfig (config.json's)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from bertgpu.errors import UserError
from bertgpu.models.config import ACTIVATIONS, EncoderConfig


@dataclass
class BertConfig(EncoderConfig):
    """The architecture, with the field names of transformers' BertConfig."""

    model_type: ClassVar[str] = "bert"
    title: ClassVar[str] = "BERT"
    nsp: ClassVar[bool] = True
    # --recipe fast's peak rate is the sweep's rate times ``fast_lr_factor``, with this Adam beta2 and warmup (a share
    # of the run; recipe.choose). A 20% warmup, not 6%: at small, 400 steps, 0.09 nats lower (BENCHMARKS.md: The
    # recipe's rate and run length).
    fast_adam_beta2: ClassVar[float] = 0.999
    fast_warmup: ClassVar[float] = 0.2
    intermediate_ratio: ClassVar[float] = 4  # intermediate = 4 x hidden
    # --recipe fast's --mlm-bias-init: at the token frequencies, 0.18 nats lower in the fp32 race and off the
    # plateau at twice the rate (BENCHMARKS.md: The masked-LM bias at the token frequencies).
    fast_mlm_bias_init: ClassVar[str] = "unigram"
    # Fine-tuning's default peak rate is finetune_lr(hidden_size) times this.
    finetune_lr_factor: ClassVar[float] = 1.0
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    classifier_dropout: float | None = None
    # Sequence classification (fine-tuning): label names by id, as transformers stores them.
    id2label: dict[int, str] | None = None
    problem_type: str | None = None  # a sequence head's: regression, single_ or multi_label_classification
    # bertgpu's own (not BertConfig's; None: not written): "mean" classifies the mean of the last hidden states
    # instead of the pooler's tanh(W h_[CLS]) (finetune --pooling; transformers' BertForSequenceClassification
    # ignores it and reads the pooler).
    classifier_pooling: str | None = None

    def __post_init__(self) -> None:
        self.check_shape()
        if self.hidden_act not in ACTIVATIONS:
            raise UserError(f"unsupported hidden_act {self.hidden_act!r} (supported: {', '.join(ACTIVATIONS)})")
        if self.classifier_pooling not in (None, "pooler", "mean"):
            raise UserError(f"classifier_pooling must be pooler or mean, not {self.classifier_pooling!r}")

    @property
    def fast_lr_factor(self) -> float:
        """Twice the sweep's rate up to a width of 256 (tiny, mini): with the recipe's masked-LM bias at the token
        frequencies it left the unigram plateau in the 381 steps of the fp32 race and ended 0.18 nats lower, and
        fine-tuned as well after the 10-minute reviews run where, with a zero bias, it had stayed on the plateau
        (BENCHMARKS.md: The masked-LM bias at the token frequencies). Wider, the sweep's rate: small at twice it
        stayed on the plateau for 400 steps (measured with a zero bias)."""
        return 2.0 if self.hidden_size <= 256 else 1.0

    def with_dropout(self, p: float) -> BertConfig:
        """Every dropout probability set to ``p`` (pretrain --dropout)."""
        return dataclasses.replace(self, hidden_dropout_prob=p, attention_probs_dropout_prob=p)

    def for_finetuning(self, dropout: float, pooling: str) -> BertConfig:
        """As fine-tuning trains it: every dropout, the classifier's included, at ``dropout``; the classifier
        reading ``pooling`` ("pooler": the pooler, or "mean")."""
        return dataclasses.replace(
            self.with_dropout(dropout),
            classifier_dropout=None,  # follows hidden_dropout_prob
            classifier_pooling="mean" if pooling == "mean" else None,
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> BertConfig:
        """Read a Hugging Face BERT config.json dict; keys we do not model are ignored."""
        if d.get("model_type", cls.model_type) != cls.model_type:
            raise UserError(f"not a {cls.title} config (model_type={d.get('model_type')!r})")
        return cls(**cls.known_fields(d))

    def to_hf_dict(self, architecture: str = "BertForPreTraining") -> dict[str, Any]:
        return {**self.hf_dict(architecture), "position_embedding_type": "absolute"}
