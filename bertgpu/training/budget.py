"""`pretrain --time-budget`: a run sized to a wall-clock budget instead of a number of steps.

The run measures its own step time and plans how many steps fit before the budget ends; the learning rate
is a function of progress, the training wall-clock so far divided by the budget (warmup, then linear decay to
zero at the end), so a slower phase, a resume or another layout re-sizes the rest of the run by itself. The
last step is decided one step ahead: the one after which no further step, plus the final evaluation, fits.
Its learning rate is zero, the run evaluates and saves after it, and so it ends within a step and a save of
the budget.

Every rank decides alike: the clock is rank 0's, shared by one small all-reduce per step (read late on a
GPU, as the loop's other flags: ``signals.LaggedFlags``), and everything else (step time, plan, learning
rate) is computed from the shared values. The clock counts the training loop's wall-clock, evaluations and
checkpoints included, from its first step; a checkpoint records it, so a resumed or restarted run (elastic,
another layout) continues the budget where it stood, not afresh.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bertgpu.errors import UserError

if TYPE_CHECKING:  # torch only where a run needs it
    import torch

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str, bare_seconds: bool = False) -> float:
    """Seconds in ``90s``, ``30m``, ``2h`` or ``1h30m``, as a UserError if none. A bare number is refused: `5`
    meant 5 seconds, a run of 2 steps where 5 minutes was likely meant; ``bare_seconds`` reads it as seconds
    (a checkpoint's record of a budget given so before the unit was required)."""
    bare = text.strip()
    if not bare_seconds and re.fullmatch(r"\d+(?:\.\d+)?", bare):
        raise UserError(f"--time-budget {bare}: give a unit, {bare}s, {bare}m or {bare}h")
    m = _DURATION.fullmatch(text.strip().lower())
    if not text.strip() or m is None or not any(m.groups()):
        raise UserError(f"--time-budget {text!r}: not a duration (write e.g. 90s, 30m, 2h or 1h30m)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise UserError(f"--time-budget {text!r} must be longer than zero")
    return total


# How many of the latest step times the estimate is the median of: enough to ignore a step that also
# evaluated or saved, few enough to follow a change of speed within seconds.
WINDOW = 9
# Step times measured in this process before the run may decide its last step (the first steps are slow).
MIN_MEASURED = 3


class TimeBudget:
    """The plan of a run with a time budget: how many steps, and the learning rate of each.

    ``warmup``: a fraction of the budget (< 1) or a number of steps (>= 1). ``eval_cost``: the final
    evaluation's cost in step times, until an evaluation of this run was timed. The loop calls ``begin`` when
    its first step is about to start, ``plan`` before each step (a collective), and keeps its evaluation in
    ``timed``; ``schedule`` is the learning-rate schedule (``factor`` of the step count).
    """

    def __init__(
        self,
        seconds: float,
        warmup: float,
        device: torch.device,
        is_main: bool,
        eval_cost: float = 0.0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        from bertgpu.training.signals import LaggedFlags

        self.budget, self.warmup, self.device, self.is_main = seconds, warmup, device, is_main
        self.clock = clock
        self.eval_cost = eval_cost
        self.flags = LaggedFlags(device)
        self.elapsed_before = 0.0  # the training wall-clock of the run before this process (from a checkpoint)
        self.step_s: float | None = None  # the step time, in seconds (saved: a resumed run starts from it)
        self.eval_s: float | None = None  # the last evaluation's duration, once timed
        self._eval_here = 0.0  # this process's last evaluation's duration (rank 0's is shared)
        self.points: list[tuple[int, float]] = []  # (steps done, elapsed) as every rank agreed
        self.durations: list[float] = []  # this process's measured step times, newest last
        self.last: int | None = None  # the last step, once decided
        self.total = 0  # the planned number of steps
        self.step = 0  # the steps done when it was planned

    # -- the clock ------------------------------------------------------------------------------------

    def begin(self, step: int) -> None:
        self.t0 = self.clock()
        self.points = [(step, self.elapsed_before)]

    def _here(self) -> float:
        return self.elapsed_before + self.clock() - self.t0

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (the evaluation), its duration kept for the plan (rank 0's counts, shared with the clock)."""

        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self._eval_here = self.clock() - t0

        return run

    # -- the plan -------------------------------------------------------------------------------------

    def plan(self, step: int) -> int:
        """Before the step after ``step`` steps: share rank 0's clock (every rank calls this together), re-plan,
        and return the planned number of steps (``step + 1`` when the coming step is the last)."""
        import torch
        import torch.distributed as dist

        mine = [self._here(), self._eval_here] if self.is_main else [0.0, 0.0]
        # torch.full, not torch.tensor: a tensor made from host data on a GPU waits for the stream
        shared = torch.stack([torch.full((), v, dtype=torch.float64, device=self.device) for v in mine])
        if dist.is_initialized():  # rank 0's clock to every rank (the others add zeros)
            dist.all_reduce(shared, op=dist.ReduceOp.SUM)
        for at, (elapsed, eval_s) in self.flags.push(step, shared):
            self._observe(at, elapsed, eval_s)
        self.step = step
        if self.last is not None:
            return self.last
        end, now = self.end, self.elapsed_at(step)
        s = self.step_s
        if s is None:  # nothing measured yet: one step at a time
            if now >= end:
                self.last = step + 1
            self.total = self.last or max(self.total, step + 2)
            return self.total
        fit = math.floor((end - now) / s)
        measured = len(self.durations) >= MIN_MEASURED
        if fit <= 1 and (measured or now + s >= end):
            self.last = step + 1  # the coming step ends the run: no further one fits
        self.total = self.last or step + max(2, fit)
        return self.total

    def plan_guess(self, step: int) -> int:
        """The planned number of steps before any is taken in this process (from a checkpoint's step time)."""
        if self.step_s is None:
            return step + 1
        return step + max(1, math.floor((self.end - self.elapsed_at(step)) / self.step_s))

    def _observe(self, step: int, elapsed: float, eval_s: float) -> None:
        prev_step, prev = self.points[-1]
        self.points.append((step, elapsed))
        if eval_s > 0:
            self.eval_s = eval_s
        if step > prev_step and len(self.points) > 3:  # the first step holds the loader's start: not timed
            self.durations = [*self.durations, (elapsed - prev) / (step - prev_step)][-WINDOW:]
            self.step_s = statistics.median(self.durations)

    @property
    def end(self) -> float:
        """When the last step should end: the budget less the final evaluation (its timed cost, or an estimate)."""
        evaluation = self.eval_s if self.eval_s is not None else self.eval_cost * (self.step_s or 0.0)
        return self.budget - evaluation

    def elapsed_at(self, step: int) -> float:
        """The training wall-clock after ``step`` steps: the latest agreed point, plus step times to ``step``
        (on a GPU, whose clock is read steps late)."""
        at, elapsed = self.points[-1] if self.points else (step, self.elapsed_before)
        return elapsed + (step - at) * (self.step_s or 0.0)

    def elapsed(self) -> float:
        """The training wall-clock at the end of the step under way (for the log)."""
        return self.elapsed_at(self.step + 1)

    # -- the learning rate ----------------------------------------------------------------------------

    def factor(self, step: int) -> float:
        """The learning rate of the step after ``step`` steps, as a share of the peak: warmup, then linear
        decay to zero at the end of the budget; zero once the last step is done."""
        if self.last is not None and step >= self.last:
            return 0.0
        progress = min(1.0, self.elapsed_at(step + 1) / max(self.end, 1e-9))
        decay = 1.0 - progress
        if self.warmup >= 1:
            return max(0.0, min((step + 1) / self.warmup, decay))
        if progress < self.warmup:
            return max(progress / self.warmup, 1e-3)
        return max(0.0, decay / (1.0 - self.warmup))

    def in_warmup(self, step: int) -> bool:
        """Whether the step after ``step`` steps is one of the warmup's (``factor`` still rising)."""
        if self.last is not None and step >= self.last:
            return False
        if self.warmup >= 1:
            return step < self.warmup
        return self.elapsed_at(step + 1) / max(self.end, 1e-9) < self.warmup

    def schedule(self, optimizer: torch.optim.Optimizer, lr: float, step: int) -> torch.optim.lr_scheduler.LambdaLR:
        """The learning-rate schedule of the run (in place of ``optim.build_schedule``'s)."""
        import torch

        from bertgpu.training.optim import set_initial_lr

        set_initial_lr(optimizer, lr)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, self.factor, last_epoch=step - 1)

    # -- checkpoints ----------------------------------------------------------------------------------

    def state_dict(self, step: int) -> dict[str, Any]:
        """What a checkpoint after ``step`` steps keeps: the same on every rank."""
        return {
            "seconds": self.budget,
            "elapsed": self.elapsed_at(step),
            "step_s": self.step_s,
            "eval_s": self.eval_s,
            "done": self.last is not None and step >= self.last,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        self.elapsed_before = float(state["elapsed"])
        self.step_s, self.eval_s = state.get("step_s"), state.get("eval_s")

    def describe(self) -> str:
        """For the start line."""
        from bertgpu.training.runlog import format_duration

        if self.elapsed_before:
            left = format_duration(self.budget - self.elapsed_before)
            return f"time budget {format_duration(self.budget)} ({left} left)"
        return f"time budget {format_duration(self.budget)}"
