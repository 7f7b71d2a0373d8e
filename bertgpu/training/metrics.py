"""What a training loop measures on the way: running sums on the device, the host's waits, throughput
and MFU, peak memory."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch


class Sums:
    """Running sums of named quantities (losses, counts) on the device: added to without a host sync,
    summed over the data-parallel ranks and read by name once per log line.

    ``of(name=value, ...)`` makes one step's values into a tensor in field order, so that a step's
    contribution can be dropped on the device (a skipped step) before it is added.
    """

    def __init__(self, device: torch.device, *names: str):
        self.names = names
        self.device = device
        self.total = torch.zeros(len(names), dtype=torch.float64, device=device)

    def of(self, **values) -> torch.Tensor:
        # Numbers become tensors through torch.full: torch.tensor(x, device="cuda") synchronises the stream.
        return torch.stack(
            [
                value.double()
                if torch.is_tensor(value)
                else torch.full((), value, dtype=torch.float64, device=self.device)
                for value in (values[name] for name in self.names)
            ]
        )

    def add(self, values: torch.Tensor) -> None:
        self.total += values

    def read(self, dims) -> dict[str, float]:
        """The sums over every data-parallel rank (``dims``: a ParallelDims), then zero them."""
        total = dims.dp_sum(self.total.clone()).tolist()
        self.total.zero_()
        return dict(zip(self.names, total))

    def gathered(self, dims) -> torch.Tensor:
        """The sums over every data-parallel rank, on the CPU, left as they are (for a checkpoint)."""
        return dims.dp_sum(self.total.clone()).cpu()

    def restore(self, saved: torch.Tensor, dims) -> None:
        """Back from ``gathered`` on resume: on data-parallel rank 0 only, since they are summed again."""
        self.total.zero_()
        if dims.dp_rank == 0:
            self.total += saved.to(self.device)


def peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory so far, in MiB: what the CUDA caching allocator handed out on a GPU,
    the resident set size (weights, gradients, optimizer state, activations, Python) on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class Waits:
    """Seconds the training loop's host waited since the last log line: on ``data`` (the next batch from
    the loader) and on the ``device`` (a read of what the GPU computes: the lagged flags, the log's sums).
    As shares of the window's time they say where a step's time goes: a large data share is a starved
    device (more --loader-workers), a large device share a busy one, and neither a host-bound loop."""

    def __init__(self):
        self.data = self.device = 0.0
        self.timed: set[str] = {"device"}  # a loop that times its data says so by timing it

    @contextlib.contextmanager
    def on(self, what: str):
        self.timed.add(what)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, what, getattr(self, what) + time.perf_counter() - t0)

    def shares(self, seconds: float) -> dict[str, float]:
        """``data_wait`` (where the loop times its data) and ``device_wait``: the waits as shares of
        ``seconds``; then start afresh."""
        out = {
            f"{what}_wait": min(1.0, getattr(self, what) / seconds) for what in ("data", "device") if what in self.timed
        }
        self.data = self.device = 0.0
        return out


def describe_waits(values: dict[str, Any], device: str) -> str:
    """`` | waits data 3% device 81%`` for a log line, with a hint when the data loader starves the device."""
    if "data_wait" not in values:
        return ""
    data, busy = values["data_wait"], values["device_wait"]
    line = f" | waits data {data:.0%} device {busy:.0%}"
    if data >= 0.1:
        idle = "GPU idle" if device == "cuda" else "idle"
        line += f" ({idle} up to {data:.0%} waiting on data: raise --loader-workers)"
    return line


class Throughput:
    """Steps, sequences and tokens per second over the last logging window, and MFU.

    MFU = the model FLOPs of the window's real work / (seconds × peak FLOP/s × number of GPUs), the FLOPs
    from ``flops(sequences, tokens, masked)`` (``architectures.training_flops``: matmuls only, forward +
    backward) over the real (non-padding) tokens and the masked slots that were scored, so padding is no
    work; None (fine-tuning): no MFU.
    """

    def __init__(
        self, flops: Callable[[float, float, float], float] | None, peak: float | None, world_size: int
    ) -> None:
        self.flops, self.peak, self.world = flops, peak, world_size
        self.waits = Waits()  # the loop's waits on data and device, as shares of the window (``rates``)
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.carried = (0, 0, 0, 0)

    def carry(self, steps: int, sequences: int, tokens: int, masked: int = 0) -> None:
        """On resume: the log window restored from the checkpoint already holds these, trained before
        this process's clock started; the next rates leave them out (the window's losses keep them)."""
        self.carried = (steps, sequences, tokens, masked)

    def pause(self) -> None:
        """Stop the clock (an evaluation between training steps); ``resume`` starts it again."""
        self.paused_at = time.perf_counter()

    def resume(self) -> None:
        self.t0 += time.perf_counter() - self.paused_at

    def rates(self, steps: int, sequences: int, tokens: int, masked: int = 0) -> dict[str, float]:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        steps, sequences, tokens, masked = (
            max(0, now - before) for now, before in zip((steps, sequences, tokens, masked), self.carried)
        )
        out = {"steps_per_s": steps / dt, "seq_per_s": sequences / dt, "tokens_per_s": tokens / dt}
        if self.peak and self.flops is not None and sequences:
            out["mfu"] = self.flops(sequences, tokens, masked) / dt / (self.peak * self.world)
        out.update(self.waits.shares(dt))
        self.reset()
        return out
