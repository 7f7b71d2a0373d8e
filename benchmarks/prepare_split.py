"""`bertgpu prepare` on JSON Lines with sentence splitting, against the same text already one sentence per line.

The same real text in two forms, each prepared with its format's default splitting, with the real
bert-base-uncased vocab:

- ``jsonl-auto``: ``corpus.jsonl``, one record per document, ``{"id": ..., "topic": ..., "text": ...}``
  with the document's paragraphs joined by newlines, as Wikipedia and web dumps come; ``prepare``
  reads the JSON and splits every paragraph into sentences (``--split-sentences auto``, the default
  for JSON Lines).
- ``text-lines``: ``corpus.txt``, the same documents already split, by the same splitter, one
  sentence per line and a blank line between documents (the original format, ``lines``).
- ``limit``: the tokenizer alone (``tokenizers``' ``encode_batch_fast`` in batches of 1,000 lines) on
  the lines of ``corpus.txt``, as in ``prepare_throughput.py`` (``peers/tokenizer_limit.py``).

All three tokenize the same sentences, so they count the same tokens (checked), and ``jsonl-auto`` /
``text-lines`` is the cost of reading JSON and splitting sentences. The text is the Python language
reference as paragraphs (``samples.english_paragraphs``, 0.27 MB), repeated to the sizes asked
(``--size-mb``, MB of JSON Lines; the largest is the headline, the smaller shows whether memory
stays flat). Every measurement is a fresh subprocess, timed and sampled for memory by
``prepare_throughput.measure`` (peak RSS summed over the process tree).

Repeating a text would flatter a splitter that remembers its decisions (nupunkt, one of the
candidates compared in BENCHMARKS.md, decides from memory from the second repeat on), so the
script also times the splitter alone on the text once when it has seen none of it (``cold``, a
fresh process, as on a corpus that never repeats itself) and again (``warm``), beside the tokenizer
on the same sentences, and gives the cost of splitting in both cases. For sentencex the two agree.

    python benchmarks/prepare_split.py                      # 50 and 200 MB, 1 and 2 workers: ~10 min on 2 idle cores
    python benchmarks/prepare_split.py --repeat 2           # best of 2 runs each, for a shared machine
    python benchmarks/prepare_split.py --size-mb 5 --workers 1   # quick check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import common
import corpora
import prepare_throughput as pt  # its measure() runs and samples one pipeline
import reporting
from common import MB
from peers.tokenizer_limit import BATCH_LINES


def write_corpora(workdir: Path, size_mb: float) -> tuple[Path, Path]:
    """``corpus-N.jsonl`` (paragraphs) and ``corpus-N.txt`` (the same, one sentence per line), ``size_mb`` of JSON."""
    from bertgpu.data import samples
    from bertgpu.data.sentences import split_paragraph

    docs = samples.english_paragraphs()
    records = "".join(
        json.dumps({"id": i, "topic": f"python-reference-{i}", "text": "\n".join(doc)}, ensure_ascii=False) + "\n"
        for i, doc in enumerate(docs)
    ).encode("utf-8")
    text = "".join("\n".join(s for p in doc for s in split_paragraph(p)) + "\n\n" for doc in docs).encode("utf-8")
    repeat = math.ceil(size_mb * MB / len(records))
    paths = workdir / f"corpus-{size_mb:g}mb.jsonl", workdir / f"corpus-{size_mb:g}mb.txt"
    for path, unit in zip(paths, (records, text)):
        with open(path, "wb") as f:
            for _ in range(repeat):
                f.write(unit)
    return paths


def child_split() -> None:
    """The splitter alone on the paragraphs, cold then warm, and the tokenizer on the resulting sentences."""
    from bertgpu.data import samples, sentences
    from bertgpu.data.tokenizer import Tokenizer

    docs = samples.english_paragraphs()
    paragraphs = [p for doc in docs for p in doc]
    chars = sum(map(len, paragraphs))
    sentences.check_available()  # loads the model: not part of either pass
    result = {"chars": chars, "mb": sum(len(p.encode()) for p in paragraphs) / MB}
    for name in ("cold", "warm"):
        t0 = time.perf_counter()
        split = [s for p in paragraphs for s in sentences.split_paragraph(p)]
        result[f"{name}_s"] = time.perf_counter() - t0
    tokenizer = Tokenizer(str(corpora.bert_vocab()))
    tokenizer.encode_batch(split[:100])  # build it
    t0 = time.perf_counter()
    tokens = sum(
        len(ids)
        for start in range(0, len(split), BATCH_LINES)
        for ids in tokenizer.encode_batch(split[start : start + BATCH_LINES])
    )
    result["tokenize_s"] = time.perf_counter() - t0
    lines = [json.dumps({"text": "\n".join(doc)}) for doc in docs]
    t0 = time.perf_counter()
    for line in lines:
        json.loads(line)["text"].splitlines()
    result["json_s"] = time.perf_counter() - t0
    result.update(sentences=len(split), tokens=tokens, splitter=sentences.splitter_name())
    common.print_result(result)


def measure_split(repeat: int) -> dict:
    """Best (least time per pass) of ``repeat`` fresh processes of ``child_split``."""
    runs = []
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    for _ in range(repeat):
        runs.append(common.child_result([sys.executable, os.path.abspath(__file__), "--child-split"], env))
    best = dict(runs[0])
    for key in ("cold_s", "warm_s", "tokenize_s", "json_s"):
        best[key] = min(r[key] for r in runs)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_size_options(ap, [50, 200], "JSON Lines corpus sizes")
    common.add_repeat_options(ap)
    ap.add_argument("--child-split", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_split:
        child_split()
        return

    print(reporting.machine_line("tokenizers", "sentencex"))
    print(f"# load average at start: {reporting.load_average()}")
    workdir, tmp = common.work_directory(args.workdir, "prepare-split-bench-")
    sizes = sorted(args.size_mb)
    corpora = {s: write_corpora(workdir, s) for s in sizes}
    started = time.perf_counter()
    plan = []  # (label, pipeline, corpus, workers)
    for w in args.workers:
        jsonl, txt = corpora[sizes[-1]]
        plan += [("jsonl-auto", "prepare", jsonl, w), ("text-lines", "prepare", txt, w), ("limit", "limit", txt, w)]
        for s in sizes[:-1]:
            plan.append(("jsonl-auto", "prepare", corpora[s][0], w))

    def one(label: str, pipeline: str, corpus: Path, w: int) -> dict:
        r = {**pt.measure(pipeline, corpus, w, "1thr", workdir), "label": label}
        print(
            f"  {label:<11} {r['corpus_mb']:6.1f} MB  workers={w} {r['tokens_per_s']:>11,.0f} tokens/s  "
            f"{r['seconds']:7.1f} s  peak tree RSS {r['peak_tree_mb']:7.0f} MB",
            flush=True,
        )
        return r

    runs = common.round_robin(plan, args.repeat, one)
    split = measure_split(max(2, args.repeat))
    results = [common.best_of(config_runs) for config_runs in runs]
    print(
        f"\n# load average at end: {reporting.load_average()}; measurements took {time.perf_counter() - started:.0f} s"
    )
    print(
        "| pipeline | input | workers | tokens | s | tokens/s | all runs, tokens/s | CPU s, main / workers "
        "| peak RSS, tree (MB) | main / largest worker peak (MB) |"
    )
    print("|---" * 10 + "|")
    for r in results:
        kind = "JSON Lines" if r["label"] == "jsonl-auto" else "text"
        worker = f"{r['worker_peak_mb']:.0f}" if r["workers"] > 1 else "-"
        print(
            f"| {r['label']} | {r['corpus_mb']:.0f} MB {kind} | {r['workers']} | {r['tokens']:,} | {r['seconds']:.1f} "
            f"| {r['tokens_per_s']:,.0f} | {', '.join(f'{x / 1000:,.0f}k' for x in r['all_tokens_per_s'])} "
            f"| {r['main_cpu_s']:.1f} / {r['workers_cpu_s']:.1f} | {r['peak_tree_mb']:.0f} | {r['main_peak_mb']:.0f} / {worker} |"
        )

    def find(label: str, workers: int, corpus: Path) -> dict | None:
        mb = corpus.stat().st_size / MB
        return next(
            (r for r in results if (r["label"], r["workers"]) == (label, workers) and abs(r["corpus_mb"] - mb) < 1e-6),
            None,
        )

    print()
    jsonl, txt = corpora[sizes[-1]]
    for w in args.workers:
        auto, lines, limit = find("jsonl-auto", w, jsonl), find("text-lines", w, txt), find("limit", w, txt)
        same = len({r["tokens"] for r in (auto, lines, limit)}) == 1
        print(
            f"workers={w}: jsonl-auto / text-lines {auto['tokens_per_s'] / lines['tokens_per_s']:.1%} (splitting and "
            f"JSON cost {1 - auto['tokens_per_s'] / lines['tokens_per_s']:.1%}; aim: at most 25%); jsonl-auto / limit "
            f"{auto['tokens_per_s'] / limit['tokens_per_s']:.1%}; text-lines / limit "
            f"{lines['tokens_per_s'] / limit['tokens_per_s']:.1%}; same tokens in all three: {'yes' if same else 'NO'}"
        )
        if len(sizes) > 1:
            flat = reporting.flat_memory(find("jsonl-auto", w, corpora[sizes[0]][0]), auto, sizes)
            print(f"  jsonl-auto peak tree RSS, workers={w}: {flat}")
    mb = split["mb"]
    print(
        f"\nsplitter alone ({split['splitter']}) on {mb:.2f} MB of paragraphs -> {split['sentences']:,} sentences: "
        f"cold {mb / split['cold_s']:.1f} MB/s, warm {mb / split['warm_s']:.1f} MB/s; tokenizer on those sentences "
        f"{mb / split['tokenize_s']:.1f} MB/s; JSON decoding and paragraph split {mb / split['json_s']:.0f} MB/s"
    )
    for name in ("cold", "warm"):
        extra = (split[f"{name}_s"] + split["json_s"]) / split["tokenize_s"]
        print(
            f"  {name}: reading JSON and splitting add {extra:.1%} to the tokenizer's time -> at most "
            f"{1 / (1 + extra):.1%} of the one-sentence-per-line rate"
        )
    reporting.load_warning()
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "split": split}, indent=2, default=str) + "\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
