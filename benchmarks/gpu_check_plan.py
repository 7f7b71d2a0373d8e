"""What gpu_check.py runs: the full and the smoke plan (shapes, steps, time limits, budget) and the command line
of each run, the same for its warm-up and its timed run."""

from __future__ import annotations

import json
from pathlib import Path

import corpora
from common import BERTGPU, PEERS, PY

FULL = {
    # Issue 38's acceptance rows: timed first, in this order.
    "bench": [("base", 64, 128), ("base", 256, 128), ("large", 32, 128), ("large", 128, 128)],
    "bench_extra": [("base", 16, 512)],  # last, where time is left
    "bench_steps": ["--steps", "10", "--warmup", "3"],
    # bench's base 256 x 128 shape, so that the loop's seq/s compares with bench's
    "pretrain": dict(model="base", batch=256, seq=128, steps=200, log_every=25, repeat=80),
    # issue 38's 512 row: large on 512-token packed rows, attention within each document (the default)
    "pretrain_512": dict(model="large", batch=32, seq=512, steps=60, log_every=10),
    "ttq": dict(model="base", batch=64, seq=128, steps=150, lr="2e-4", eval_instances=500),
    "vocab": corpora.BERT_VOCAB,
    # seconds: the CUDA tests in all and each test, a warm-up, a bench row, a pretraining run, each side of the race
    "limits": dict(tests=190, test=120, warm=170, bench=100, pretrain=80, ttq=70, switch=60),
    "archs": ["bert", "modernbert"],  # bert is an acceptance row; modernbert comes after the race
    # Issue 59's switches, each timed on (bench --compiled-only) against its shape's full row, by value: the shapes
    # of the aims first; FP8 at large only (base's matmuls are below its width); the autotuner's compile last.
    "switches": [
        ["--compile-step"],
        ["--bf16-stream"],
        ["--fp8", "--fp8-recipe", "tensorwise"],
        ["--fp8", "--fp8-recipe", "rowwise"],
        ["--autotune"],
    ],  # fmt: skip
    "switch_shapes": [("base", 256, 128), ("large", 128, 128), ("base", 64, 128), ("large", 32, 128)],
    # the 512 row again with --document-bounds (the bounds from the document numbers), then with --compile-step
    "pretrain_switches": [["--document-bounds"], ["--compile-step"]],
    "budget": 470,  # seconds for the whole check (8 minutes, less a margin for start-up and the table)
    "warm_share": 0.4,  # the tests and warm-ups end by this share of the budget
}
SMOKE = {
    "bench": [("tiny", 4, 32)],
    "bench_extra": [],
    "bench_steps": ["--steps", "1", "--warmup", "0"],
    "pretrain": dict(model="tiny", batch=8, seq=64, steps=8, log_every=4, repeat=1),
    "pretrain_512": dict(model="tiny", batch=2, seq=128, steps=4, log_every=2),
    "ttq": dict(model="tiny", batch=8, seq=64, steps=4, lr="5e-4", eval_instances=32),
    "vocab": 2000,  # a tiny model's runs, saves and evaluations stay quick
    "limits": dict(tests=120, test=60, warm=120, bench=60, pretrain=60, ttq=60, switch=60),
    "archs": ["bert", "modernbert"],
    "switches": [["--bf16-stream"]],  # no compile on the CPU: the phase's own logic
    "switch_shapes": [("tiny", 4, 32)],
    "pretrain_switches": [["--document-bounds"]],
    "budget": 240,
    "warm_share": 0.4,
}


def bench_args(shape: tuple[str, int, int], device: str, vocab: Path, steps: list[str]) -> list[str]:
    model, batch, seq = shape
    precision = "bf16" if device == "cuda" else "fp32"
    compile = ["--compile"] if device == "cuda" else ["--no-compile"]
    return [*BERTGPU, "bench", "--model", model, "--batch-size", str(batch), "--seq-len", str(seq), "--device",
            device, "--precision", precision, "--vocab", str(vocab), *compile, *steps]  # fmt: skip


def switch_args(shape: tuple[str, int, int], device: str, vocab: Path, steps: list[str], switch: list[str]):
    """bench with one of issue 59's switches on: on a GPU bertgpu --compile alone (its full row is the baseline),
    on a CPU the eager pair (no compile: the smoke's own logic)."""
    alone = ["--compiled-only"] if device == "cuda" else []
    return [*bench_args(shape, device, vocab, steps), *switch, *alone]


def applies(switch: list[str], shape: tuple[str, int, int]) -> bool:
    """FP8 converts only matmuls at least 1024 wide: not at base (its row would time bf16 again)."""
    return "--fp8" not in switch or shape[0] == "large"


def pretrain_args(p: dict, data: Path, out: Path, device: str, steps: int, extra: list[str] = ()) -> list[str]:
    gpu = ["--precision", "bf16", "--compile"] if device == "cuda" else ["--precision", "fp32"]
    return [*BERTGPU, "pretrain", "--data", str(data), "--out", str(out), "--overwrite", "--model", p["model"],
            "--device", device, "--nproc", "1", "--batch-size", str(p["batch"]), "--max-seq-length", str(p["seq"]),
            "--steps", str(steps), "--no-nsp", "--pack", "--save-every", "100000", "--keep", "1",
            "--loader-workers", "4" if device == "cuda" else "1", *gpu, *extra]  # fmt: skip


def ttq_bertgpu_args(t: dict, data: Path, out: Path, device: str, steps: int) -> list[str]:
    return pretrain_args(
        dict(t, model=t["model"]), data, out, device, steps,
        ["--lr", t["lr"], "--warmup", "0.1", "--eval-fraction", "0.1",
         "--eval-instances", str(t["eval_instances"]), "--log-every", str(max(1, steps // 5)), "--seed", "0"],
    )  # fmt: skip


def ttq_child_args(t: dict, data: Path, device: str, steps: int) -> list[str]:
    spec = dict(model=t["model"], data=str(data), seq=t["seq"], batch=t["batch"], steps=steps, lr=t["lr"],
                seed=0, eval_instances=t["eval_instances"], device=device)  # fmt: skip
    return [PY, str(PEERS / "hf_compiled_mlm.py"), json.dumps(spec)]
