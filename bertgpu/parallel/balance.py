"""``--balance auto``: per-rank batch sizes in proportion to each process's speed, for unequal GPUs.

Data-parallel processes wait for each other at every gradient all-reduce, so a step takes as long as
the slowest process needs for its share. With one GPU twice as fast as another, equal shares leave
the fast one idle half the time; shares in proportion to speed (``--batch-size 48,16``, or measured
by ``--balance auto``) keep both busy while the global batch, and so the training, stays the same.

``Balancer`` times this process's forward passes over the first steps of a run (the first one,
which warms up, excluded), and then all processes exchange their times and agree on new sizes. A
forward pass under DDP holds no collective, so its time is this process's own, not the slowest's.
"""

from __future__ import annotations

import contextlib
import time

import torch

from bertgpu.data.sharing import split
from bertgpu.parallel import launch

TIMED_STEPS = 4  # steps timed after the first


def proportional_sizes(seconds_per_sequence: list[float], total: int) -> list[int]:
    """Integer sizes summing to ``total``, in proportion to the speeds 1 / seconds_per_sequence, each at
    least 1."""
    if total < len(seconds_per_sequence):
        raise ValueError(f"a total of {total} cannot give each of {len(seconds_per_sequence)} processes a sequence")
    return split(total, [1.0 / max(s, 1e-12) for s in seconds_per_sequence])


def describe(old: list[int], new: list[int], ms_per_item: list[float], unit: str) -> str:
    """The line a run writes when ``--balance auto`` changes the sizes."""
    return (
        f"balance: per-rank batch sizes {','.join(map(str, old))} -> {','.join(map(str, new))} "
        f"(forward passes took {', '.join(f'{ms:.1f}' for ms in ms_per_item)} ms per {unit})"
    )


class Balancer:
    """Times this process's forward passes for ``TIMED_STEPS`` steps after the first of a run, then
    proposes per-rank batch sizes (the same on every process)."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device, self.enabled = device, enabled
        self.step = 0  # steps of this run so far
        self.sequences = 0
        self.seconds = 0.0
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def timing(self) -> bool:
        return self.enabled and 1 <= self.step <= TIMED_STEPS

    @contextlib.contextmanager
    def forward(self, sequences: int):
        """Around one forward pass of ``sequences`` sequences."""
        if not self.timing:
            yield
            return
        self.sequences += sequences
        if self.device.type == "cuda":  # events, not a host sync: read once, when the sizes are due
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - t0

    def end_step(self, sizes: list[int]) -> tuple[list[int], list[float]] | None:
        """After every optimizer step; once the timed steps are done, the new sizes (keeping their sum)
        and every process's measured milliseconds per sequence. Every process calls this."""
        if not self.enabled:
            return None
        self.step += 1
        if self.step != TIMED_STEPS + 1:
            return None
        self.enabled = False
        seconds = self.seconds
        if self.events:
            torch.cuda.synchronize(self.device)
            seconds += sum(start.elapsed_time(end) for start, end in self.events) / 1000
        per_sequence = launch.all_gather_object(seconds / max(self.sequences, 1))
        return proportional_sizes(per_sequence, sum(sizes)), [1000 * s for s in per_sequence]
