"""A training run's batch arithmetic: --batch-size as given (one number, or one per data-parallel rank), each rank's
batch and the micro-steps of one optimizer step (--grad-accum, or what makes --global-batch on the layout the run
has), and the peak learning rate that follows from the global batch (--lr-scaling; fine-tuning's default by the
model's width)."""

from __future__ import annotations

from typing import Any

from bertgpu.config import OptimConfig, RunConfig
from bertgpu.errors import UserError


def parse_batch_sizes(value: Any) -> int | tuple[int, ...]:
    """--batch-size as given: one number (the same on every data-parallel rank) or one per rank ("48,16")."""
    parts = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else [value]
    try:
        sizes = [int(str(p).strip()) for p in parts]
    except ValueError:
        raise UserError(f"--batch-size {value}: give a number, or one number per data-parallel rank (48,16)") from None
    if not sizes or min(sizes) < 1:
        raise UserError(f"--batch-size must be at least 1, got {value}")
    return sizes[0] if len(sizes) == 1 else tuple(sizes)


def per_rank_sizes(batch_size: int | tuple[int, ...], dp: int) -> list[int]:
    """Each data-parallel rank's batch size."""
    if isinstance(batch_size, int):
        return [batch_size] * dp
    if len(batch_size) != dp:
        sizes = ",".join(map(str, batch_size))
        raise UserError(
            f"--batch-size {sizes} gives {len(batch_size)} sizes for {dp} data-parallel rank(s): give one "
            "number, or one per data-parallel rank"
        )
    return list(batch_size)


def accumulation(cfg: RunConfig, dp: int) -> tuple[list[int], int]:
    """(each data-parallel rank's batch, micro-steps per optimizer step) for ``dp`` ranks: --grad-accum, or
    what makes --global-batch with this layout; a global batch the layout cannot make is a UserError that
    names the layouts that can."""
    sizes = per_rank_sizes(cfg.batch_size, dp)
    goal, micro = cfg.global_batch, sum(sizes)
    if not goal:
        return sizes, cfg.grad_accum
    if goal % micro == 0:
        return sizes, goal // micro
    near = sorted({max(micro, goal // micro * micro), (goal // micro + 1) * micro})
    hint = f"--global-batch {' or '.join(map(str, near))}"
    if isinstance(cfg.batch_size, int):
        batches = [b for b in range(1, goal + 1) if goal % (b * dp) == 0]
        if batches:
            closest = sorted(batches, key=lambda b: abs(b - cfg.batch_size))[:3]
            hint += f", or --batch-size {' or '.join(map(str, sorted(closest)))} on these {dp} data-parallel rank(s)"
        ranks = [d for d in range(1, goal + 1) if goal % (cfg.batch_size * d) == 0]
        if ranks:
            hint += f", or --batch-size {cfg.batch_size} on {' or '.join(map(str, ranks))} data-parallel rank(s)"
    raise UserError(
        f"--global-batch {goal} is not a multiple of the {micro} examples of one micro-step "
        f"({'+'.join(map(str, sizes))} on {dp} data-parallel rank(s)): use {hint}"
    )


def scaled_lr(lr: float, global_batch: int, scaling: str, reference_batch: int) -> float:
    """``lr`` x (global batch / reference batch) with linear scaling (Goyal et al. 2017), x its square
    root with sqrt scaling (Krizhevsky 2014; what LAMB's authors use for BERT), unchanged with none."""
    ratio = global_batch / reference_batch
    return lr * {"none": 1.0, "linear": ratio, "sqrt": ratio**0.5}[scaling]


def peak_lr(optim: OptimConfig, global_batch: int) -> float:
    """The peak learning rate of ``optim`` for this global batch, after --lr-scaling."""
    return scaled_lr(optim.lr, global_batch, optim.lr_scaling, optim.reference_batch)


def finetune_lr(hidden_size: int, factor: float = 1.0) -> float:
    """Fine-tuning's default peak lr for a model of this width: 2e-5 (BERT's, transformers' Trainer's) from
    hidden size 768 up; below it 2e-5 x (768 / hidden)^2, to 2 significant figures, since narrower models
    take larger steps (tiny reached 0.914 held-out accuracy on the reviews with 5e-4 and 0.799 with 2e-5;
    BENCHMARKS.md: Fine-tuning's learning rate by width); times the architecture's ``factor``
    (``finetune_lr_factor``: ModernBERT's 2)."""
    base = 2e-5 if hidden_size >= 768 else 2e-5 * (768 / hidden_size) ** 2
    return float(f"{base * factor:.2g}")
