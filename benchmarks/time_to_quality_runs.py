"""time_to_quality.py's runs, one process each: the Trainer peer (``run_transformers``, calibrated or on its clock)
and bertgpu (``run_bertgpu``: calibrated, or with --own-schedule ``run_bertgpu_budget``), each saving its weights as
it goes, the checkpoints named by the time they appeared (``timed_checkpoints``) for the curves measured after."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import common
from common import BERTGPU, PEERS, PY, ROOT, bertgpu, sh

HF_CHILD = str(PEERS / "hf_trainer_mlm.py")  # the transformers side, in a process of its own


def bertgpu_precision() -> str:
    """The precision `bertgpu pretrain --recipe fast` takes on this machine's CPU (--precision auto)."""
    from bertgpu.training.precision import cpu_has_native_bf16

    return "bf16" if cpu_has_native_bf16() else "fp32"


def run_transformers(
    work: Path, args, config: dict, blocks_path: Path, tokenizer_dir: Path, precision: str, lr: float
) -> Path:
    """The Trainer on the masked-LM class of ``config`` (a config.json dict) at ``precision`` and peak rate ``lr``."""
    out = work / f"transformers-{config['model_type']}-{precision}-lr{lr:g}"
    shutil.rmtree(out, ignore_errors=True)
    spec = dict(blocks=str(blocks_path), tokenizer_dir=str(tokenizer_dir), config=config, batch=args.batch, lr=lr,
                warmup=args.warmup, seed=0, every=args.every, budget=args.budget, out=str(out), bf16=precision == "bf16",
                clock=args.own_schedule)  # fmt: skip
    if args.own_schedule:  # the schedule follows the clock: no calibration, steps until the budget stops it
        print(f"{out.name}: learning rate by the clock, stopped at the budget", flush=True)
        sh(PY, HF_CHILD, json.dumps({**spec, "steps": 10**7, "calibrate": False}))
        return out
    calib = sh(PY, HF_CHILD, json.dumps({**spec, "steps": 20, "calibrate": True}))
    per_step = json.loads(calib.stdout.strip().splitlines()[-1])["seconds_per_step"]
    steps = int(args.budget / per_step)
    print(f"{out.name}: {per_step * 1000:.0f} ms/step -> a schedule of {steps} steps", flush=True)
    sh(PY, HF_CHILD, json.dumps({**spec, "steps": steps, "calibrate": False}))
    return out


def timed_checkpoints(out: Path, start: float, cap: float = float("inf")) -> Path:
    """Name each checkpoint of the run in ``out`` by its time (``tSSSSSS.S-step-N``, at most ``cap``): when its
    directory appeared, from the start of the command (``start``, a perf_counter reading)."""
    for ckpt in sorted((out / "checkpoints").glob("step-*")):
        elapsed = ckpt.stat().st_mtime - (time.time() - (time.perf_counter() - start))
        ckpt.rename(out / f"t{min(elapsed, cap):08.1f}-{ckpt.name}")
    return out


def run_dir(work: Path, prefix: str, variant: str, arch: str) -> Path:
    """An empty directory for one bertgpu run, named after its variant (and architecture, unless bert)."""
    name = variant if arch == "bert" else f"{arch}-{variant}"
    out = work / (prefix + "".join(c if c.isalnum() else "-" for c in name).strip("-"))
    shutil.rmtree(out, ignore_errors=True)
    return out


def run_bertgpu(work: Path, args, data: Path, variant: str, arch: str = "bert") -> Path:
    """``variant``: a recipe, optionally with more flags after a colon (``bert:--pack``)."""
    if args.own_schedule:
        return run_bertgpu_budget(work, args, data, variant, arch)
    recipe, _, extra = variant.partition(":")
    out = run_dir(work, "bertgpu-", variant, arch)
    flags = [
        "pretrain",
        *common.flags(data=data, model=args.model, arch=arch, no_nsp=True, recipe=recipe),
    ]
    flags += common.flags(nproc=2, batch_size=args.batch // 2, max_seq_length=args.seq, lr=args.lr, warmup=args.warmup,
                          device="cpu", log_every=10, seed=0, overwrite=True)  # fmt: skip
    flags += extra.split()  # last, so that a variant's flag wins over the race's (argparse keeps the last)
    bertgpu(*flags, "--out", work / "calibrate", "--steps", 40, "--save-every", 1000)
    last = common.log_records(work / "calibrate")[-1]
    steps = int(args.budget * last["steps_per_s"])
    print(
        f"bertgpu --arch {arch} --recipe {recipe} {extra}: {1000 / last['steps_per_s']:.0f} ms/step -> a schedule "
        f"of {steps} steps",
        flush=True,
    )
    save_every = max(1, int(args.every * last["steps_per_s"]))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*BERTGPU, *flags, *common.flags(out=out, steps=steps, save_every=save_every, keep=100000)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=args.budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the run saves a checkpoint and stops
        proc.wait()
    return timed_checkpoints(out, start, args.budget + 30)


def run_bertgpu_budget(work: Path, args, data: Path, variant: str, arch: str = "bert") -> Path:
    """bertgpu as a user runs it: `--time-budget` and the recipe's own learning rate and warmup."""
    recipe, _, extra = variant.partition(":")
    out = run_dir(work, "bertgpu-budget-", variant, arch)
    cmd = [
        *BERTGPU, "pretrain", "--data", data, "--model", args.model, "--arch", arch, "--no-nsp", "--recipe", recipe,
        "--nproc", "2", "--batch-size", args.batch // 2, "--max-seq-length", args.seq, "--device", "cpu",
        "--log-every", "10", "--seed", "0", "--time-budget", f"{args.budget:g}s",
        "--save-every-minutes", f"{args.every / 60:g}", "--keep", "100000", "--out", out,
        *extra.split(),  # last, so that a variant's flag wins over the race's (argparse keeps the last)
    ]  # fmt: skip
    start = time.perf_counter()
    proc = sh(*cmd, timeout=args.budget + 600)
    took = time.perf_counter() - start
    first = proc.stdout.splitlines()[0]
    print(
        f"bertgpu --recipe {recipe} {extra} --time-budget {args.budget:g}s: the command took {took:.0f} s", flush=True
    )
    print(f"  {first}", flush=True)
    (out / "stdout.txt").write_text(proc.stdout)
    return timed_checkpoints(out, start)
