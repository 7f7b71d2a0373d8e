"""Never lose work: exact resume, atomic checkpoints, restarts, safe loading (the resume issue).

Every run here is a real multi-process gloo run through the CLI, killed for real (SIGKILL,
SIGTERM), and compared bit for bit with the same run uninterrupted.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_RUN, run_cli, write_tiny_bert
from procs import Forked, assert_bitwise_equal, kill_torchrun_worker, losses, start, wait_for_step
from safetensors.torch import load_file

from bertgpu.checkpoints import checkpoint
from bertgpu.data import samples

STEPS = 12
ARGS = [*TINY_RUN, "--loader-workers", "1", "--steps", str(STEPS), "--batch-size", "4", "--log-every", "1"]
ARGS += ["--save-every", "3", "--seed", "5", "--precision", "fp32"]  # later flags win: one loader worker


def weights(run_dir: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step-{step:07d}" / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, small_english_data) -> Path:
    out = tmp_path_factory.mktemp("runs") / "uninterrupted"
    run_cli("pretrain", "--data", small_english_data, "--out", out, "--nproc", "2", *ARGS)
    return out


def test_sigkill_at_a_random_step_then_resume_is_bitwise_identical(tmp_path, small_english_data, uninterrupted):
    # Logged step 4 comes after the step-3 checkpoint, so there is always one to resume from.
    kill_at = random.randint(4, STEPS - 2)
    out = tmp_path / "run"
    proc = start(["pretrain", "--data", small_english_data, "--out", out, "--nproc", "2", *ARGS])
    wait_for_step(out, kill_at, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed_from = max(int(p.name[5:]) for p in (out / "checkpoints").glob("step-*"))

    done = run_cli("pretrain", "--data", small_english_data, "--out", out, "--nproc", "2", "--resume", *ARGS)
    assert f"resuming from {out / 'checkpoints'}" in done.stdout, done.stdout
    assert_bitwise_equal(weights(uninterrupted), weights(out))
    ref, got = losses(uninterrupted), losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))  # steps after the checkpoint were logged once, anew
    assert [got[s] for s in range(resumed_from + 1, STEPS + 1)] == [
        ref[s] for s in range(resumed_from + 1, STEPS + 1)
    ], f"killed at step >= {kill_at}, resumed from {resumed_from}"


SHARDED = {"fsdp": ["--nproc", "2", "--strategy", "fsdp"], "tp2": ["--nproc", "2", "--tp", "2", "--batch-size", "8"]}
SHARDED_STEPS = 8


@pytest.mark.parametrize("layout", list(SHARDED))
def test_fsdp_and_tensor_parallel_runs_killed_with_sigkill_resume_bitwise(tmp_path, small_english_data, layout):
    """Sharded optimizer state (one file per process) and tensor-parallel dropout (the same masks in
    a tp group) come back exactly: the resumed run ends on the uninterrupted run's weights, dropout on."""
    args = [*ARGS, *SHARDED[layout], "--steps", str(SHARDED_STEPS), "--loader-workers", "0"]  # later flags win
    reference, out = tmp_path / "uninterrupted", tmp_path / "run"
    run_cli("pretrain", "--data", small_english_data, "--out", reference, *args)
    proc = start(["pretrain", "--data", small_english_data, "--out", out, *args])
    wait_for_step(out, random.randint(4, SHARDED_STEPS - 1), proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = run_cli("pretrain", "--data", small_english_data, "--out", out, "--resume", *args)
    assert "resuming from" in done.stdout, done.stdout
    assert_bitwise_equal(weights(reference, SHARDED_STEPS), weights(out, SHARDED_STEPS))


def test_sigterm_finishes_the_step_checkpoints_and_says_how_to_resume(tmp_path, small_english_data, uninterrupted):
    out = tmp_path / "run"
    proc = start(["pretrain", "--data", small_english_data, "--out", out, "--nproc", "2", *ARGS])
    wait_for_step(out, 4, proc)
    proc.send_signal(signal.SIGTERM)  # to the launcher, which forwards it to the workers
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "--resume" in stderr and "stopped by SIGTERM" in stderr, stderr
    assert "Traceback" not in stderr
    # One line: not torch's elastic agent's own log lines before it ("Received 15 death signal ...")
    assert [line for line in stderr.splitlines() if line.strip()] == [
        next(line for line in stderr.splitlines() if "stopped by SIGTERM" in line)
    ], stderr
    stopped_at = max(int(p.name[5:]) for p in (out / "checkpoints").glob("step-*"))
    assert stopped_at == max(losses(out)) >= 4  # the step it was in was finished and checkpointed
    assert f"step-{stopped_at:07d}" in stderr
    run_cli("pretrain", "--data", small_english_data, "--out", out, "--nproc", "2", "--resume", *ARGS)
    assert_bitwise_equal(weights(uninterrupted), weights(out))


def test_a_signal_on_the_first_line_of_torchs_metrics_wrapper_is_still_a_clean_stop(monkeypatch):
    """torch's elastic metrics wrapper (``metrics.prof``, around each round of the agent's monitoring loop) reads
    ``start`` in its ``finally``: a SIGTERM that lands on ``start = time.time()`` leaves ``start`` unset, and the
    agent raises UnboundLocalError with the SignalException as its context (seen once in about ten suite runs: a
    traceback after the stop line). The launcher takes it for the signal it is: exit 128 + 15, no traceback."""
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.metrics import api as metrics_api
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from bertgpu.parallel import launch

    class SignalOnTheClock:  # as torch's handler raises it, in the middle of `start = time.time()`
        @staticmethod
        def time():
            raise SignalException("Process got signal: 15", sigval=signal.SIGTERM)

    def monitored():
        return metrics_api.prof(lambda: None, group="agent")()  # torch's own wrapper, as the agent calls it

    monkeypatch.setattr(metrics_api, "time", SignalOnTheClock)
    with pytest.raises(UnboundLocalError) as raised:  # what torch does: the wrapper's finally reads `start`
        monitored()
    assert isinstance(raised.value.__context__, SignalException)
    monkeypatch.setattr(launcher_api, "elastic_launch", lambda config, fn: lambda *args: monitored())
    with pytest.raises(SystemExit) as stopped:
        launch.launch(print, (), 2)
    assert stopped.value.code == 128 + signal.SIGTERM


def test_torchrun_restarts_a_killed_worker_and_the_run_completes_identically(
    tmp_path, small_english_data, uninterrupted
):
    """The same command under torchrun (2 processes on this machine): rank 0 alone prints, and a worker killed
    mid-run is started again by torchrun, whose new workers resume from the latest checkpoint and end on the
    uninterrupted run's weights. (One torchrun run for both: a run that is not killed would print the same.)"""
    out = tmp_path / "run"
    proc = start(["pretrain", "--data", small_english_data, "--out", out, *ARGS], torchrun=True)
    wait_for_step(out, 7, proc)
    kill_torchrun_worker(proc)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert "2 processes = dp 2, ddp" in stdout and "global batch 8" in stdout, stdout
    # rank 0 alone prints: one start line for each of the two starts, one closing summary
    assert stdout.count("bertgpu pretrain:") == 3 and stdout.count("bertgpu pretrain: done") == 1, stdout
    assert "resuming from" in stdout
    assert_bitwise_equal(weights(uninterrupted), weights(out))
    assert [r["step"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())] == list(
        range(1, STEPS + 1)
    )


SLOW_WRITER = """
import sys, time, torch
from pathlib import Path
from bertgpu.checkpoints import checkpoint
from bertgpu.config import PretrainConfig
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
run, vocab, marker = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=30522))
cfg = PretrainConfig(model="tiny", out=str(run))
optimizer = torch.optim.AdamW(model.parameters())
files = checkpoint.ModelFiles(model.config, vocab, do_lower_case=True)
save = lambda step: checkpoint.save_checkpoint(run, step, model, optimizer, files,
                                               checkpoint.Snapshot({"position": {}}, config=cfg), keep=3)
save(1)
real = checkpoint.write_pretrained  # the name checkpoint calls (imported from hf_dir)
def slow(*args, **kwargs):
    real(*args, **kwargs)
    marker.write_text("writing")
    time.sleep(600)  # killed here, mid-checkpoint
checkpoint.write_pretrained = slow
with torch.no_grad():
    model.bert.embeddings.word_embeddings.weight.add_(1.0)
save(2)
"""


def test_sigkill_during_a_checkpoint_write_keeps_the_previous_one_latest(tmp_path, uncased_vocab):
    import transformers

    from bertgpu.checkpoints.checkpoint import latest_checkpoint

    run, marker = tmp_path / "run", tmp_path / "writing"
    proc = Forked(["-c", SLOW_WRITER, str(run), str(uncased_vocab), str(marker)], dict(os.environ))
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), "the writer never reached the middle of its second checkpoint"
    partial = [p.name for p in (run / "checkpoints").iterdir() if ".tmp-" in p.name]
    assert partial and any((run / "checkpoints" / p / "model.safetensors").exists() for p in partial)
    proc.kill()
    proc.wait()

    latest = latest_checkpoint(run)
    assert latest == run / "checkpoints" / "step-0000001"
    model = transformers.BertForPreTraining.from_pretrained(latest)
    assert model.bert.embeddings.word_embeddings.weight.abs().max() < 1  # the step-1 weights, not step 2's


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, small_english_data) -> Path:
    """A finished 2-step run (its step-2 checkpoint), which each crafted-pickle test copies and damages."""
    run = tmp_path_factory.mktemp("two-steps") / "run"
    run_cli(
        "pretrain",
        "--data",
        small_english_data,
        "--out",
        run,
        *TINY_RUN,
        "--steps",
        "2",
        "--batch-size",
        "4",
    )
    return run


