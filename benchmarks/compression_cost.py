"""What each --grad-compression costs and saves: step time and bytes exchanged per step, against none.

    python benchmarks/compression_cost.py                       # small, 2 processes, CPU (gloo)
    python benchmarks/compression_cost.py --model base --steps 8

Runs `bertgpu pretrain` with 2 data-parallel processes (DDP) on the same real data (the Python
reference, bert-base-uncased's vocab), the same batch and seed, once per compression, and reads from
log.jsonl the median step time after PowerSGD's warm-up and the gradient bytes each process hands to
the all-reduce per step. The peer is `--grad-compression none` in the same run.

On one machine the processes talk through loopback: the bytes saved cost nearly nothing to send,
so the step times here show the compression's own compute (casts; PowerSGD's matmuls and
orthogonalisation) and, under gloo, PowerSGD's buckets exchanged one after the other.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import common
import corpora

KINDS = ("none", "fp16", "bf16", "powersgd")


def run(data: Path, out: Path, kind: str, args: argparse.Namespace) -> dict:
    warmup = 2
    common.bertgpu(
        "pretrain",
        *common.flags(data=data, model=args.model, out=out, nproc=2, batch_size=args.batch_size, steps=args.steps,
                      log_every=1, save_every=args.steps + 1, device="cpu", loader_workers=0, overwrite=True,
                      grad_compression=kind, powersgd_warmup=warmup, powersgd_rank=args.rank),
    )  # fmt: skip
    records = common.log_records(out)
    after = records[warmup + 1 :]  # PowerSGD compresses from step warmup + 1; the first steps also warm up caches
    return {
        "step_s": statistics.median(1 / r["steps_per_s"] for r in after),
        "bytes": after[-1]["comm_bytes_per_step"],
        "loss": records[-1]["loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, round robin; the fastest is kept")
    args = parser.parse_args()

    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="compression-") as tmp:
        data = corpora.english_data(Path(tmp))
        for _ in range(args.repeat):
            for kind in KINDS:
                r = run(data, Path(tmp) / "run", kind, args)
                if kind not in best or r["step_s"] < best[kind]["step_s"]:
                    best[kind] = r
                print(f"  {kind}: {r}", file=sys.stderr, flush=True)
    none = best["none"]
    print(
        f"\n`{args.model}`, 2 processes (DDP, gloo, one machine), batch {args.batch_size} per process x 128 tokens, "
        f"median step after warm-up, best of {args.repeat}"
    )
    print("| --grad-compression | MiB per step per process | vs none | step time (s) | vs none | loss at the end |")
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        r = best[kind]
        print(
            f"| {kind}{f' (rank {args.rank})' if kind == 'powersgd' else ''} | {r['bytes'] / 2**20:.2f} | "
            f"{r['bytes'] / none['bytes']:.3f}x | {r['step_s']:.3f} | {r['step_s'] / none['step_s']:.2f}x | "
            f"{r['loss']:.3f} |"
        )


if __name__ == "__main__":
    main()
