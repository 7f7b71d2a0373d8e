"""A training run's step plan: how many steps, the learning rate at each, and which is the last.

One interface for a run of a fixed length (pretrain --steps; fine-tuning's epochs x steps per epoch:
``FixedSteps``) and for pretrain --time-budget, whose length follows the clock (``BudgetSteps``, over
``budget.TimeBudget``). The loop asks the plan (``next`` before each step, ``done`` for its stop) and writes
nothing of it; the progress bar, the log line and the checkpoint's config read ``total``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bertgpu.config import OptimConfig
from bertgpu.training.budget import TimeBudget
from bertgpu.training.optim import build_schedule


class FixedSteps:
    """A run of ``optim.steps`` steps, its learning rate warmed up then decayed to zero by the step count."""

    def __init__(self, optim: OptimConfig):
        self.optim = optim
        self.total = optim.steps  # the planned number of steps: fixed

    def next(self, step: int) -> int:
        """Before the step after ``step`` steps: the planned number of steps."""
        return self.total

    def is_last(self, step: int) -> bool:
        """Whether ``step`` steps done is the run's end."""
        return step == self.total

    def done(self, step: int) -> bool:
        return step >= self.total

    def schedule(self, optimizer: torch.optim.Optimizer, step: int) -> torch.optim.lr_scheduler.LRScheduler:
        """The learning-rate schedule, at ``step`` already (a resumed run)."""
        return build_schedule(optimizer, self.optim, step)

    def in_warmup(self, step: int) -> bool:
        """Whether the step after ``step`` steps is one of the warmup's (its learning rate below the peak)."""
        return step < self.optim.warmup_steps

    def begin(self, step: int) -> None:
        """The loop's first step is about to start (a time budget starts its clock)."""

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (the held-out evaluation), timed where the plan needs its duration."""
        return fn

    def state_dict(self, step: int) -> dict[str, Any]:
        """What a checkpoint after ``step`` steps keeps of the plan (under the keys checkpoints have had)."""
        return {}

    def describe(self) -> str:
        """The run's length for the start line."""
        return f"{self.total:,} steps"


class BudgetSteps(FixedSteps):
    """pretrain --time-budget: the steps that fit the budget, re-planned before each step from the measured step
    time (a collective: rank 0's clock is shared), and the learning rate a function of the time spent. A resumed
    run continues the budget its checkpoint recorded (``state``)."""

    def __init__(
        self,
        seconds: float,
        optim: OptimConfig,
        device: torch.device,
        is_main: bool,
        *,
        eval_cost: float,
        state: dict[str, Any] | None,
        start_step: int,
    ):
        super().__init__(optim)
        self.budget = TimeBudget(seconds, optim.warmup, device, is_main, eval_cost=eval_cost)
        self.budget.load_state_dict(state.get("budget") if state else None)
        self.total = self.budget.plan_guess(start_step)  # from the checkpoint's step time, until measured

    def next(self, step: int) -> int:
        self.total = self.budget.plan(step)  # the last step: the coming one
        return self.total

    def schedule(self, optimizer: torch.optim.Optimizer, step: int) -> torch.optim.lr_scheduler.LRScheduler:
        return self.budget.schedule(optimizer, self.optim.lr, step)

    def in_warmup(self, step: int) -> bool:
        return self.budget.in_warmup(step)

    def begin(self, step: int) -> None:
        self.budget.begin(step)

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return self.budget.timed(fn)  # the budget keeps time for the last evaluation

    def elapsed(self) -> float:
        """The training time so far (the log's ``train_seconds``)."""
        return self.budget.elapsed()

    def state_dict(self, step: int) -> dict[str, Any]:
        return {"budget": self.budget.state_dict(step)}

    def describe(self) -> str:
        return self.budget.describe()


StepPlan = FixedSteps  # the interface: BudgetSteps is one
