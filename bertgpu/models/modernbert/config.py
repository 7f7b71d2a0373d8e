"""ModernBERT's configuration, with the field names of transformers' ModernBertConfig (config.json's)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from bertgpu.errors import UserError
from bertgpu.models.config import ACTIVATIONS, EncoderConfig

# (layers, hidden, heads, intermediate) of ModernBERT's own two models (answerdotai/ModernBERT-base, -large):
# deeper and narrower than BERT's of the same name, with a GeGLU width of their own.
OWN_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "modernbert-base": (22, 768, 12, 1152),
    "modernbert-large": (28, 1024, 16, 2624),
}
# The GeGLU width of a preset of BERT's shape (tiny ... large): ModernBERT-base's 1152 / 768.
GEGLU_RATIO = 1.5


@dataclass
class ModernBertConfig(EncoderConfig):
    """The architecture, with the field names of transformers' ModernBertConfig (config.json's)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 0
    cls_token_id: int | None = None
    sep_token_id: int | None = None
    global_attn_every_n_layers: int = 3
    local_attention: int = 128  # the whole window: a token sees local_attention // 2 positions either side
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    attention_bias: bool = False
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    # Which layers attend globally ("full_attention") or locally ("sliding_attention"); None: every
    # global_attn_every_n_layers-th from layer 0, as ModernBERT.
    layer_types: list[str] | None = None
    # Sequence classification (fine-tuning): label names by id, as transformers stores them.
    id2label: dict[int, str] | None = None
    problem_type: str | None = None  # a sequence head's: regression, single_ or multi_label_classification

    model_type: ClassVar[str] = "modernbert"
    title: ClassVar[str] = "ModernBERT"
    nsp: ClassVar[bool] = False  # masked LM only
    # A BERT preset's depth, width and heads (tiny ... large; GeGLU width 1.5 x hidden, as ModernBERT-base), or
    # ModernBERT's own shape (modernbert-base, modernbert-large).
    own_shapes: ClassVar[dict[str, tuple[int, int, int, int]]] = OWN_SHAPES
    intermediate_ratio: ClassVar[float] = GEGLU_RATIO
    # Pre-norm layers take twice BERT's rate, with ModernBERT's own beta2 (Warner et al. 2024): at mini, 8 minutes
    # on 2 cores, 0.21 nats below BERT's rate and 0.7 points better fine-tuned on WordNet topics, every seed
    # (BENCHMARKS.md: ModernBERT's rate under --recipe fast).
    fast_lr_factor: ClassVar[float] = 2.0
    fast_adam_beta2: ClassVar[float] = 0.98
    # The sweep's 6% warmup: 20% fine-tuned worse on WordNet topics (0.932 against 0.940-0.942, 3 seeds), and no
    # better where 10 minutes give 550 steps, though its loss was lower (BENCHMARKS.md: a linear probe).
    fast_warmup: ClassVar[float] = 0.06
    # Zeros: the unigram bias left the race the same at equal steps and fine-tuned worse on the reviews (0.691
    # against 0.723, 3 seeds; BENCHMARKS.md: ModernBERT keeps a zero masked-LM bias).
    fast_mlm_bias_init: ClassVar[str] = "zeros"
    # Fine-tuned at twice BERT's rate for its width, as ModernBERT's own fine-tuning takes higher rates than
    # BERT's: from a checkpoint pretrained 10 minutes, 1,000 labels, 3 seeds, 2.9 points better on the Chinese
    # reviews and 0.6-0.9 on WordNet topics (BENCHMARKS.md: ModernBERT's fine-tuning rate).
    finetune_lr_factor: ClassVar[float] = 2.0

    def __post_init__(self) -> None:
        self.check_shape()
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise UserError(f"the head width {self.hidden_size // self.num_attention_heads} must be even (rotary)")
        for act in (self.hidden_activation, self.classifier_activation):
            if act not in ACTIVATIONS:
                raise UserError(f"unsupported activation {act!r} (supported: {', '.join(ACTIVATIONS)})")
        if self.global_attn_every_n_layers < 1 or self.local_attention < 2:
            raise UserError("global_attn_every_n_layers must be at least 1 and local_attention at least 2")
        if self.classifier_pooling not in ("cls", "mean"):
            raise UserError(f"classifier_pooling must be cls or mean, not {self.classifier_pooling!r}")
        if self.layer_types is None:
            n = self.global_attn_every_n_layers
            self.layer_types = [
                "sliding_attention" if i % n else "full_attention" for i in range(self.num_hidden_layers)
            ]
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= {
            "full_attention",
            "sliding_attention",
        }:
            raise UserError("layer_types must name full_attention or sliding_attention for each of the layers")

    # The fields BERT's config calls otherwise, for code that reads either.
    @property
    def hidden_dropout_prob(self) -> float:
        return self.mlp_dropout

    @property
    def window(self) -> int:
        """How far a local layer's token sees on each side (transformers' sliding_window)."""
        return self.local_attention // 2

    def with_dropout(self, p: float) -> ModernBertConfig:
        """Every dropout probability set to ``p`` (pretrain --dropout)."""
        return dataclasses.replace(self, attention_dropout=p, embedding_dropout=p, mlp_dropout=p)

    def for_finetuning(self, dropout: float, pooling: str) -> ModernBertConfig:
        """As fine-tuning trains it: every dropout, the classifier's included, at ``dropout``; the classifier
        reading ``pooling`` ("pooler": the [CLS] token, or "mean")."""
        return dataclasses.replace(
            self.with_dropout(dropout),
            classifier_dropout=dropout,
            classifier_pooling="mean" if pooling == "mean" else "cls",
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModernBertConfig:
        """Read a Hugging Face ModernBERT config.json dict (old and new rotary keys); keys we do not model
        are ignored."""
        if d.get("model_type") != cls.model_type:
            raise UserError(f"not a {cls.title} config (model_type={d.get('model_type')!r})")
        kwargs = cls.known_fields(d, drop_none=True)
        rope = d.get("rope_parameters") or {}
        for kind, key in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
            params = rope.get(kind) or {}
            if params.get("rope_type", "default") != "default":
                raise UserError(f"rotary scaling {params['rope_type']!r} is not supported (default rotary only)")
            if "rope_theta" in params:
                kwargs[key] = params["rope_theta"]
        if d.get("rope_scaling"):
            raise UserError("rotary scaling (rope_scaling) is not supported (default rotary only)")
        return cls(**kwargs)

    def to_hf_dict(self, architecture: str = "ModernBertForMaskedLM") -> dict[str, Any]:
        d = self.hf_dict(architecture)
        # Both the rotary keys of transformers 5 and those of 4.x, and the token ids its tokenizer-less
        # code reads (bos/eos: ModernBERT's are its [CLS] and [SEP]).
        d["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": self.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": self.local_rope_theta},
        }
        d.update(
            bos_token_id=self.cls_token_id,
            eos_token_id=self.sep_token_id,
            tie_word_embeddings=True,
        )
        return {k: v for k, v in d.items() if v is not None}
