"""The learning-rate sweep behind `--recipe fast`'s choice of peak learning rate per model size (BENCHMARKS.md).

For each size and each learning rate, a short `bertgpu pretrain --recipe fast --no-nsp` run of a fixed number of
steps (6% warmup, then linear decay to 0, as `--recipe fast` schedules), then the held-out masked-LM loss of its
last step (bertgpu's own evaluation on --eval-fraction held-out documents, the recipe's 30% masking). The
smaller sizes take more steps, the larger ones few: a step of `base` is ~20x one of `mini` on 2 CPU cores.
Results are appended to a JSON lines file as they come, so an interrupted sweep continues where it stopped.

    python benchmarks/lr_sweep.py --corpus DIR_OR_FILES... [--sizes tiny:300:1e-3,2e-3 ...]

A corpus: the Python documentation sources of Debian's python3.11-doc (`apt-get download python3.11-doc`,
`dpkg-deb -x python3.11-doc_*.deb DIR`, then DIR/usr/share/doc/python3.11/html/_sources).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import common
import corpora
from common import bertgpu

# size:steps:learning rates[:global batch] (--batch otherwise); the larger sizes run at batch 8, 4x cheaper a step,
# their rates compared there and brought to --batch by the square-root rule --recipe fast scales with
DEFAULT_SIZES = (
    "mini:120:2.5e-4,5e-4,1e-3,2e-3;tiny:300:1e-3,3e-3,8e-3;small:80:2.5e-4,5e-4,1e-3:8;"
    "medium:40:2.5e-4,5e-4:8;base:20:1.25e-4,2.5e-4:8"
)


def prepared(corpus: list[str], work: Path, vocab_size: int) -> Path:
    data = work / "data"
    if (data / "meta.json").exists() or (data / "bertgpu_data.json").exists() or data.is_dir():
        return data
    files = corpora.corpus_files(corpus)
    text = work / "corpus.txt"
    with open(text, "w", encoding="utf-8") as out:
        for f in files:
            out.write(Path(f).read_text(encoding="utf-8", errors="replace").strip() + "\n\n")
    bertgpu("vocab", text, "--size", vocab_size, "--out", work / "vocab.txt", "--overwrite")
    bertgpu("prepare", text, "--vocab", work / "vocab.txt", "--out", data, "--overwrite", "--workers", "2")
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="+", required=True)
    parser.add_argument("--work", default="/tmp/bertgpu-lr-sweep")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="size:steps:lr,lr;... (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="global batch (one process)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--warmup", type=float, default=0.06)
    parser.add_argument("--eval-instances", type=int, default=512)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = prepared(args.corpus, work, args.vocab_size)
    results = work / "results.jsonl"
    done = (
        {(r["size"], r["lr"]) for r in map(json.loads, results.read_text().splitlines())} if results.exists() else set()
    )
    for spec in args.sizes.split(";"):
        size, steps, lrs, *batch = spec.split(":")
        batch = int(batch[0]) if batch else args.batch
        for lr in map(float, lrs.split(",")):
            if (size, lr) in done:
                continue
            out = work / f"run-{size}-{lr:g}"
            start = time.perf_counter()
            bertgpu(
                "pretrain", "--data", data, "--model", size, "--out", out, "--overwrite",
                "--recipe", "fast", "--no-nsp", "--nproc", "1", "--batch-size", batch,
                "--max-seq-length", args.seq, "--lr", lr, "--warmup", args.warmup, "--steps", steps,
                "--save-every", 100000, "--log-every", max(1, int(steps) // 10), "--keep", 1, "--seed", "0",
                "--eval-fraction", "0.05", "--eval-instances", args.eval_instances, "--device", "cpu",
            )  # fmt: skip
            records = common.log_records(out)
            evals = [r["eval_mlm_loss"] for r in records if "eval_mlm_loss" in r]
            train = [r["mlm_loss"] for r in records if "mlm_loss" in r]
            row = {
                "size": size,
                "lr": lr,
                "steps": int(steps),
                "batch": batch,
                "warmup": args.warmup,
                "eval_mlm_loss": evals[-1],
                "train_mlm_loss": train[-1],
                "seconds": round(time.perf_counter() - start, 1),
            }
            print(json.dumps(row), flush=True)
            with open(results, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            for ckpt in out.glob("checkpoints/*"):  # the weights are not needed, the disk is
                subprocess.run(["rm", "-rf", str(ckpt)])
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    print(
        f"\n| size | steps x batch | lr: held-out MLM loss | best | best at batch {args.batch} (sqrt rule) |\n"
        "| --- | ---: | --- | --- | --- |"
    )
    for size in dict.fromkeys(r["size"] for r in rows):
        mine = [r for r in rows if r["size"] == size]
        best = min(mine, key=lambda r: r["eval_mlm_loss"])
        cells = ", ".join(f"{r['lr']:g}: {r['eval_mlm_loss']:.3f}" for r in sorted(mine, key=lambda r: r["lr"]))
        at = best["lr"] * (args.batch / best["batch"]) ** 0.5
        print(f"| {size} | {mine[0]['steps']} x {mine[0]['batch']} | {cells} | {best['lr']:g} | {at:.2g} |")


if __name__ == "__main__":
    main()
