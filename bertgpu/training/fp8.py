"""--fp8: float8 matmuls in the large linear layers, through torchao's float8 training (Hopper-class GPUs).

torchao's ``convert_to_float8_training`` swaps chosen ``nn.Linear`` modules for ``Float8Linear``: the
matmuls of forward and backward run in float8 (e4m3) with dynamic per-tensor scales, the weights and
their optimizer state stay in their own precision. Only layers large enough to gain take it
(``worth_fp8``): both dimensions multiples of 16 (the float8 kernels' tiles) and at least
``MIN_FEATURES`` wide, where the casts to float8 cost less than the faster matmul saves; and, as is usual
(torchtitan, MosaicML's recipes), only in the encoder layers between the first and the last (``fp8_layers``): the
first and last layers, the heads and the tied decoder (its weight is the embedding) stay in the run's precision,
where float8's rounding costs the most loss. ``--fp8-recipe`` picks torchao's scaling: tensorwise (one scale
per tensor) or rowwise (one per row, closer to bf16). Whether it pays on a whole BERT step is not yet measured
(BENCHMARKS.md): it is opt-in.
"""

from __future__ import annotations

import torch
from torch import nn

from bertgpu.errors import UserError

MIN_FEATURES = 1024  # BERT-base's Q/K/V/O (768 x 768) stay in bf16; its FFN (768 x 3072) is below it too
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9), Hopper (9.0) and later
INSTALL = "pip install -e '.[fp8]'"


def check_fp8(device: str) -> None:
    """A one-line UserError unless --fp8 can run here: a CUDA GPU of compute capability 8.9 or more and torchao."""
    if device == "cpu" or not torch.cuda.is_available():
        raise UserError(
            "--fp8 needs a CUDA GPU of compute capability 8.9 or more (H100, H200, L40S, L4); this run has none"
        )
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < MIN_CAPABILITY:
        raise UserError(
            f"--fp8 needs a GPU of compute capability 8.9 or more (H100, H200, L40S, L4); "
            f"{torch.cuda.get_device_name()} has {major}.{minor}"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise UserError(f"--fp8 needs torchao: {INSTALL}") from None


def worth_fp8(module: nn.Module, fqn: str) -> bool:
    """Whether the linear layer ``module`` (named ``fqn``) gains from float8: both dimensions multiples of 16
    and at least ``MIN_FEATURES``, and not the decoder tied to the embedding."""
    if not isinstance(module, nn.Linear) or fqn.endswith("decoder"):
        return False
    dims = (module.in_features, module.out_features)
    return all(d % 16 == 0 and d >= MIN_FEATURES for d in dims)


def fp8_layers(model: nn.Module) -> list[str]:
    """The names of the linear layers of ``model`` that --fp8 converts: those ``worth_fp8`` in the encoder layers
    other than the first and the last (none of the embeddings, heads, pooler or decoder)."""
    layers = list(model.encoder_layers().values() if isinstance(model.encoder_layers(), nn.ModuleDict)
                  else model.encoder_layers())[1:-1]  # fmt: skip
    inner = {id(m) for layer in layers for m in layer.modules()}
    return [name for name, m in model.named_modules() if id(m) in inner and worth_fp8(m, name)]


def apply_fp8(model: nn.Module, device: torch.device, recipe: str = "tensorwise") -> list[str]:
    """Swap the layers ``fp8_layers`` chooses for torchao's Float8Linear with ``recipe``'s scaling (tensorwise or
    rowwise), in place; return their names."""
    check_fp8(device.type)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = fp8_layers(model)
    if not chosen:
        raise UserError(
            f"--fp8: no linear layer of this model's inner encoder layers (the first and last stay as they are) has "
            f"both dimensions at least {MIN_FEATURES} and multiples of 16 (float8 would only add casts): use a larger "
            "model, or leave --fp8 out"
        )
    names = set(chosen)
    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn in names)
    return chosen
