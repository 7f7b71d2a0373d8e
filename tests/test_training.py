"""The pieces of the training step that keep the host from waiting on the device."""

from __future__ import annotations

import torch

from bertgpu.config import OptimConfig
from bertgpu.training.optim import build_optimizer, skip_if
from bertgpu.training.signals import LaggedFlags


def test_lagged_flags_are_read_one_step_late_and_all_at_a_flush():
    flags = LaggedFlags(torch.device("cpu"), lag=1)  # the GPU behaviour, on the CPU
    assert flags.push(1, torch.tensor([0.0, 1.0])) == []
    assert flags.push(2, torch.tensor([1.0, 0.0])) == [(1, [0.0, 1.0])]
    assert flags.push(3, torch.tensor([0.0, 0.0])) == [(2, [1.0, 0.0])]
    assert flags.flush() == [(3, [0.0, 0.0])] and flags.flush() == []
    at_once = LaggedFlags(torch.device("cpu"))  # the CPU reads at once: nothing to overlap
    assert at_once.push(7, torch.tensor([1.0])) == [(7, [1.0])]


def test_a_non_finite_step_is_skipped_on_the_device_by_the_fused_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = build_optimizer(model, OptimConfig(lr=0.1, steps=10), torch.device("cpu"))
    assert all(group["fused"] for group in optimizer.param_groups)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    model(torch.randn(2, 4)).sum().mul(float("nan")).backward()
    bad = (~torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))).float()
    assert bad.item() == 1.0
    skip_if(optimizer, bad)
    optimizer.step()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # weights untouched
    assert all(s["step"].item() == 0 for s in optimizer.state.values())  # and Adam's step count too

    optimizer.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    skip_if(optimizer, (~torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))).float())
    optimizer.step()
    assert not torch.equal(before["weight"], model.weight.detach())  # a finite step is taken
    assert all(s["step"].item() == 1 for s in optimizer.state.values())


def _reference_lamb(
    params: list[torch.Tensor],
    grads: list[list[torch.Tensor]],
    decays: list[float],
    lr: float,
    betas=(0.9, 0.999),
    eps=1e-6,
) -> list[torch.Tensor]:
    """LAMB written out from the paper (Algorithm 2, with Adam's bias correction), in float64, one
    tensor at a time; tensors without weight decay take the plain Adam step, as NVIDIA's FusedLAMB."""
    out = []
    for p, gs, wd in zip(params, grads, decays):
        w, m, v = p.double().clone(), torch.zeros_like(p, dtype=torch.float64), torch.zeros_like(p, dtype=torch.float64)
        for t, g in enumerate(gs, start=1):
            g = g.double()
            m = betas[0] * m + (1 - betas[0]) * g
            v = betas[1] * v + (1 - betas[1]) * g * g
            r = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
            if wd:
                r = r + wd * w
                ratio = w.norm() / r.norm() if w.norm() > 0 and r.norm() > 0 else 1.0
                r = ratio * r
            w = w - lr * r
        out.append(w)
    return out


def test_lamb_equals_the_paper_written_out_and_skips_a_non_finite_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = build_optimizer(
        model, OptimConfig(optimizer="lamb", lr=0.01, steps=10, weight_decay=0.01), torch.device("cpu")
    )
    grads: list[list[torch.Tensor]] = [[] for _ in start]
    for i in range(4):
        optimizer.zero_grad()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        if i == 2:  # a non-finite step in the middle: skipped on the device, as if it never happened
            loss = loss * float("inf")
        loss.backward()
        bad = (~torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))).float()
        skip_if(optimizer, bad)
        optimizer.step()
        if i != 2:
            for k, p in enumerate(model.parameters()):
                grads[k].append(p.grad.detach().clone())
    decays = [0.01 if p.ndim >= 2 else 0.0 for p in model.parameters()]
    expected = _reference_lamb(start, grads, decays, lr=0.01)
    for got, want in zip(model.parameters(), expected):
        torch.testing.assert_close(got.detach().double(), want, rtol=0, atol=1e-6)
    assert all(s["step"].item() == 3 for s in optimizer.state.values())
    assert all(not torch.equal(a, b.detach()) for a, b in zip(start, model.parameters()))


def test_a_run_without_nsp_logs_no_nsp_figures():
    """Without NSP its head is never trained: its loss and accuracy would be noise, so they are not logged."""
    from bertgpu.tasks.pretrain import log_values

    sums = {"mlm_loss": 6.0, "mlm_correct": 1, "masked": 3, "nsp_loss": 1.4, "nsp_correct": 1, "sequences": 2}
    assert log_values(sums, nsp=False) == {"loss": 2.0, "mlm_loss": 2.0, "mlm_acc": 1 / 3}
    with_nsp = log_values(sums, nsp=True)
    assert with_nsp["loss"] == 2.7 and with_nsp["nsp_acc"] == 0.5


def test_the_stop_signal_is_the_first_that_came():
    """Two Ctrl-C's, the second during the save, were reported as "stopped by SIGTERM": the launcher's exit
    terminates its workers after the user's SIGINT."""
    import os
    import signal

    from bertgpu.training.signals import StopSignal

    stop = StopSignal()
    try:
        assert stop.signum == 0
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher's, after a second Ctrl-C
    finally:
        stop.restore()
    assert stop.signum == signal.SIGINT


def test_every_optimizer_choice_is_built_by_its_table_entry_and_skips_a_non_finite_step():
    """--optimizer's choices are the names of ``optim.OPTIMIZERS``; each optimizer's step, in the halves a loop's
    ``train_step`` calls (``unscale_and_clip``, then ``optimizer_step``), leaves the weights as they were after a
    non-finite gradient and moves them after a finite one."""
    import dataclasses

    from bertgpu.parallel.dims import ParallelDims
    from bertgpu.parallel.wrap import ParallelModel
    from bertgpu.training.optim import OPTIMIZERS, optimizer_step, unscale_and_clip

    choices = next(f for f in dataclasses.fields(OptimConfig) if f.name == "optimizer").metadata["choices"]
    assert list(OPTIMIZERS) == list(choices) == ["adamw", "lamb", "rmsprop"]
    for name in choices:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        net = ParallelModel(model, model, ParallelDims(1))
        optimizer = build_optimizer(model, OptimConfig(optimizer=name, lr=0.1, steps=10), torch.device("cpu"))
        assert type(optimizer).__name__.lower() == name
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        for poison, moved in ((float("nan"), False), (1.0, True)):
            model(torch.randn(2, 4)).sum().mul(poison).backward()
            bad = unscale_and_clip(net, optimizer, scaler, 1.0)
            assert bad.item() == float(not moved), name
            optimizer_step(optimizer, scaler, bad, "fp32")
            optimizer.zero_grad(set_to_none=True)
            assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items()) == moved, name