@pytest.mark.parametrize("target", ["training_state.pt", "pytorch_model.bin", "optimizer/.metadata"])
def test_a_crafted_pickle_never_runs(tmp_path, small_english_data, two_step_run, target):
    """A checkpoint file that would run code when unpickled is refused without running it."""
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)  # a copy of its own: each test damages one file
    ckpt = run / "checkpoints" / "step-0000002"
    if target == "optimizer/.metadata":  # torch.distributed.checkpoint's own metadata is a plain pickle
        import pickle

        (ckpt / target).write_bytes(pickle.dumps(Exploit()))
        proc = run_cli(
            "pretrain",
            "--data",
            small_english_data,
            "--out",
            run,
            *TINY_RUN,
            "--steps",
            "4",
            "--resume",
            check=False,
        )
    elif target == "training_state.pt":
        torch.save({"step": 2, "payload": Exploit()}, ckpt / "training_state.pt")
        proc = run_cli(
            "pretrain",
            "--data",
            small_english_data,
            "--out",
            run,
            *TINY_RUN,
            "--steps",
            "4",
            "--resume",
            check=False,
        )
    else:
        (ckpt / "model.safetensors").unlink()
        torch.save({"weights": Exploit()}, ckpt / "pytorch_model.bin")
        proc = run_cli(
            "pretrain",
            "--data",
            small_english_data,
            "--out",
            tmp_path / "run2",
            "--model",
            ckpt,
            "--steps",
            "2",
            "--device",
            "cpu",
            "--loader-workers",
            "0",
            check=False,
        )
    assert proc.returncode != 0
    assert target in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not marker.exists(), "the pickle ran code"


