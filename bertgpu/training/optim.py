"""The optimizer of every training loop: AdamW, LAMB or RMSprop with BERT's grouping (``OPTIMIZERS``, by
--optimizer), the two halves of its step that a loop's ``train_step`` calls (``unscale_and_clip``, then
``optimizer_step``, skipped on the device), the learning-rate schedule and how --lr-scaling made the peak."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bertgpu.config import OptimConfig


def build_optimizer(
    model: torch.nn.Module,
    cfg: OptimConfig,
    device: torch.device,
    lr_factor: Callable[[str], float] | None = None,
) -> torch.optim.Optimizer:
    """AdamW, LAMB or RMSprop with BERT's grouping: no weight decay on biases and LayerNorm weights.

    AdamW is fused (one kernel for all parameters) on CUDA and CPU alike: on CPU it is ~8x faster
    than the per-tensor loop, and it can skip a step on the device (``skip_if``), with no host sync.
    A fused kernel takes tensors of one kind, so parameters are grouped by kind too: plain tensors
    apart from DTensors, and DTensors by mesh (a model spread with tensor parallelism holds both).
    ``lr_factor`` (a parameter's name -> a multiple of the rate; 1 for all by default) groups by rate too: a
    continuation's fresh heads learn at a from-scratch rate beside the encoder's gentle one. Each group keeps its
    multiple as ``lr_factor``, which the schedules read.
    """
    groups: dict[tuple, list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decay = p.ndim >= 2  # biases and norms' weights are vectors, whatever the architecture names them
        factor = lr_factor(name) if lr_factor is not None else 1.0
        groups.setdefault((decay, factor, type(p).__name__, id(getattr(p, "device_mesh", None))), []).append(p)
    param_groups = [
        {"params": params, "weight_decay": cfg.weight_decay if decay else 0.0, "lr": cfg.lr * factor}
        | ({"lr_factor": factor} if factor != 1.0 else {})
        for (decay, factor, *_), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1]))
    ]
    return OPTIMIZERS[cfg.optimizer](param_groups, cfg, device)


def set_initial_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Each group's peak rate for a schedule: ``lr`` times the group's ``lr_factor`` (``build_optimizer``)."""
    for group in optimizer.param_groups:
        group["initial_lr"] = lr * group.get("lr_factor", 1.0)


def adamw(groups: list[dict[str, Any]], cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.adam_eps, fused=device.type in ("cuda", "cpu"))


def lamb(groups: list[dict[str, Any]], cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    return Lamb(groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)


def rmsprop(groups: list[dict[str, Any]], cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    return torch.optim.RMSprop(groups, lr=cfg.lr, alpha=cfg.rmsprop_alpha, eps=cfg.adam_eps, foreach=True)


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
    def init_state(self) -> None:
        """Each parameter with a gradient gets its moments and step count where it has none yet, and a loaded step
        count moves to its parameter's device. ``step`` does this first; --compile-step calls it before the compiled
        update (``fused_step``), so that the update is traced once with the state it keeps, not again at the second
        step because the first one created it."""
        for group in self.param_groups:
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

    @torch.no_grad()
    def step(self, closure=None):
        bad = getattr(self, "found_inf", None)
        self.init_state()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
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
                if torch.is_tensor(lr):  # a rate held on the device (--compile-step: ``fused_step``)
                    p.sub_(update * keep * lr)
                else:
                    p.add_(update * keep, alpha=-lr)
        return None


# --optimizer: name -> builder of the optimizer over BERT's parameter groups (``build_optimizer``).
OPTIMIZERS: dict[str, Callable[[list[dict[str, Any]], OptimConfig, torch.device], torch.optim.Optimizer]] = {
    "adamw": adamw,
    "lamb": lamb,
    "rmsprop": rmsprop,
}


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

    set_initial_lr(optimizer, cfg.lr)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch=step - 1)


def unscale_and_clip(net, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, clip: float) -> torch.Tensor:
    """Unscale the gradients (fp16's scaler) and clip their global norm to ``clip`` (0: no clipping). Return the
    0-dim flag of a non-finite norm, still on the device: the step ``optimizer_step`` skips (reading it is the
    caller's choice, ``LaggedFlags``, not a sync here).

    ``net`` is the ``ParallelModel`` (its ``clip_grad_norm_`` sees through gradient shards); the norm is the same
    on every process, since the gradients are reduced first."""
    if not torch.compiler.is_compiling() and scaler.is_enabled():  # compiled (--compile-step): never fp16's scaler
        scaler.unscale_(optimizer)
    grad_norm = net.clip_grad_norm_(clip if clip > 0 else float("inf"))
    return (~torch.isfinite(grad_norm)).float()


def optimizer_step(
    optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, bad: torch.Tensor, precision: str
) -> None:
    """The optimizer step, skipped where ``bad`` (``unscale_and_clip``'s flag) is 1, decided on the device; with
    fp16 the scaler skips it itself, and moves its scale on."""
    if precision == "fp16":
        scaler.step(optimizer)
    elif skips_on_device(optimizer):
        skip_if(optimizer, bad)
        optimizer.step()  # what the scaler's step is when disabled (fp16 alone enables it)
    elif not bad.item():  # torch's RMSprop has no kernel that reads found_inf: the host looks (a sync)
        optimizer.step()
    if not torch.compiler.is_compiling() and scaler.is_enabled():  # fp16's: its scale moves on
        scaler.update()


def describe_lr(lr: float, peak: float, scaling: str, global_batch: int, reference_batch: int) -> str:
    """The peak learning rate for the start line, with how --lr-scaling made it."""
    if scaling == "none":
        return f"peak lr {peak:.3g}"
    ratio = f"{global_batch}/{reference_batch}" if scaling == "linear" else f"sqrt({global_batch}/{reference_batch})"
    return f"peak lr {peak:.3g} = {lr:.3g} x {ratio} (--lr-scaling {scaling})"
