"""The pieces of the training step that keep the host from waiting on the device."""

from __future__ import annotations

import torch

from bertgpu.config import OptimConfig
from bertgpu.training import LaggedFlags, build_optimizer, skip_if


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
