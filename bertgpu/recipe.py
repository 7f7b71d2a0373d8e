"""`--recipe fast`'s learning rate and warmup: chosen for the model's size and the global batch.

BERT's default peak rate, 1e-4, is right for `base` at BERT's batch of 256 and far too low for the small
models and batches a short run uses. The fast recipe takes the rate that reached the lowest held-out loss in
``benchmarks/lr_sweep.py`` (BENCHMARKS.md: short fixed-step runs per size at a global batch of ``SWEEP_BATCH``)
for the model's size, interpolated between the sizes swept by the parameters of the encoder's layers, and
scales it to the run's global batch with ``--lr-scaling`` (sqrt unless linear is asked for). A ``--lr`` or
``--warmup`` the user gives wins (as for every value of the recipe: one that differs from the BERT default).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .config import ModelConfig, OptimConfig, PretrainConfig, fast_recipe

# The global batch of the sweep: the table's rates are for this batch.
SWEEP_BATCH = 32
# Peak learning rate at SWEEP_BATCH by (layers, hidden): the lowest held-out loss in the sweep (BENCHMARKS.md;
# within 0.01 nats of it, the larger rate: the runs the recipe serves are longer than the sweep's). tiny and mini
# ran at batch 32, 300 and 120 steps; small, medium and base at batch 8 (60, 30, 12 steps), their rates brought to
# 32 by the square-root rule. medium's and base's best were the largest rates tried.
SWEPT_LR: dict[str, tuple[tuple[int, int], float]] = {
    "tiny": ((2, 128), 1e-3),
    "mini": ((4, 256), 1e-3),
    "small": ((4, 512), 1e-3),
    "medium": ((8, 512), 1e-3),
    "base": ((12, 768), 5e-4),
}
# The warmup, as a share of the run's steps (or of its --time-budget).
WARMUP = 0.06


def _layer_params(layers: int, hidden: int) -> float:
    """The weights of the encoder's layers (4 h^2 of attention, 8 h^2 of feed-forward each): what sets the size."""
    return 12 * layers * hidden**2


def swept_lr(model: ModelConfig) -> tuple[float, str]:
    """The sweep's peak learning rate at SWEEP_BATCH for ``model``, and where it comes from."""
    layers, hidden = model.num_hidden_layers, model.hidden_size
    points = sorted((_layer_params(*shape), lr, name) for name, (shape, lr) in SWEPT_LR.items())
    size = _layer_params(layers, hidden)
    for n, lr, name in points:
        if math.isclose(n, size, rel_tol=0.02) and (layers, hidden) == SWEPT_LR[name][0]:
            return lr, f"{name}'s"
    if size <= points[0][0]:
        return points[0][1], f"{points[0][2]}'s (the smallest size swept)"
    if size >= points[-1][0]:
        return points[-1][1], f"{points[-1][2]}'s (the largest size swept)"
    (n0, lr0, a), (n1, lr1, b) = next((p, q) for p, q in zip(points, points[1:]) if p[0] <= size <= q[0])
    t = (math.log(size) - math.log(n0)) / (math.log(n1) - math.log(n0))
    lr = math.exp(math.log(lr0) + t * (math.log(lr1) - math.log(lr0)))
    return float(f"{lr:.2g}"), f"between {a}'s and {b}'s by size"


def _default(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(OptimConfig) if f.name == name)


def choose(cfg: PretrainConfig, model: ModelConfig) -> tuple[OptimConfig, str]:
    """The optimizer settings of a pretraining run (its --lr before --lr-scaling), and, where --recipe fast chose
    the learning rate or warmup, why (for the start line; empty otherwise)."""
    optim = cfg.optim
    if not fast_recipe(cfg):
        return optim, ""
    chose = []
    if not cfg.gave("lr", optim.lr, _default("lr")):
        lr, where = swept_lr(model)
        scaling = optim.lr_scaling if optim.lr_scaling != "none" else "sqrt"
        optim = dataclasses.replace(optim, lr=lr, lr_scaling=scaling, reference_batch=SWEEP_BATCH)
        chose.append(f"lr {lr:g}, {where} best at batch {SWEEP_BATCH} in the lr sweep of BENCHMARKS.md")
    if not cfg.gave("warmup", optim.warmup, _default("warmup")):
        optim = dataclasses.replace(optim, warmup=WARMUP)
        chose.append("the warmup")
    if not chose:
        return optim, ""
    return optim, f"(--recipe fast chose {' and '.join(chose)}; --lr, --warmup override)"
