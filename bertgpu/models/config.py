"""What every architecture's configuration shares: the size family, the activations, a classifier's labels.

Each architecture's configuration (``bert/config.py``, ``modernbert/config.py``) is a dataclass with the field
names of transformers' config of that architecture, so that a ``config.json`` moves both ways unchanged, and
derives from ``EncoderConfig``. Which class reads a config.json is the registry's to say
(``architectures.load_config``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from bertgpu.errors import UserError

# (layers, hidden, heads); intermediate = 4 * hidden. The BERT size family (Turc et al. 2019, Devlin et al. 2019),
# which every architecture offers under these names.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# config.json's problem_type, by which transformers' sequence heads choose their loss: None (cross-entropy, or mean
# squared error with one output), or each named.
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")


class EncoderConfig:
    """The base of each architecture's configuration: what the rest of bertgpu reads of either."""

    model_type: ClassVar[str]  # config.json's
    title: ClassVar[str]  # the architecture's name as a model card writes it
    nsp: ClassVar[bool]  # a next-sentence head beside the masked-LM head
    # --recipe fast's choices for the architecture (training/recipe.py): the peak rate's factor over the sweep's,
    # Adam's beta2, the warmup's share of the run and the masked-LM bias's start; fine-tuning's rate factor.
    fast_adam_beta2: ClassVar[float]
    fast_warmup: ClassVar[float]
    fast_mlm_bias_init: ClassVar[str]
    finetune_lr_factor: ClassVar[float]
    # Fine-tuning: label names by id (a sequence head's labels, a token head's tags), as transformers stores them
    # (each subclass declares the field, in its own place among transformers' fields).
    id2label: dict[int, str] | None
    # A sequence head's problem_type (PROBLEM_TYPES), as transformers stores it: regression (num_labels 1 for one
    # value), or multi-label (sigmoid outputs and binary cross-entropy).
    problem_type: str | None
    hidden_size: int
    num_attention_heads: int

    @property
    def fast_lr_factor(self) -> float:
        raise NotImplementedError

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    def check_shape(self) -> None:
        """The checks both architectures make, and id2label's keys as integers (JSON's are strings)."""
        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
        if self.problem_type not in PROBLEM_TYPES:
            raise UserError(
                f"problem_type must be one of {', '.join(map(str, PROBLEM_TYPES[1:]))} or none, "
                f"not {self.problem_type!r}"
            )
        if self.problem_type == "single_label_classification" and self.num_labels == 1:
            raise UserError("problem_type single_label_classification needs two labels or more (one: regression)")

    def hf_dict(self, architecture: str) -> dict[str, Any]:
        """The fields as config.json holds them, with the labels both ways and the model_type and class."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}  # type: ignore[call-overload]
        if self.id2label:
            d["id2label"] = {str(i): name for i, name in self.id2label.items()}
            d["label2id"] = {name: i for i, name in self.id2label.items()}
        d.update(model_type=self.model_type, architectures=[architecture])
        return d

    @classmethod
    def known_fields(cls, d: dict[str, Any], drop_none: bool = False) -> dict[str, Any]:
        """The keys of a config.json dict that this class models (transformers writes many more)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return {k: v for k, v in d.items() if k in names and not (drop_none and v is None)}

    # The architecture's own shapes beside the size family, (layers, hidden, heads, intermediate) by name, and the
    # intermediate width of a size-family preset as a multiple of hidden.
    own_shapes: ClassVar[dict[str, tuple[int, int, int, int]]] = {}
    intermediate_ratio: ClassVar[float]

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> Any:
        """Preset ``name``: one of the size family (intermediate ``intermediate_ratio`` x hidden), or one of the
        architecture's ``own_shapes``; ``overrides`` set other fields."""
        if name in cls.own_shapes:
            layers, hidden, heads, inter = cls.own_shapes[name]
        elif name in PRESETS:
            layers, hidden, heads = PRESETS[name]
            inter = int(cls.intermediate_ratio * hidden)
        else:
            raise UserError(f"unknown model preset {name!r} (choose from {', '.join([*PRESETS, *cls.own_shapes])})")
        return cls(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=inter,
            **overrides,
        )

    def with_dropout(self, p: float) -> Any:
        """Every dropout probability set to ``p`` (pretrain --dropout)."""
        raise NotImplementedError

    def for_finetuning(self, dropout: float, pooling: str) -> Any:
        """As fine-tuning trains it: every dropout, the classifier's included, at ``dropout``; the classifier
        reading ``pooling`` ("pooler": BERT's pooler or ModernBERT's [CLS], or "mean")."""
        raise NotImplementedError
