"""Communication and unequal GPUs: gradient compression, load balancing, learning-rate scaling,
RMSprop, and two torchrun "nodes" on this machine.

Every run is a real multi-process gloo run through the CLI (or torchrun), on the Python reference.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import EXACT, ROOT, TINY_RUN, run_balanced_with_a_slow_rank, run_cli
from procs import assert_bitwise_equal, start, torchrun_workers, wait_for_step
from safetensors.torch import load_file


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step-{step:07d}" / "model.safetensors")


def log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def worst_difference(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# --- gradient compression ----------------------------------------------------------------------------

STEPS = 8
WARMUP = 2  # PowerSGD's uncompressed steps
COMPRESS = [
    *TINY_RUN,
    "--nproc",
    "2",
    "--batch-size",
    "4",
    "--steps",
    str(STEPS),
    "--lr",
    "1e-3",
    "--warmup",
    "1",
    "--log-every",
    "2",
    "--save-every",
    "4",
    "--precision",
    "fp32",
    "--seed",
    "11",
    "--powersgd-warmup",
    str(WARMUP),
]


@pytest.fixture(scope="module")
def compressed_runs(tmp_path_factory, small_english_data) -> dict[str, Path]:
    """8 steps of the same 2-process run (dropout on) with each --grad-compression."""
    runs = {}
    for kind in ("none", "fp16", "bf16", "powersgd"):
        runs[kind] = tmp_path_factory.mktemp("compression") / kind
        proc = run_cli(
            "pretrain", "--data", small_english_data, "--out", runs[kind], "--grad-compression", kind, *COMPRESS
        )
        if kind != "none":
            assert f"gradients {kind}" in proc.stdout, proc.stdout
    return runs


@pytest.mark.parametrize("kind", ["fp16", "bf16", "powersgd"])
def test_each_compression_trains_and_changes_the_update(kind, compressed_runs):
    """Each compression changes the update (the weights differ from uncompressed all-reduce's) and
    still trains: its mean loss over the last 2 steps is within 0.05 of the uncompressed run's. The
    loss falls by ~0.5 over these 8 steps; rounding gradients to 11 (fp16) or 8 (bf16) bits, or
    PowerSGD's rank-4 factors with error feedback, move it by hundredths (measured: < 0.003)."""
    none, got = log(compressed_runs["none"]), log(compressed_runs[kind])
    assert none[0]["loss"] - none[-1]["loss"] > 0.3  # the baseline learns, so the comparison means something
    assert abs(got[-1]["loss"] - none[-1]["loss"]) < 0.05, (got[-1]["loss"], none[-1]["loss"])
    assert worst_difference(weights(compressed_runs["none"], STEPS), weights(compressed_runs[kind], STEPS)) > 1e-6


def test_the_log_gives_the_bytes_exchanged_per_step(compressed_runs):
    """fp16 and bf16 halve the bytes of an fp32 all-reduce; PowerSGD sends its factors once it has
    warmed up (rank 4 on the tiny model: about a twentieth)."""
    bytes_ = {kind: [r["comm_bytes_per_step"] for r in log(run)] for kind, run in compressed_runs.items()}
    full = bytes_["none"][-1]
    n_params = sum(t.numel() for t in weights(compressed_runs["none"], STEPS).values())
    assert full > 4 * 0.9 * n_params  # every trainable gradient, 4 bytes each (the tied decoder counted once)
    assert bytes_["fp16"][-1] == bytes_["bf16"][-1] == full / 2
    assert bytes_["powersgd"][0] == full  # steps 1-2: uncompressed warm-up
    assert bytes_["powersgd"][-1] < full / 10


def test_a_powersgd_run_killed_with_sigkill_resumes_bit_for_bit(tmp_path, small_english_data, compressed_runs):
    """PowerSGD's error feedback, warm-start factors, step and RNG are in the checkpoint, one file per
    process, and DDP's buckets are laid out as they were before the state meets them."""
    out = tmp_path / "run"
    args = ["pretrain", "--data", small_english_data, "--out", out, "--grad-compression", "powersgd", *COMPRESS]
    proc = start(args)
    wait_for_step(out, random.randint(5, STEPS - 1), proc)  # past the step-4 checkpoint: PowerSGD state saved
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = run_cli(*args, "--resume")
    assert "resuming from" in done.stdout and "PowerSGD starts afresh" not in done.stderr, done.stderr
    assert_bitwise_equal(weights(compressed_runs["powersgd"], STEPS), weights(out, STEPS))


# --- unequal GPUs ----------------------------------------------------------------------------------------

BALANCE = [*TINY_RUN, *EXACT, "--steps", "6", "--lr", "1e-4", "--warmup", "1", "--log-every", "1", "--save-every", "6"]
BALANCE += ["--seed", "7"]


def test_balance_auto_moves_work_to_the_faster_process_and_keeps_the_union_batch(tmp_path, small_english_data):
    """Process 1 is made slower from outside the product (tests/slow_rank.py: its model's forward pass
    sleeps 30 ms per sequence first, as a slower GPU would take longer). After timing steps 2-5,
    --balance auto gives process 0 the larger share of the global batch of 8, and the run still ends
    on the weights of one process training on the whole global batch (1e-6)."""
    one, balanced = tmp_path / "one", tmp_path / "balanced"
    run_cli("pretrain", "--data", small_english_data, "--out", one, "--nproc", "1", "--batch-size", "8", *BALANCE)
    _, line, new = run_balanced_with_a_slow_rank(
        "pretrain", "--data", small_english_data, "--out", balanced, "--batch-size", "4", "--balance", "auto", *BALANCE
    )
    assert sum(new) == 4 + 4 and new[0] > new[1], line
    state = torch.load(balanced / "checkpoints" / "step-0000006" / "training_state.pt", weights_only=True)
    assert state["batch_sizes"] == new and state["balanced"]  # kept, so that a resume uses them
    worst = worst_difference(weights(one, 6), weights(balanced, 6))
    assert worst <= 1e-6, f"max abs parameter difference {worst:.3g}"


# --- learning-rate scaling and RMSprop ----------------------------------------------------------------


def test_lr_scaling_follows_the_formula(tmp_path, small_english_data):
    from bertgpu.training.batch import scaled_lr

    assert scaled_lr(1e-4, 512, "linear", 256) == pytest.approx(2e-4)
    assert scaled_lr(1e-4, 64, "sqrt", 256) == pytest.approx(0.5e-4)
    assert scaled_lr(1e-4, 1024, "none", 256) == 1e-4
    out = tmp_path / "run"
    proc = run_cli(
        "pretrain",
        "--data",
        small_english_data,
        "--out",
        out,
        *TINY_RUN,
        "--nproc",
        "1",
        "--batch-size",
        "4",
        "--grad-accum",
        "4",
        "--steps",
        "2",
        "--warmup",
        "0",
        "--lr",
        "1e-4",
        "--lr-scaling",
        "sqrt",
        "--reference-batch",
        "4",
        "--log-every",
        "1",
    )
    # global batch 4 x 1 x 4 = 16 = 4 x the reference: sqrt scaling doubles the peak
    assert "peak lr 0.0002 = 0.0001 x sqrt(16/4) (--lr-scaling sqrt)" in proc.stdout, proc.stdout
    first = log(out)[0]
    assert first["peak_lr"] == pytest.approx(2e-4) and first["lr"] == pytest.approx(1e-4)  # linear decay over 2 steps


def test_rmsprop_follows_the_formula_without_decay_on_biases_and_layernorm():
    """One step of --optimizer rmsprop: v = a v + (1 - a) g^2, w -= lr (g + wd w) / (sqrt(v) + eps),
    with wd 0 for biases and LayerNorm weights."""
    from bertgpu.config import OptimConfig
    from bertgpu.training.optim import build_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    model[1].weight.data.normal_()
    cfg = OptimConfig(optimizer="rmsprop", lr=0.01, weight_decay=0.1, adam_eps=1e-6, rmsprop_alpha=0.9)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    assert isinstance(optimizer, torch.optim.RMSprop)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(5, 4)).pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.step()
    for name, p in model.named_parameters():
        wd = 0.1 if name == "0.weight" else 0.0  # biases and the LayerNorm weight: no decay
        g = grads[name] + wd * before[name]
        v = (1 - 0.9) * g * g
        torch.testing.assert_close(
            p.detach(), before[name] - 0.01 * g / (v.sqrt() + 1e-6), atol=1e-7, rtol=1e-6, msg=name
        )


