"""Fine-tuning's epochs when --epochs is not given: BERT's 3 for a training set of 800 examples or more, enough to
see 2,400 examples below that (at most 20), a resumed run's own, and --epochs always wins."""

from __future__ import annotations

import json

import pytest

from bertgpu.config import FinetuneConfig, FinetuneRunConfig
from bertgpu.tasks.finetune import resolve_epochs


def _cfg(tmp_path, **fields) -> FinetuneConfig:
    return FinetuneConfig(model="m", train="t.csv", out=str(tmp_path / "run"), **fields)


@pytest.mark.parametrize("examples, epochs", [(100_000, 3), (900, 3), (800, 3), (799, 4), (180, 14), (90, 20), (5, 20)])
def test_the_default_follows_the_training_set_size(tmp_path, examples, epochs):
    cfg, line = resolve_epochs(_cfg(tmp_path), examples)
    assert cfg.epochs == epochs
    assert line.startswith(f"{epochs} epochs: the default for {examples:,} training examples (") and "--epochs" in line
    assert ("BERT's 3" in line) == (epochs == 3) and ("at most 20" in line) == (epochs == 20)
    assert epochs == 3 or examples * (epochs - 1) < 2400 <= examples * epochs or epochs == 20


def test_epochs_given_win(tmp_path):
    cfg, line = resolve_epochs(_cfg(tmp_path, epochs=2), 180)
    assert cfg.epochs == 2 and line == "2 epoch(s) (--epochs)"


def test_a_resumed_run_keeps_the_epochs_its_checkpoint_records(tmp_path):
    """A run started when the default was another (or on other data) resumes to its own end: its schedule's length
    does not change under it."""
    step = tmp_path / "run" / "checkpoints" / "step-0000012"
    step.mkdir(parents=True)
    (step / "bertgpu.json").write_text(json.dumps({"config": {"epochs": 3}}))
    resumed, line = resolve_epochs(_cfg(tmp_path, run=FinetuneRunConfig(resume=True)), 180)
    assert resumed.epochs == 3 and "resumed run's own" in line
    fresh, _ = resolve_epochs(_cfg(tmp_path), 180)  # not resuming: the checkpoint is not read
    assert fresh.epochs == 14
