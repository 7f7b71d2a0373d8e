"""What a training loop hears: SIGINT/SIGTERM (a clean stop), and its per-step flags (stop, skipped step)
read from the device a step or two late."""

from __future__ import annotations

import signal

import torch

from bertgpu.training.metrics import Waits


class StopSignal:
    """Records SIGINT/SIGTERM so a training loop can finish its step and checkpoint before exiting."""

    def __init__(self):
        self.signum = 0
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        # The first signal is the one that stopped the run, and the stop line names it: a Ctrl-C reaches the
        # launcher too, which passes it on, and a second one during the save ends the launcher, whose exit
        # terminates the workers (SIGTERM): echoes of the user's Ctrl-C, not what stopped the run.
        if not self.signum:
            self.signum = signum

    def restore(self):
        for s, h in self._previous.items():
            signal.signal(s, h)


class LaggedFlags:
    """Per-step flags (stop requested, step skipped, ...) that the host reads two steps late on a GPU.

    Reading a value the current step computes makes the host wait for the whole step to finish on
    the GPU, which empties its queue once per step. Reading step k-2's flags after queueing step k
    keeps the host up to two steps ahead: the GPU has a whole step queued behind the one it runs,
    so a host stall (a slow batch, Python's garbage collector, a log line) shorter than a step
    leaves it no idle time. On the CPU there is no queue to keep full, and the flags are read at
    once. Every rank reads the same (all-reduced or otherwise identical) values at the same step,
    so all ranks decide alike. The time the host waits here is the device's share of ``waits``.
    """

    def __init__(self, device: torch.device, lag: int | None = None, waits: Waits | None = None):
        self.lag = (2 if device.type == "cuda" else 0) if lag is None else lag
        self.pending: list[tuple[int, torch.Tensor, torch.cuda.Event | None]] = []
        self.waits = waits or Waits()

    def push(self, step: int, flags: torch.Tensor) -> list[tuple[int, list[float]]]:
        """Queue ``step``'s flags (a 1-d tensor on the device); return the ``(step, values)`` now due."""
        if flags.device.type == "cuda":
            host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            host.copy_(flags, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.pending.append((step, host, event))
        else:
            self.pending.append((step, flags, None))
        due, self.pending = self.pending[: len(self.pending) - self.lag], self.pending[len(self.pending) - self.lag :]
        return [self._read(entry) for entry in due]

    def flush(self) -> list[tuple[int, list[float]]]:
        """Every queued step's flags (at the end of a run, or before a checkpoint)."""
        due, self.pending = self.pending, []
        return [self._read(entry) for entry in due]

    def _read(self, entry: tuple[int, torch.Tensor, torch.cuda.Event | None]) -> tuple[int, list[float]]:
        step, host, event = entry
        if event is not None:
            with self.waits.on("device"):
                event.synchronize()
        return step, host.tolist()