# --- two torchrun "nodes" ---------------------------------------------------------------------------------

NODES = [*TINY_RUN, *EXACT, "--batch-size", "4", "--steps", "6", "--lr", "1e-4", "--warmup", "1", "--log-every", "1"]
NODES += ["--save-every", "2", "--seed", "3"]


def submit_the_slurm_script(tmp_path: Path, data: Path, out: Path, *flags: str) -> subprocess.Popen:
    """examples/slurm/pretrain.sbatch, its paths set as a user sets them and BERTGPU_ARGS's flags after its own
    (the last one given wins), run by bash with stand-ins for SLURM's srun (which starts the command once per node,
    here twice on this machine, and fails when one does) and scontrol (which names the nodes): two torchrun agents,
    one process each, meeting through c10d rendezvous, the run directory shared. A session of its own, so that
    the test can tell its workers from others'."""
    import textwrap

    script = (ROOT / "examples" / "slurm" / "pretrain.sbatch").read_text()
    venv = Path(sys.executable).parents[1]
    for name, value in (("DATA", data), ("OUT", out), ("VENV", venv), ("MODEL", "tiny")):
        script = script.replace(
            next(line for line in script.splitlines() if line.startswith(f"{name}=")), f"{name}={value}"
        )
    (tmp_path / "pretrain.sbatch").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        textwrap.dedent("""\
        #!/bin/bash
        [ "$1" = --kill-on-bad-exit=0 ] && shift
        pids=()
        for node in $(seq 1 "$SLURM_NNODES"); do "$@" & pids+=($!); done
        status=0
        for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
        exit $status
        """)
    )
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho localhost\necho localhost\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{bin_dir}:{venv / 'bin'}:{os.environ['PATH']}",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_GPUS_ON_NODE": "1",
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_JOB_ID": "4242",
        "RDZV_PORT": str(free_port()),
        "BERTGPU_ARGS": " ".join(flags),
    }
    return subprocess.Popen(
        ["bash", str(tmp_path / "pretrain.sbatch")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, small_english_data) -> Path:
    out = tmp_path_factory.mktemp("nodes") / "nproc2"
    run_cli("pretrain", "--data", small_english_data, "--out", out, "--nproc", "2", *NODES)
    return out


def test_the_slurm_script_trains_on_two_torchrun_nodes_as_two_local_processes_even_when_a_worker_dies(
    tmp_path, small_english_data, two_processes
):
    """The SLURM script as submitted (its paths set, the test's flags in BERTGPU_ARGS) trains on two torchrun
    nodes as two local processes do: the summation order is the same (one gloo all-reduce of two ranks), and so
    is each process's thread count (the script's OMP_NUM_THREADS, 1 here). One run proves that and the
    restart: the worker of one node is killed mid-run under the script's --max-restarts, that node restarts it,
    the other node's group restarts too (a membership change), and the run resumes from its latest checkpoint
    (the script's --resume; without it, test_elastic's lost machine), ends where the uninterrupted run does and
    writes a checkpoint that transformers loads."""
    out = tmp_path / "run"
    flags = ["--device", "cpu", "--precision", "fp32", "--loader-workers", "0", *NODES]
    job = submit_the_slurm_script(tmp_path, small_english_data, out, *flags, "--lr-scaling", "none")
    wait_for_step(out, 3, job)  # past the step-2 checkpoint
    workers = list(torchrun_workers(job.pid))  # the agents' workers, not what they start
    assert len(workers) == 2, f"expected one worker on each node, found {workers}"
    os.kill(min(workers), signal.SIGKILL)
    stdout, stderr = job.communicate(timeout=600)
    assert job.returncode == 0, stderr[-3000:]
    assert "2 processes = dp 2, ddp" in stdout and "global batch 8" in stdout, stdout
    assert "resuming from" in stdout, stdout
    worst = worst_difference(weights(two_processes, 6), weights(out, 6))
    assert worst <= 1e-6, f"max abs parameter difference {worst:.3g}"
    import transformers

    transformers.BertForPreTraining.from_pretrained(out / "checkpoints" / "step-0000006")
