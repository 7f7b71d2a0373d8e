"""Pieces every training loop uses: optimizer, schedule, precision, throughput and logging."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import atomic
from .config import OptimConfig
from .errors import UserError


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, LAMB or RMSprop with BERT's grouping: no weight decay on biases and LayerNorm weights.

    AdamW is fused (one kernel for all parameters) on CUDA and CPU alike: on CPU it is ~8x faster
    than the per-tensor loop, and it can skip a step on the device (``skip_if``), with no host sync.
    A fused kernel takes tensors of one kind, so parameters are grouped by kind too: plain tensors
    apart from DTensors, and DTensors by mesh (a model spread with tensor parallelism holds both).
    """
    groups: dict[tuple, list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decay = not (p.ndim < 2 or "LayerNorm" in name)
        groups.setdefault((decay, type(p).__name__, id(getattr(p, "device_mesh", None))), []).append(p)
    param_groups = [
        {"params": params, "weight_decay": cfg.weight_decay if decay else 0.0}
        for (decay, *_), params in sorted(groups.items(), key=lambda kv: not kv[0][0])
    ]
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    if cfg.optimizer == "lamb":
        return Lamb(param_groups, lr=cfg.lr, betas=betas, eps=cfg.adam_eps)
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(param_groups, lr=cfg.lr, alpha=cfg.rmsprop_alpha, eps=cfg.adam_eps, foreach=True)
    return torch.optim.AdamW(
        param_groups, lr=cfg.lr, betas=betas, eps=cfg.adam_eps, fused=device.type in ("cuda", "cpu")
    )


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning"), as NVIDIA's FusedLAMB
    applies it to BERT: Adam's bias-corrected update plus decoupled weight decay, scaled per tensor
    by the trust ratio ||w|| / ||update|| (1 where either norm is 0). As in FusedLAMB, tensors without
    weight decay (biases, LayerNorm) take the plain Adam step. Gradient clipping is the caller's
    (global norm, before the step).

    Honours ``skip_if``: where the 0-dim ``found_inf`` is 1 the step changes nothing (weights, moments,
    step count), decided on the device. A loop over tensors, not one fused kernel: AdamW is the
    faster choice unless large batches need LAMB.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        bad = getattr(self, "found_inf", None)
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                if state["step"].device != p.device:  # a loaded state keeps the step where it was saved
                    state["step"] = state["step"].to(p.device)
                step, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                grad = p.grad
                if bad is None:
                    keep = 1.0
                    step += 1
                    m.lerp_(grad, 1 - beta1)
                    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                else:  # moments move by nothing where the step is skipped: beta -> 1
                    keep = 1 - bad.to(p.device, torch.float32)
                    grad = torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
                    step += keep
                    m.lerp_(grad, (1 - beta1) * keep)
                    v.mul_(1 - (1 - beta2) * keep).add_(grad * grad * ((1 - beta2) * keep))
                t = step.clamp(min=1)
                update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)
                if wd != 0:
                    update.add_(p, alpha=wd)
                    w_norm, u_norm = p.norm(), update.norm()
                    trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                    update.mul_(trust)
                p.add_(update * keep, alpha=-lr)
        return None


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` honours ``skip_if``: fused AdamW and our LAMB do."""
    return isinstance(optimizer, Lamb) or bool(optimizer.defaults.get("fused"))


def skip_if(optimizer: torch.optim.Optimizer, bad: torch.Tensor | None) -> None:
    """Make the next ``optimizer.step()`` a no-op where the 0-dim tensor ``bad`` is 1 (a non-finite
    gradient), decided on the device: the fused kernels read it as GradScaler's ``found_inf``, so
    the host never waits to look at it. ``None`` clears it (GradScaler then sets its own)."""
    optimizer.grad_scale = None
    optimizer.found_inf = bad


def build_schedule(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, step: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the peak, then linear decay to zero at the last step; at ``step`` already
    (a resumed run: the learning rate is a function of the step alone, so it needs no saved state)."""
    warmup, total = cfg.warmup_steps, cfg.steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    for group in optimizer.param_groups:
        group["initial_lr"] = cfg.lr
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch=step - 1)


def optimizer_step(
    net,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    clip: float,
    precision: str,
) -> torch.Tensor:
    """Unscale, clip the global gradient norm (``clip`` 0: no clipping), step, and move the schedule on.

    ``net`` is the ``ParallelModel`` (its ``clip_grad_norm_`` sees through gradient shards). A
    non-finite gradient norm (the same on every process: gradients are reduced first) skips the step
    on the device; with fp16 the scaler does the same itself. Return the 0-dim flag of a skipped step,
    still on the device: reading it is the caller's choice (``LaggedFlags``), not a sync here.
    """
    scaler.unscale_(optimizer)
    grad_norm = net.clip_grad_norm_(clip if clip > 0 else float("inf"))
    bad = (~torch.isfinite(grad_norm)).float()
    if precision == "fp16":
        scaler.step(optimizer)
    elif skips_on_device(optimizer):
        skip_if(optimizer, bad)
        scaler.step(optimizer)
    elif not bad.item():  # torch's RMSprop has no kernel that reads found_inf: the host looks (a sync)
        optimizer.step()
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    schedule.step()
    return bad


def describe_batch(sizes: list[int], accum: int) -> str:
    """The global batch for the start line: ``4 x 2 x 1`` (per-rank batch x data-parallel ranks x
    accumulation), or ``(6 + 2) x 1`` with per-rank sizes."""
    if len(set(sizes)) == 1:
        return f"{sizes[0]} x {len(sizes)} x {accum}"
    return f"({' + '.join(map(str, sizes))}) x {accum}"


def describe_lr(lr: float, peak: float, scaling: str, global_batch: int, reference_batch: int) -> str:
    """The peak learning rate for the start line, with how --lr-scaling made it."""
    if scaling == "none":
        return f"peak lr {peak:.3g}"
    ratio = f"{global_batch}/{reference_batch}" if scaling == "linear" else f"sqrt({global_batch}/{reference_batch})"
    return f"peak lr {peak:.3g} = {lr:.3g} x {ratio} (--lr-scaling {scaling})"


def resolve_precision(precision: str, device: torch.device, cpu_bf16: bool = False) -> str:
    """``auto``: bf16 on GPUs that support it, and with ``cpu_bf16`` (--recipe fast) on CPUs that multiply
    bf16 in hardware; else fp32."""
    if precision == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return "bf16"
        if device.type == "cpu" and cpu_bf16 and cpu_has_native_bf16():
            return "bf16"
        return "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise UserError("--precision fp16 needs a CUDA GPU (use bf16 or fp32 on CPU)")
    return precision


@functools.cache  # the CPU's flags do not change; the layout check and the run both ask
def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX512-BF16 or AMX): where it has not, oneDNN
    emulates bf16 and autocast would only slow a step down."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def allow_tf32(device: torch.device) -> None:
    """On a GPU, fp32 matmuls and convolutions run on TF32 tensor cores (10-bit mantissa inputs, fp32
    accumulation): what the bf16/fp16 autocast leaves in fp32 runs several times faster."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


# Dense (not sparse) peak FLOP/s of one GPU, from NVIDIA's data sheets: (bf16/fp16 tensor cores, TF32 tensor
# cores; V100: fp16 and plain fp32, it has no TF32), keyed by a pattern of the exact model that
# torch.cuda.get_device_name prints. The first match wins, so a variant comes before its family. A card not
# listed (or a variant not told apart, e.g. an A10G, a plain "H100") has no peak: MFU is not shown rather
# than taken from a sibling card (--peak-tflops gives it).
_PEAK_FLOPS: tuple[tuple[str, str, float, float], ...] = (
    # (pattern, the card as its data sheet names it, bf16, tf32)
    (r"\bH100\b.*\bNVL\b", "H100 NVL", 835e12, 417.5e12),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 756e12, 378e12),
    (r"\bH100\b.*(\bSXM|80GB HBM3$)", "H100 SXM", 989.4e12, 494.7e12),
    (r"\bGH200\b", "GH200", 989.4e12, 494.7e12),
    (r"\bH200\b.*\bNVL\b", "H200 NVL", 835e12, 417.5e12),
    (r"\bH200$|\bH200\b.*\bSXM", "H200 SXM", 989.4e12, 494.7e12),
    (r"\bA100\b.*\b(SXM|PCIE|PCIe)", "A100 (SXM or PCIe, 40 or 80 GB)", 312e12, 156e12),
    (r"\bL40S$", "L40S", 362.05e12, 183e12),
    (r"\bL40$", "L40", 181e12, 90.5e12),
    (r"\bL4$", "L4", 121e12, 60e12),
    (r"\bA10$", "A10", 125e12, 62.5e12),
    (r"\bRTX 4090$", "GeForce RTX 4090", 165.2e12, 82.6e12),
    (r"\bRTX 3090$", "GeForce RTX 3090", 71e12, 35.6e12),
    (r"\bV100-SXM2", "V100 SXM2", 125e12, 15.7e12),
    (r"\bV100-PCIE", "V100 PCIe", 112e12, 14e12),
)


def card_peak(name: str, precision: str) -> tuple[float | None, str]:
    """The dense peak FLOP/s of the GPU ``name`` (as torch.cuda.get_device_name prints it) at ``precision``
    (bf16/fp16 on the tensor cores, fp32 as TF32), and a line saying which data-sheet figure it is; None
    and a line saying why for a card not in the table."""
    for pattern, card, half, tf32 in _PEAK_FLOPS:
        if re.search(pattern, name.strip()):
            peak = half if precision in ("bf16", "fp16") else tf32
            kind = "bf16/fp16" if precision in ("bf16", "fp16") else ("fp32" if "V100" in card else "TF32")
            return peak, f"peak {peak / 1e12:,.1f} TFLOP/s ({card}, dense {kind}, NVIDIA's data sheet)"
    return None, f"peak unknown for {name!r}: MFU not shown (give it with --peak-tflops)"


def peak_flops(device: torch.device, precision: str, given_tflops: float = 0.0) -> tuple[float | None, str]:
    """Peak FLOP/s of one GPU for MFU and where the figure comes from: ``given_tflops`` (--peak-tflops) when
    set, else the card's data sheet (``card_peak``); None on a CPU or an unlisted GPU."""
    if given_tflops > 0:
        return given_tflops * 1e12, f"peak {given_tflops:,.1f} TFLOP/s (--peak-tflops)"
    if device.type != "cuda":
        return None, "no MFU on a CPU"
    return card_peak(torch.cuda.get_device_name(device), precision)


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


class StopSignal:
    """Records SIGINT/SIGTERM so a training loop can finish its step and checkpoint before exiting."""

    def __init__(self):
        self.signum = 0
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        self.signum = signum

    def restore(self):
        for s, h in self._previous.items():
            signal.signal(s, h)


def ignore_stop_signals(_worker_id: int = 0) -> None:
    """DataLoader workers leave SIGINT/SIGTERM to the training process, which stops cleanly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


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


class RunLog:
    """Rank 0's record of a run: a line on the console, a JSON line in log.jsonl, TensorBoard scalars.

    On resume from step k, lines and events after k are dropped: those steps are trained again.
    """

    def __init__(self, run_dir: Path, enabled: bool, start_step: int = 0):
        self.enabled = enabled
        self.history: list[dict] = []
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        path = run_dir / "log.jsonl"
        if path.exists():
            kept = [
                line
                for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line)["step"] <= start_step
            ]
            atomic.write_text(path, "".join(line + "\n" for line in kept))
            self.history = [json.loads(line) for line in kept]  # a resumed run's summary covers the whole run
        self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None)
        self.jsonl = open(path, "a", encoding="utf-8")

    def log(self, step: int, values: dict[str, float], line: str, write=print) -> None:
        if not self.enabled:
            return
        self.history.append({"step": step, **values})
        write(line)
        self.jsonl.write(json.dumps({"step": step, **values}) + "\n")
        self.jsonl.flush()
        for k, v in values.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(k, v, step)

    @property
    def first_step(self) -> int | None:
        return self.history[0]["step"] if self.history else None

    def latest(self, *keys: str) -> dict[str, tuple[Any, int]]:
        """For each of ``keys``, the newest value logged and its step (the keys never logged left out)."""
        found: dict[str, tuple[Any, int]] = {}
        for record in reversed(self.history):
            for key in keys:
                if key in record and key not in found:
                    found[key] = (record[key], record["step"])
        return {key: found[key] for key in keys if key in found}

    def summary(self, keys: dict[str, str]) -> list[str]:
        """One line per key of ``keys`` (name -> "min" or "max": which is better) that the records hold:
        first -> last value, and the best with its step."""
        lines = []
        for key, better in keys.items():
            seen = [(r[key], r["step"]) for r in self.history if isinstance(r.get(key), (int, float))]
            if not seen:
                continue
            best = (min if better == "min" else max)(seen, key=lambda value_step: value_step[0])
            lines.append(f"{key} {seen[0][0]:.4f} -> {seen[-1][0]:.4f} (best {best[0]:.4f} at step {best[1]:,})")
        return lines

    def close(self) -> None:
        if self.enabled:
            self.tb.close()
            self.jsonl.close()


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``: for an ETA and a run's length."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def format_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2f}"


def console_is_tty() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
