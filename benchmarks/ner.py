"""Token classification benchmark: People's Daily NER (PER, LOC, ORG per character; benchmarks/peoples_daily.py).

    .venv/bin/pip install -e '.[bench]'     # transformers and accelerate, which Trainer needs; bertgpu does not
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/ner.py [--out bench-ner] [--budget 10m]

1. **Pretraining pays off on NER**: a tiny BERT and a tiny ModernBERT pretrained for --budget each with
   `bertgpu pretrain --recipe fast --wwm` on People's Daily 1998-01 prepared with `--zh-wwm` (jieba's word
   boundaries; every validation and test sentence taken out of the corpus), with a vocab of --vocab-size trained on
   that corpus (8,000, as make demo does; one --out per vocab: the data and checkpoints there are reused); each
   fine-tuned on the training sentences from its pretrained weights and from random weights, 3 seeds, entity F1 on
   held-out sentences (conlleval's counting).
2. **bertgpu against transformers' Trainer**: the pretrained tiny BERT fine-tuned by both with the same data,
   epochs, rate, warmup, batch, weight decay, seed and length; best epoch by validation entity F1 on both sides;
   entity F1 counted by the same scorer; examples/s of the training epochs (bertgpu: its step rates; Trainer: a
   callback around each epoch).

Prints markdown tables (BENCHMARKS.md holds a run) with the load average after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import common
import reporting
from common import PEERS, PY, sh

ENV = {"TOKENIZERS_PARALLELISM": "false"}
VOCAB = Path(sys.prefix) / "share" / "bertgpu-test-data" / "bert-base-chinese-vocab.txt"


def bertgpu(*args: object):
    return common.bertgpu(*args, env=ENV)


def files(work: Path, train: int, val: int, test: int, seed: int) -> tuple[Path, Path, Path, Path]:
    """train/val/test CoNLL files and a pretraining corpus without the val and test sentences."""
    sys.path.insert(0, str(Path(__file__).parent))
    import peoples_daily

    from bertgpu.data import samples

    pool = peoples_daily.read()
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    parts = {"test": order[:test], "val": order[test : test + val], "train": order[test + val : test + val + train]}
    paths = {}
    for name, indices in parts.items():
        paths[name] = work / f"{name}.conll"
        paths[name].write_text(peoples_daily.conll([pool[i] for i in sorted(indices)]), encoding="utf-8")
    held = ["".join(pool[i][0]) for i in parts["test"] + parts["val"]]
    docs = []
    for doc in samples._chinese_documents(None):
        kept = [s for s in doc if not any(h in s or s.strip() in h for h in held)]
        if len(kept) >= 2:
            docs.append(kept)
    corpus = samples._write(docs, work / "corpus.txt")
    print(f"data: {train} / {val} / {test} sentences; corpus {corpus.stat().st_size / 1e6:.1f} MB without them")
    return paths["train"], paths["val"], paths["test"], corpus


def pretrained(work: Path, corpus: Path, arch: str, budget: str, size: str = "tiny") -> Path:
    data = work / "data"
    if not data.exists():
        bertgpu("prepare", corpus, "--vocab", VOCAB, "--zh-wwm", "--out", data, "--workers", 2)
    out = work / (f"pretrain-{arch}" if size == "tiny" else f"pretrain-{arch}-{size}")
    if (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):  # pretrained before: fine-tune again
        return sorted((out / "checkpoints").iterdir())[-1]
    proc = bertgpu(
        "pretrain",
        *common.flags(data=data, model=size, arch=arch, out=out, device="cpu", recipe="fast", wwm=True,
                      no_nsp=True, time_budget=budget, eval_fraction=0.02, overwrite=True, log_every=100),
    )  # fmt: skip
    print(f"pretraining {arch}: {proc.stdout.strip().splitlines()[-6:]}", flush=True)
    return sorted((out / "checkpoints").iterdir())[-1]


def random_start(work: Path, arch: str, size: str = "tiny") -> Path:
    """The same model with random weights (seed 0), as a directory `finetune --model` reads."""
    import torch

    from bertgpu.checkpoints.hf_dir import save_pretrained
    from bertgpu.data.tokenizer import load_vocab
    from bertgpu.models import architectures

    config = architectures.preset(arch, size, len(load_vocab(VOCAB)), load_vocab(VOCAB))
    torch.manual_seed(0)
    model = architectures.pretraining_model(config)
    name = f"random-{arch}" if size == "tiny" else f"random-{arch}-{size}"
    return save_pretrained(model, config, work / name, vocab_path=VOCAB, do_lower_case=True)


def run_bertgpu(name: str, model: Path, data: tuple[Path, Path, Path], out: Path, hp: dict) -> dict:
    train, val, test = data
    start = time.perf_counter()
    bertgpu(
        "finetune",
        *common.flags(model=model, train=train, eval=val, out=out, overwrite=True, device="cpu", precision="fp32",
                      epochs=hp["epochs"], lr=hp["lr"], warmup=hp["warmup"], batch_size=hp["batch_size"],
                      max_seq_length=hp["max_seq_length"], seed=hp["seed"], weight_decay=hp["weight_decay"],
                      log_every=1),
    )  # fmt: skip
    wall = time.perf_counter() - start
    result = common.evaluate(out / "best", test, out / "test.json", "--device", "cpu", env=ENV)
    steps = [r for r in common.log_records(out) if r.get("steps_per_s")]
    train_s = sum(1 / r["steps_per_s"] for r in steps)
    examples = sum(r["seq_per_s"] / r["steps_per_s"] for r in steps)
    best_epoch = json.loads((out / "metrics.json").read_text())["best_epoch"]
    return {"name": name, "wall_s": wall, "load": os.getloadavg()[0], "train_s": train_s,
            "examples_per_s": examples / train_s, "f1": result["f1"], "precision": result["precision"],
            "recall": result["recall"], "best_epoch": best_epoch}  # fmt: skip


def run_trainer(name: str, model: Path, data: tuple[Path, Path, Path], out: Path, hp: dict) -> dict:
    spec = {
        "model": str(model),
        "train": str(data[0]),
        "val": str(data[1]),
        "test": str(data[2]),
        "out": str(out),
        **hp,
    }
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sh(PY, PEERS / "hf_trainer_ner.py", json.dumps(spec), env=ENV)
    wall = time.perf_counter() - start
    return {"name": name, "wall_s": wall, "load": os.getloadavg()[0], **json.loads((out / "test.json").read_text())}


def table(title: str, rows: list[dict]) -> str:
    columns = ("run", "entity F1", "precision", "recall", "examples/s", "training", "best epoch", "load after")
    cells = [(r["name"], f"{r['f1']:.4f}", f"{r['precision']:.4f}", f"{r['recall']:.4f}", f"{r['examples_per_s']:.1f}",
              f"{r['train_s']:.0f} s", r["best_epoch"], f"{r['load']:.1f}") for r in rows]  # fmt: skip
    return "\n".join([f"**{title}**", "", *reporting.markdown_table(columns, cells, align="lrrrrrrr")])


def means(rows: list[dict]) -> str:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["name"].rsplit(", seed", 1)[0], []).append(r)
    cells = [(name, len(g), f"{statistics.mean(r['f1'] for r in g):.4f}",
              f"{statistics.pstdev(r['f1'] for r in g):.4f}", f"{statistics.mean(r['examples_per_s'] for r in g):.1f}")
             for name, g in groups.items()]  # fmt: skip
    return "\n".join(
        reporting.markdown_table(("run", "seeds", "mean entity F1", "std", "mean examples/s"), cells, align="lrrrr")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-ner", help="working directory")
    parser.add_argument("--train", type=int, default=3000)
    parser.add_argument("--val", type=int, default=300)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--budget", default="10m", help="pretraining time of each architecture")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--size", default="tiny", help="the preset pretrained and fine-tuned (tiny or mini)")
    parser.add_argument("--lr", type=float, default=0, help="both sides' (default: finetune's for the size's width)")
    parser.add_argument("--skip", choices=["modernbert", "trainer", "payoff"], action="append", default=[])
    parser.add_argument("--vocab-size", type=int, default=8000, help="a vocab of this size trained on the corpus "
                        "(`bertgpu vocab`, as make demo does; 0: bert-base-chinese's 21,128)")  # fmt: skip
    args = parser.parse_args()
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    train, val, test, corpus = files(work, args.train, args.val, args.test, seed=0)
    if args.vocab_size:
        global VOCAB
        VOCAB = work / f"vocab-{args.vocab_size}.txt"
        if not VOCAB.exists():
            bertgpu("vocab", corpus, "--size", args.vocab_size, "--out", VOCAB)
    data = (train, val, test)
    from bertgpu.models.config import PRESETS
    from bertgpu.training.batch import finetune_lr

    lr = args.lr or finetune_lr(PRESETS[args.size][1])  # (layers, hidden, heads): tiny 7.2e-4, mini 1.8e-4
    hp = dict(epochs=args.epochs, lr=lr, warmup=0.1, batch_size=16, max_seq_length=128, weight_decay=0.01)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"settings: {hp}, seeds {seeds}", flush=True)
    rows, vs = [], []
    archs = ["bert"] + ["modernbert"] * ("modernbert" not in args.skip)
    for arch in archs:
        start = pretrained(work, corpus, arch, args.budget, args.size)
        starts = {f"{arch} {args.size}, pretrained {args.budget}": start}
        if "payoff" not in args.skip:
            starts[f"{arch} {args.size}, random weights"] = random_start(work, arch, args.size)
        for label, model in starts.items():
            for seed in seeds:
                out = work / "ft" / f"{label.split(',')[0].replace(' ', '-')}-{label.split(', ')[1][:6]}-{seed}"
                row = run_bertgpu(f"bertgpu, {label}, seed {seed}", model, data, out, {**hp, "seed": seed})
                rows.append(row)
                print(row, flush=True)
                if arch == "bert" and "pretrained" in label and "trainer" not in args.skip:
                    peer = run_trainer(f"Trainer, {label}, seed {seed}", model, data, work / "trainer" / str(seed),
                                       {**hp, "seed": seed})  # fmt: skip
                    vs += [row, peer]
                    print(peer, flush=True)
    print("\n" + table(f"People's Daily NER, {args.train} training sentences, {hp}", rows + vs[1::2]) + "\n")
    print(means(rows + vs[1::2]) + "\n", flush=True)


if __name__ == "__main__":
    main()
