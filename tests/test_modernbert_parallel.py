"""A ModernBERT spread over gloo processes ends on one process's parameters with the same global batch (as
tests/test_parallel.py proves for BERT): DDP, FSDP, unequal batches with activation checkpointing, tensor
parallel (alone, with DDP and with FSDP), pipeline stages (alone and with FSDP) and the 3D layout pp x dp x tp
with FSDP; 1e-6 after 3 AdamW steps (3D 2e-6), fp32, dropout 0. Sequences of 256 tokens, so that local and
global layers attend differently. Tensor parallel uses ModernBERT's own plan (parallel/fused_tp.py: each
process's rows of the fused Wqkv and Wi are the matching q/k/v and input/gate slices); a wrong slicing would
attend with other heads and fail the parity. Under FSDP those weights are sharded by columns: FSDP's default
(rows) trains right but gathers the checkpoint's Wqkv/Wi in the wrong order, 0.0785 off (measured)."""

from __future__ import annotations

import shutil

import pytest
from conftest import EXACT, TINY_RUN, run_cli
from safetensors.torch import load_file
from test_parallel import losses, worst_difference

COMMON = [
    "--arch", "modernbert", *TINY_RUN, *EXACT, "--no-nsp", "--pack", "--max-seq-length", "256",
    "--max-predictions", "40", "--seed", "7", "--steps", "3", "--lr", "1e-4", "--warmup", "1", "--log-every", "1",
]  # fmt: skip
LAYOUTS = {
    "ddp-2procs-x-4": (["--nproc", "2", "--batch-size", "4"], "2 processes = dp 2, ddp"),
    "fsdp-2procs-x-4": (["--nproc", "2", "--batch-size", "4", "--strategy", "fsdp"], "2 processes = dp 2, fsdp"),
    "unequal-6-and-2-ac": (
        ["--nproc", "2", "--batch-size", "6,2", "--activation-checkpointing"],
        "2 processes = dp 2, ddp",
    ),
    "tp2-x-8": (["--nproc", "2", "--batch-size", "8", "--tp", "2"], "2 processes = tp 2"),
    "pp2-x-8-1f1b": (["--nproc", "2", "--batch-size", "8", "--pp", "2"], "2 processes = pp 2"),
    "pp2-x-dp2-x-4-gpipe-fsdp": (
        ["--nproc", "4", "--batch-size", "4", "--pp", "2", "--pp-schedule", "gpipe", "--strategy", "fsdp"],
        "4 processes = pp 2 x dp 2, fsdp",
    ),
    "dp2-x-tp2-ddp-x-4-ac": (
        ["--nproc", "4", "--batch-size", "4", "--tp", "2", "--activation-checkpointing"],
        "4 processes = dp 2 x tp 2, ddp",
    ),
    # Saved at every step: a save must not move the run (it once replaced the strided moments), and the resume
    # test resumes from its step 2.
    "dp2-x-tp2-fsdp-x-4": (
        ["--nproc", "4", "--batch-size", "4", "--tp", "2", "--strategy", "fsdp", "--save-every", "1"],
        "4 processes = dp 2 x tp 2, fsdp",
    ),
    "3d-pp2-x-dp2-x-tp2-fsdp-x-4": (
        ["--nproc", "8", "--batch-size", "4", "--pp", "2", "--tp", "2", "--strategy", "fsdp"],
        "8 processes = pp 2 x dp 2 x tp 2, fsdp",
    ),
}
TOLERANCE = 1e-6
TOLERANCE_3D = 2e-6  # the bound for dp x tp x pp


def final_weights(run_dir):
    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    assert ckpt.name == "step-0000003"
    return load_file(ckpt / "model.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, small_english_data):
    out = tmp_path_factory.mktemp("runs") / "one-by-8"
    run_cli("pretrain", "--data", small_english_data, "--out", out, "--nproc", "1", "--batch-size", "8", *COMMON)
    first = losses(out)
    assert len(first) == 3 and first[0] != first[-1]
    return out


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, small_english_data):
    """Each layout's run directory, run once for the module (the resume test shares one)."""
    done = {}

    def get(name):
        if name not in done:
            flags, described = LAYOUTS[name]
            out = tmp_path_factory.mktemp("runs") / name
            proc = run_cli("pretrain", "--data", small_english_data, "--out", out, *flags, *COMMON)
            assert described in proc.stdout and "global batch 8" in proc.stdout, proc.stdout
            done[name] = out
        return done[name]

    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_same_parameters_as_one_process(name, reference, layouts):
    out = layouts(name)
    worst = worst_difference(final_weights(reference), final_weights(out))
    assert worst <= (TOLERANCE_3D if name.startswith("3d") else TOLERANCE), f"max abs parameter difference {worst:.3g}"
    assert losses(out) == pytest.approx(losses(reference), abs=1e-5)


@pytest.mark.parametrize(
    "flags, says",
    [(["--nproc", "6", "--tp", "2", "--strategy", "fsdp"], "3 does not divide its hidden_size 128")],
)
def test_what_is_not_supported_is_refused_in_one_line(flags, says, tmp_path, small_english_data):
    proc = run_cli("pretrain", "--data", small_english_data, "--out", tmp_path / "x", *flags, *COMMON, check=False)
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_tensor_parallel_run_resumes_exactly_on_its_layout_and_on_others(tmp_path, small_english_data, layouts):
    """A dp 2 x tp 2 FSDP checkpoint (optimizer state of the strided Wqkv/Wi, sharded by columns over dp: written
    whole over the tp group) resumes to the uninterrupted run's weights: on that layout again, under --tp 2
    alone and on one process."""
    flags = ("--data", small_english_data, "--save-every", "1", *COMMON)
    tp_fsdp = ["--nproc", "4", "--tp", "2", "--strategy", "fsdp", "--batch-size", "4"]
    full = layouts("dp2-x-tp2-fsdp-x-4")  # tp_fsdp with flags, saved at every step, run for the parity test
    for name, layout in (
        ("tp-fsdp", tp_fsdp),
        ("tp2", ["--nproc", "2", "--tp", "2", "--batch-size", "8"]),
        ("one", ["--nproc", "1", "--batch-size", "8"]),
    ):
        again = tmp_path / name
        shutil.copytree(full, again)
        shutil.rmtree(again / "checkpoints" / "step-0000003")
        proc = run_cli("pretrain", "--out", again, *layout, "--resume", *flags)
        assert "resuming from" in proc.stdout and "step 2" in proc.stdout, proc.stdout
        worst = worst_difference(final_weights(full), final_weights(again))
        assert worst <= TOLERANCE, (name, worst)