def test_non_finite_loss_is_skipped_then_stops_with_the_last_good_weights(tmp_path, small_english_data):
    run = tmp_path / "run"
    proc = run_cli(
        "pretrain",
        "--data",
        small_english_data,
        "--out",
        run,
        *TINY_RUN,
        "--steps",
        "50",
        "--batch-size",
        "4",
        "--lr",
        "1e8",
        "--warmup",
        "0",
        "--clip",
        "0",
        "--max-bad-steps",
        "3",
        check=False,
    )
    assert proc.returncode != 0
    assert "not finite for 3 steps in a row" in proc.stderr, proc.stderr
    assert proc.stdout.count("step skipped") == 3
    saved = sorted((run / "checkpoints").glob("step-*"))
    assert len(saved) == 1
    w = load_file(saved[0] / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in w.values())


def test_a_kill_between_the_renames_of_a_replacement_loses_nothing(tmp_path):
    """atomic.directory replaces NAME by moving it aside (.NAME.old-*), then renaming the new one in;
    a kill between the two leaves no NAME. The cleanup puts the complete old one back."""
    from bertgpu.checkpoints.checkpoint import latest_checkpoint, remove_stale_temporaries

    root = tmp_path / "checkpoints"
    for name in (".step-0000003.old-11-aa", ".step-0000004.tmp-12-bb", "step-0000002", ".step-0000002.old-13-cc"):
        (root / name).mkdir(parents=True)
        (root / name / "model.safetensors").write_text(name)
    remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["step-0000002", "step-0000003"]
    assert (root / "step-0000003" / "model.safetensors").read_text() == ".step-0000003.old-11-aa"
    assert (root / "step-0000002" / "model.safetensors").read_text() == "step-0000002"
    assert latest_checkpoint(tmp_path) == root / "step-0000003"


