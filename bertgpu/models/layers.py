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


def check_span_outputs(num_labels: int) -> None:
    """A span head (question answering) scores each token twice, start then end, and transformers sizes it by the
    config's num_labels: a config of other labels would make a head that splits into no start and end."""
    if num_labels != 2:
        raise ValueError(f"a question-answering head has 2 outputs per token (start, end), not num_labels {num_labels}")


def layer_norm(norm: torch.nn.LayerNorm, x: torch.Tensor, low_precision: bool) -> torch.Tensor:
    """``norm(x)``; with ``low_precision`` (--bf16-stream) under a bf16 autocast, in bf16: the input and output in
    bf16 (the residual stream that the output goes on to), the statistics still accumulated in fp32 by the kernel,
    the fp32 weights cast (their gradients reach them in fp32). Autocast itself runs LayerNorm in fp32 and returns
    fp32, which makes every residual add, LayerNorm and saved activation twice the bytes and adds a cast before
    each following matmul."""
    device = x.device.type
    if not (low_precision and torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16):
        return norm(x)
    with torch.autocast(device, enabled=False):
        dtype = torch.bfloat16
        weight = None if norm.weight is None else norm.weight.to(dtype)
        bias = None if norm.bias is None else norm.bias.to(dtype)
        return F.layer_norm(x.to(dtype), norm.normalized_shape, weight, bias, norm.eps)


def use_bf16_stream(model: torch.nn.Module, on: bool = True) -> int:
    """--bf16-stream: the encoder layers' residual LayerNorms of ``model`` in bf16 under a bf16 autocast
    (``layer_norm``); the modules that take it declare a ``bf16_stream`` attribute. Return how many were set."""
    modules = [m for m in model.modules() if hasattr(m, "bf16_stream")]
    for module in modules:
        module.bf16_stream = on
    return len(modules)
