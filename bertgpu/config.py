"""Configuration: small typed dataclasses, the one source of truth.

``ModelConfig`` mirrors the fields of a Hugging Face ``BertConfig`` (same names, same meaning), so
that a ``config.json`` moves both ways unchanged. The task configs (``VocabConfig``,
``PrepareConfig``, ``PretrainConfig``) describe one command each; the CLI builds its flags from
them (see ``bertgpu.cli``), and ``PretrainConfig`` is saved beside every checkpoint.

Field metadata used by the CLI generator:
    help     the flag's help text (the only place an option is documented)
    flag     the flag name, when it is not ``--field-name``
    choices  the allowed values
    positional / nargs   for positional arguments
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import UserError

# (layers, hidden, heads); intermediate = 4 * hidden. The BERT size family (Turc et al. 2019, Devlin et al. 2019).
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def opt(default: Any = dataclasses.MISSING, help: str = "", **meta: Any) -> Any:
    """A dataclass field that carries its CLI help (and optional flag/choices) as metadata."""
    meta["help"] = help
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    """The architecture, with the field names of transformers' BertConfig."""

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

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise UserError(f"unsupported hidden_act {self.hidden_act!r} (supported: {', '.join(ACTIVATIONS)})")
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> "ModelConfig":
        if name not in PRESETS:
            raise UserError(f"unknown model preset {name!r} (choose from {', '.join(PRESETS)})")
        layers, hidden, heads = PRESETS[name]
        return cls(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            **overrides,
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Read a Hugging Face BERT config.json dict; keys we do not model are ignored."""
        if d.get("model_type", "bert") not in ("bert",):
            raise UserError(f"not a BERT config (model_type={d.get('model_type')!r})")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        return cls(**kwargs)

    def to_hf_dict(self, architecture: str = "BertForPreTraining") -> dict[str, Any]:
        d = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if self.id2label:
            d["id2label"] = {str(i): name for i, name in self.id2label.items()}
            d["label2id"] = {name: i for i, name in self.id2label.items()}
        d.update(model_type="bert", architectures=[architecture], position_embedding_type="absolute")
        return d

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ModelConfig":
        """Load from a config.json file or a directory holding one."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_hf_dict(json.load(f))
        except FileNotFoundError:
            raise UserError(f"model config not found: {path}") from None
        except (json.JSONDecodeError, TypeError) as e:
            raise UserError(f"{path}: not a valid BERT config.json ({e})") from None


ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