# What a checkpoint has held since before issue 39 took TrainingRun apart, frozen from a run of that code
# (main at 6dabd8d, 2026-11-27): a run resumed from a checkpoint written then reads exactly these keys, so a
# refactor that adds, drops or renames one would break it.
PRETRAIN_STATE = {
    "balanced", "batch_sizes", "budget", "data_identity", "eval_data_identity", "global_batch", "heldout_documents",
    "layout", "layout_name", "log_sums", "position", "rng", "scaler", "step",
}  # fmt: skip
FINETUNE_STATE = {
    "adapter", "balanced", "batch_sizes", "best", "epoch_sums", "global_batch", "group_by_length", "history", "kept",
    "labels", "layout", "layout_name", "position", "rng", "scaler", "step", "steps_in_window", "train_examples",
    "window",
}  # fmt: skip
NESTED = {
    "position": {"pretrain": {"epoch", "instance"}, "finetune": {"epoch", "step_in_epoch"}},
    "budget": {"pretrain": {"done", "elapsed", "eval_s", "seconds", "step_s"}},
    "rng": {"pretrain": {"layout", "states"}, "finetune": {"layout", "states"}},
}
RECORD = {"pretrain": {"config", "step", "time_budget"}, "finetune": {"config", "step"}}
FILES = {
    "README.md", "bertgpu.json", "config.json", "model.safetensors", "optimizer", "special_tokens_map.json",
    "tokenizer_config.json", "training_state.pt", "vocab.txt",
}  # fmt: skip


def test_a_checkpoint_holds_the_keys_older_runs_resume_from(tmp_path, small_english_data, small_uncased_vocab):
    # a --time-budget run with a held-out set: every key pretraining writes
    pre = tmp_path / "pre"
    run_cli(
        "pretrain", "--data", small_english_data, "--out", pre, *TINY_RUN, "--batch-size", "4", "--no-nsp",
        "--time-budget", "2s", "--eval-fraction", "0.05", "--eval-instances", "8",
    )  # fmt: skip
    data = samples.write_sentiment_dataset(tmp_path / "reviews", test_per_class=8, train_per_class=8)
    model = write_tiny_bert(tmp_path / "bert", small_uncased_vocab)
    fine = tmp_path / "fine"
    run_cli(
        "finetune", "--model", model, "--train", data[0], "--eval", data[1], "--out", fine, "--epochs", "1",
        "--batch-size", "8", "--max-seq-length", "16", "--device", "cpu", "--nproc", "1",
    )  # fmt: skip
    for task, run, keys in (("pretrain", pre, PRETRAIN_STATE), ("finetune", fine, FINETUNE_STATE)):
        latest = checkpoint.latest_checkpoint(run)
        state = checkpoint.load_training_state(latest)
        assert set(state) == keys, (task, sorted(set(state) ^ keys))
        for key, by_task in NESTED.items():
            if task in by_task:
                assert set(state[key]) == by_task[task], (task, key, sorted(state[key]))
        record = json.loads((latest / "bertgpu.json").read_text(encoding="utf-8"))
        assert set(record) == RECORD[task], (task, sorted(record))
        assert {p.name for p in latest.iterdir()} == FILES, (task, sorted(p.name for p in latest.iterdir()))
