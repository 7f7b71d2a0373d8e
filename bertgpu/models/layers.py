"""Building blocks every architecture uses: activations by config name, the padded vocabulary, document masks."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

# The names of models.config.ACTIVATIONS. "gelu" is the exact erf GELU of the original BERT; "gelu_new" is
# GPT-2's tanh approximation, which transformers computes by hand and PyTorch computes identically.
ACT_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """vocab_size rounded up to a multiple: GPU matmuls are fastest when every dimension is a
    multiple of 64 (tensor-core tiles), and the H×V decoder is the largest matmul of a small BERT."""
    if multiple < 1:
        raise ValueError(f"pad_vocab_multiple must be at least 1, got {multiple}")
    return -(-vocab_size // multiple) * multiple


def document_mask(documents: torch.Tensor) -> torch.Tensor:
    """The block-diagonal attention mask [B, 1, L, L] (True: attend) of rows whose ``documents`` [B, L] number
    each token's document (a --pack row's attention_mask: 1, 2, ... and 0 on padding): a token attends to the
    tokens of its own document only, padding to padding (so no row of the mask is empty: SDPA would make NaN)."""
    return documents[:, None, :, None] == documents[:, None, None, :]
