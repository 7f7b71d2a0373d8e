"""Memory per process and step time of `bertgpu pretrain` under each way of spreading the model.

For each model preset and layout, runs `bertgpu pretrain` for a few steps on the same real data (the
Python language reference, tokenized with bert-base-uncased's vocab), with the same global batch and
sequence length, and reads from the run's log.jsonl the largest peak memory of any process (resident
set size on the CPU, the CUDA allocator's peak on a GPU) and the step time (the median after the
first step, which includes warm-up). The peer every row is compared with is plain DDP on the same
number of processes, in the same run::

    python benchmarks/parallel_memory.py                       # base and large, 2 processes, CPU
    python benchmarks/parallel_memory.py --models base --steps 3

Layouts: one process; ddp; fsdp (FSDP2: parameters, gradients and AdamW state sharded); tp 2
(tensor parallel: the encoder's matmuls split); ddp and fsdp with activation checkpointing; pp 2
(pipeline stages, GPipe and 1F1B, --pp-microbatches micro-batches), with the peak of each stage. All
processes run on one machine, so on a CPU they share its cores and memory: the step times say what
each layout costs in computation and communication, not what it gains on separate GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import corpora
from common import ROOT

LAYOUTS = {  # name: (processes, flags)
    "1 process": (1, ["--nproc", "1"]),
    "ddp": (2, ["--nproc", "2"]),
    "fsdp": (2, ["--nproc", "2", "--strategy", "fsdp"]),
    "tp 2": (2, ["--nproc", "2", "--tp", "2"]),
    "ddp + AC": (2, ["--nproc", "2", "--activation-checkpointing"]),
    "fsdp + AC": (2, ["--nproc", "2", "--strategy", "fsdp", "--activation-checkpointing"]),
    "pp 2 gpipe": (2, ["--nproc", "2", "--pp", "2", "--pp-schedule", "gpipe"]),
    "pp 2 1f1b": (2, ["--nproc", "2", "--pp", "2", "--pp-schedule", "1f1b"]),
}


def run_layout(
    data: Path,
    out: Path,
    model: str,
    layout: str,
    global_batch: int,
    seq: int,
    steps: int,
    device: str,
    microbatches: int = 4,
) -> dict:
    nproc, flags = LAYOUTS[layout]
    split = 2 if "--tp" in flags or "--pp" in flags else 1  # processes that train one batch together
    batch = global_batch // (nproc // split)  # per data-parallel rank: the same global batch for every layout
    if "--pp" in flags:
        flags = [*flags, "--pp-microbatches", str(microbatches)]
    cmd = [*common.BERTGPU, "pretrain"]
    cmd += common.flags(data=data, model=model, out=out, batch_size=batch, max_seq_length=seq, steps=steps, log_every=1,
                        save_every=steps + 1, device=device, loader_workers=0, overwrite=True, warmup=0)  # fmt: skip
    cmd += flags
    started = time.perf_counter()
    # glibc returns a freed block to the OS only above its mmap threshold, which it raises to 32 MiB as blocks
    # are freed: FSDP's per-layer gathers and frees would then stay in its cache and hide what sharding saves.
    # A fixed 64 KiB threshold makes the resident set follow the live tensors (on a GPU this is moot).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall_s": wall}
    records = common.log_records(out)
    step_times = [1 / r["steps_per_s"] for r in records[1:]] or [1 / records[0]["steps_per_s"]]
    return {
        "peak_memory_mb": max(r["peak_memory_mb"] for r in records),
        "per_stage_mb": [max(stage) for stage in zip(*(r["peak_memory_mb_per_stage"] for r in records))]
        if "peak_memory_mb_per_stage" in records[-1]
        else None,
        "step_s": statistics.median(step_times),
        "layout": records[-1]["layout"],
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["base", "large"])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--pp-microbatches", type=int, default=4, help="micro-batches of the pp layouts")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="parallel-memory-") as tmp:
        data = corpora.english_data(Path(tmp))
        for model in args.models:
            for layout in args.layouts:
                r = run_layout(
                    data,
                    Path(tmp) / "run",
                    model,
                    layout,
                    args.global_batch,
                    args.seq,
                    args.steps,
                    args.device,
                    args.pp_microbatches,
                )
                r.update(model=model, name=layout)
                results.append(r)
                print(f"  {model:6s} {layout:10s} {json.dumps(r)}", file=sys.stderr, flush=True)

    memory = "peak RSS" if args.device == "cpu" else "CUDA peak"
    print(
        f"\nbertgpu pretrain, global batch {args.global_batch} x {args.seq} tokens, fp32 AdamW, "
        f"{args.steps} steps, {args.device}"
    )
    print(f"| model | layout | {memory} per process (GiB) | per stage | vs ddp | step time (s) | vs ddp |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        rows = [r for r in results if r["model"] == model]
        ddp = next((r for r in rows if r["name"] == "ddp" and "error" not in r), None)
        for r in rows:
            if "error" in r:
                print(f"| {model} | {r['name']} | failed: {r['error']} | | | | |")
                continue
            mem_ratio = f"{r['peak_memory_mb'] / ddp['peak_memory_mb']:.2f}x" if ddp else "n/a"
            time_ratio = f"{r['step_s'] / ddp['step_s']:.2f}x" if ddp else "n/a"
            layout = r["layout"] + (", activation checkpointing" if "AC" in r["name"] else "")
            if "pp" in r["name"]:
                layout += f", {r['name'].split()[-1]}, {args.pp_microbatches} micro-batches"
            stages = " / ".join(f"{mb / 1024:.2f}" for mb in r["per_stage_mb"]) if r.get("per_stage_mb") else ""
            print(
                f"| {model} | {layout} | {r['peak_memory_mb'] / 1024:.2f} | {stages} | {mem_ratio} | "
                f"{r['step_s']:.2f} | {time_ratio} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
