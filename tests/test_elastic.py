"""Elastic multi-machine runs (issue #19): a run that loses a machine goes on with the ones left, a machine
that comes back is taken in, and the training is the same run throughout because --global-batch keeps the
global batch whatever the layout.

Each "machine" is a bertgpu launcher of its own (`bertgpu pretrain --nnodes 1:2 --rdzv-endpoint ...`, one
process each) on this machine, in a session of its own so that killing it kills its workers too, as a
machine that is lost takes all its processes with it. The run directory is shared, as it must be. Every
forward pass sleeps (tests/slow_rank.py), so that a run outlasts torch elastic's rendezvous rounds.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from conftest import EXACT, TINY_RUN, run_cli
from procs import Forked, live_records
from slowing import slowed
from test_communication import free_port, weights, worst_difference

from bertgpu.models.bert.model import BertForPreTraining

STEPS = 20
RUN = [
    *TINY_RUN,
    *EXACT,
    "--max-seq-length",
    "64",
    "--steps",
    str(STEPS),
    "--batch-size",
    "4",
    "--global-batch",
    "8",  # 1 machine: 4 x 2 micro-steps; 2 machines: 4 x 2 ranks
    "--lr",
    "1e-4",
    "--warmup",
    "1",
    "--log-every",
    "1",
    "--save-every",
    "4",
]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, small_english_data) -> Path:
    """The uninterrupted run: one process, global batch 8 as 2 micro-steps of 4."""
    out = tmp_path_factory.mktemp("elastic") / "one"
    run_cli("pretrain", "--data", small_english_data, "--out", out, *RUN)
    return out


def start_machine(data: Path, out: Path, port: int, output: Path, *extra: str) -> Forked:
    """One machine's `bertgpu pretrain --nnodes 1:2`, its output to a file the test can watch: a launcher of its
    own, forked from the test worker's fork server (procs.Forked), its workers from a fork server of its own."""
    cmd = [
        "slow_rank",
        "pretrain",
        "--data",
        str(data),
        "--out",
        str(out),
        *RUN,
        "--nproc",
        "1",
        "--nnodes",
        "1:2",
        "--rdzv-endpoint",
        f"localhost:{port}",
        "--max-restarts",
        "3",
        # A second machine started with the first joins within 2 s (one that comes later is taken in at a
        # restart, as the third is); torch's 30 s would be waited out at each restart on one machine.
        "--rdzv-last-call",
        "2",
        # A killed machine is noticed after 3 missed heartbeats: 3 s instead of torch's 15.
        "--rdzv-heartbeat",
        "1",
        *extra,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SLOW_RANK": "any", "SLOW_SECONDS": "0.03", "PYTHONUNBUFFERED": "1"}
    return Forked(list(map(str, cmd)), env, output)


def wait_for(what: str, check, procs: list[Forked], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if any(p.poll() is not None for p in procs):
            raise AssertionError(f"a machine ended before {what}")
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("localhost", port)) == 0


def logged_step(out: Path) -> int:
    return max((r["step"] for r in live_records(out)), default=0)


def lose_a_machine(tmp_path: Path, data: Path) -> tuple[Path, int, Forked, Path]:
    """Two machines train; after the step-4 checkpoint the second is killed whole (SIGKILL to its launcher,
    agent and worker). Return the run directory, the rendezvous port, the first machine and its output."""
    out, port = tmp_path / "run", free_port()
    first = start_machine(data, out, port, tmp_path / "first.txt")
    wait_for("the rendezvous", lambda: listening(port), [first])  # the first machine hosts it, as a user's would
    second = start_machine(data, out, port, tmp_path / "second.txt")
    wait_for("step 5", lambda: logged_step(out) >= 5, [first, second])
    os.killpg(second.pid, signal.SIGKILL)
    second.wait()
    return out, port, first, tmp_path / "first.txt"


def test_a_lost_machine_leaves_the_other_training_alone_and_a_returning_one_is_taken_in(
    tmp_path, small_english_data, one_process
):
    """One run through both events (one rendezvous set-up instead of two): two machines, one lost, the other
    trains on alone with the same global batch, a third comes and is taken in, and the run ends on the weights
    of one uninterrupted process."""
    out, port, first, output = lose_a_machine(tmp_path, small_english_data)

    def after_the_loss() -> str:
        text = output.read_text()
        return text[text.index("(was 2 processes") :] if "(was 2 processes" in text else ""

    wait_for("a step alone", lambda: "\nstep " in after_the_loss(), [first])
    third = start_machine(small_english_data, out, port, tmp_path / "third.txt")
    assert first.wait(timeout=600) == 0, output.read_text()[-3000:]
    assert third.wait(timeout=600) == 0, (tmp_path / "third.txt").read_text()[-3000:]
    text = output.read_text()
    assert "2 processes = dp 2, ddp, on cpu, fp32, global batch 8 = 4 x 2 x 1" in text
    assert "on 1 process (was 2 processes = dp 2, ddp)" in text, text[-3000:]  # the restart's one line
    assert "global batch 8 = 4 x 1 x 2" in text  # the same global batch, now 2 micro-steps
    text += (tmp_path / "third.txt").read_text()
    assert "on 2 processes = dp 2, ddp (was 1 process)" in text, text[-3000:]
    worst = worst_difference(weights(one_process, STEPS), weights(out, STEPS))
    assert worst <= 1e-6, f"max abs parameter difference {worst:.3g}"


def test_a_run_directory_that_is_not_shared_is_refused(tmp_path, small_english_data):
    """Two machines whose --out are different directories (as two machines' local disks are): one line."""
    port = free_port()
    procs = [
        start_machine(
            small_english_data,
            tmp_path / name,
            port,
            tmp_path / f"{name}.txt",
            "--rdzv-id",
            "same-run",
            "--nnodes",
            "2",
            "--max-restarts",
            "0",  # a restart would meet the same refusal (the agents cannot tell a user's error from a crash)
        )
        for name in ("a", "b")
    ]
    codes = [p.wait(timeout=600) for p in procs]
    text = (tmp_path / "a.txt").read_text() + (tmp_path / "b.txt").read_text()
    errors = [line for line in text.splitlines() if line.startswith("bertgpu: error:")]
    refused = [e for e in errors if "is not shared: rank(s) 1 (" in e]
    # The machine hosting the rendezvous may stop first: the other's agent then says that in one line (exit 1).
    lost = [e for e in errors if "lost the rendezvous at localhost:" in e]
    assert refused and len(refused) + len(lost) == len(errors), text[-3000:]
    assert sorted(codes) in ([2, 2], [1, 2]) and codes.count(1) == len(lost), (codes, text[-3000:])
    assert "Traceback" not in text


def test_save_every_minutes_checkpoints_on_time(tmp_path, small_english_data, monkeypatch):
    """Slow steps (0.4 s each) and a checkpoint every 0.02 minutes: checkpoints at steps that --save-every
    (1000) would never write; written in the background (--async-save), each complete. One process, which trains
    in the test process (its forward passes slowed here, as tests/slow_rank.py slows a command line's)."""
    monkeypatch.setattr(BertForPreTraining, "forward", slowed(BertForPreTraining.forward))
    out = tmp_path / "run"
    # 8 slow steps (~3.2 s): two checkpoints on the clock (~1.2 s apart) before the last step's, with a step to spare
    args = [*RUN[: RUN.index("--steps")], "--steps", "8", *RUN[RUN.index("--steps") + 2 :]]
    args[args.index("--save-every") + 1] = "1000"
    proc = run_cli(
        "pretrain", "--data", small_english_data, "--out", out, *args, "--nproc", "1",
        "--save-every-minutes", "0.02", "--keep", "0", "--async-save",
        env={"SLOW_RANK": "any", "SLOW_SECONDS": "0.05"}, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").iterdir())
    assert len([s for s in steps if s < 8]) >= 2, steps  # on time, before the end
    assert 8 in steps and "Traceback" not in proc.stderr and "warning" not in proc.stderr, proc.stderr
    for step in steps:  # every one complete: weights and optimizer shards
        assert (out / "checkpoints" / f"step-{step:07d}" / "optimizer" / ".metadata").is_file()
        weights(out, step)


def test_bad_elastic_flags_are_one_line(tmp_path, small_english_data):
    cases = [
        (["--global-batch", "10"], "--global-batch 10 is not a multiple of the 4 examples of one micro-step"),
        (["--global-batch", "8", "--grad-accum", "2"], "give one of them"),
        (["--nnodes", "1:2"], "--nnodes 1:2 needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "3:2"], "--nnodes 3:2: give a number of machines, or MIN:MAX"),
        (["--save-every-minutes", "-1"], "--save-every-minutes must be at least 0"),
        (["--rdzv-last-call", "-1"], "--rdzv-last-call must be at least 0 seconds"),
        (["--rdzv-heartbeat", "0"], "--rdzv-heartbeat must be at least 1 second"),
    ]
    for flags, needle in cases:
        proc = run_cli(
            "pretrain", "--data", small_english_data, "--out", tmp_path / "run", "--model", "tiny", "--batch-size", "4",
            *flags, check=False,
        )  # fmt: skip
        assert proc.returncode == 2 and needle in proc.stderr, (flags, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


BACKGROUND_WRITER = """
import sys, time, torch
from pathlib import Path
from bertgpu.checkpoints import checkpoint
from bertgpu.config import PretrainConfig
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
run, vocab, marker = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
torch.manual_seed(0)
model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=30522))
cfg = PretrainConfig(model="tiny", out=str(run))
optimizer = torch.optim.AdamW(model.parameters())
saver = checkpoint.BackgroundSaver()
files = checkpoint.ModelFiles(model.config, vocab, do_lower_case=True)
save = lambda step: checkpoint.save_checkpoint(run, step, model, optimizer, files,
                                               checkpoint.Snapshot({"position": {}}, config=cfg), keep=3, saver=saver)
weight = model.bert.embeddings.word_embeddings.weight
with torch.no_grad():
    weight.fill_(1.0)
    save(1)
    weight.fill_(2.0)  # training goes on while step 1 is written: the checkpoint keeps what step 1 had
    saver.wait()
real = checkpoint.write_pretrained  # the name checkpoint calls (imported from hf_dir)
def slow(*args, **kwargs):
    real(*args, **kwargs)
    marker.write_text("writing")
    time.sleep(600)  # killed here, mid-write, in the background
checkpoint.write_pretrained = slow
with torch.no_grad():
    save(2)
    weight.fill_(3.0)
time.sleep(600)
"""


def test_a_background_save_keeps_its_steps_state_and_a_kill_midway_keeps_the_previous_one(tmp_path, uncased_vocab):
    import transformers

    from bertgpu.checkpoints.checkpoint import latest_checkpoint

    run, marker = tmp_path / "run", tmp_path / "writing"
    proc = Forked(["-c", BACKGROUND_WRITER, str(run), str(uncased_vocab), str(marker)], dict(os.environ))
    deadline = time.monotonic() + 300
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), "the background writer never reached the middle of its second checkpoint"
    proc.kill()
    proc.wait()
    latest = latest_checkpoint(run)
    assert latest == run / "checkpoints" / "step-0000001"
    model = transformers.BertForPreTraining.from_pretrained(latest)
    assert (model.bert.embeddings.word_embeddings.weight == 1.0).all()  # step 1's state, not what came after
