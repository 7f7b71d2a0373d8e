"""`bertgpu prepare` throughput and peak memory against two reference pipelines and the tokenizer's own limit.

Four pipelines tokenize the same real corpus (the Python language reference, ``samples.write_english_corpus``,
repeated to the requested sizes), each with the real bert-base-uncased vocab:

- ``prepare``: ``bertgpu.data.shards.prepare`` (what ``bertgpu prepare`` runs), writing its shards.
- ``reference``: the issue's "transformers' BertTokenizerFast + per-document Python instance creation",
  taken literally: a port of google-research/bert's create_pretraining_data.py with transformers'
  ``BertTokenizerFast`` in place of its own tokenizer and nothing else changed (``peers/create_pretraining_data.py``:
  tokenize every line, shuffle the documents, ``dupe_factor`` rounds of instance creation and masking, ids
  and padding, all in memory, no TensorFlow), one process per input part as the original is parallelised
  (``peers/prepare_references.py``). ``--reference-dupe-factor``: a row for 1, the least it can do, and one
  for 10, the original's default and its way to vary the masks across epochs, which bertgpu draws afresh
  every epoch instead. Each dupe factor is a row with its own verdict on the issue's target (prepare >= 10x
  at 2 workers).
- ``reference-lean``: the same kind of pipeline made as cheap as it can be, to give the reference every
  advantage: one batched ``BertTokenizerFast`` call per document, per-document instance creation without
  masking, ids or padding (``peers/prepare_references.py``). It is the cheapest reference of this shape we
  could write, not the issue's, so its ratio is printed without a target.
- ``limit``: the physical limit of this step, the tokenizer itself: ``tokenizers``' ``encode_batch_fast``
  on the same non-empty lines in batches of 1,000 (the batch size ``prepare`` uses; 100 to 2,000 lines per
  batch tokenize within 1% of each other, 10,000 about 3% slower and 20,000 about 8% slower, so this is the
  tokenizer at its fastest), nothing else done (``peers/tokenizer_limit.py``).

Both references are slow, so they run on a prefix of the largest corpus (``--reference-mb``, up to the first
document boundary past it) and are reported as rates; their tokens are the word pieces of the text read
(counted once, whatever the dupe factor; special tokens excluded), as for the other rows.

Threads: ``tokenizers`` runs a batch on its own Rayon thread pool unless TOKENIZERS_PARALLELISM=false.
Rows marked ``1 thr`` set it to false (one core per worker; ``prepare``'s pool workers always do);
rows marked ``rayon`` leave it on (the default when the variable is unset, so what ``bertgpu prepare
--workers 1`` does on a plain shell: the one process tokenizes on every core).

Every measurement runs in a fresh subprocess. Its wall time is taken inside it, around the pipeline
(tokenizer construction and worker start-up included). Peak RSS is the peak of the sum of VmRSS over
the subprocess and all its descendants (pool workers included), sampled every 50 ms from /proc by
this script; shared pages (libraries) count once per process, so the sum errs high. Beside it: the
peak of the main process (its VmHWM, read by itself at the end; ``ru_maxrss`` would not do, Linux
carries it over exec from the parent) and of the largest worker (VmHWM, sampled).

    python benchmarks/prepare_throughput.py                    # 50 and 200 MB: ~8 min on 2 idle cores
    python benchmarks/prepare_throughput.py --repeat 3         # best of 3 runs each, for a shared machine
    python benchmarks/prepare_throughput.py --size-mb 5 20 --reference-mb 5   # quick check (~1.5 min)

Rates are wall-clock tokens/s (tokens = word pieces written, special tokens excluded); the table also
gives CPU seconds and tokens per CPU second, which a busy machine disturbs less.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import common
import corpora
import reporting
from common import MB


def child_main(args: argparse.Namespace) -> None:
    """One measurement, in this fresh process: the pipeline's result with the CPU time and peak memory it took."""
    from peers.prepare_references import run_reference, run_reference_lean
    from peers.tokenizer_limit import run_limit

    (workers,) = args.workers
    vocab = str(corpora.bert_vocab())
    t0 = time.perf_counter()
    if args.child == "prepare":
        from bertgpu.data.shard_writer import prepare

        meta = prepare([args.corpus], vocab, args.out, workers=workers, overwrite=True, progress=False)
        result = {"tokens": meta["tokens"], "seconds": time.perf_counter() - t0}
    elif args.child == "limit":
        result = run_limit(args.corpus, workers, vocab)
    elif args.child == "reference":
        result = run_reference(args.corpus, workers, args.max_bytes, args.reference_dupe_factor[0], vocab)
    else:
        result = run_reference_lean(args.corpus, workers, args.max_bytes, vocab)
    common.print_result({**result, **common.own_usage()})


def measure(
    pipeline: str, corpus: Path, workers: int, threads: str, workdir: Path, max_bytes: int = 0, dupe_factor: int = 1
) -> dict:
    """Run one pipeline in a fresh subprocess, sampling its process tree's RSS every 50 ms."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true" if threads == "rayon" else "false")
    out = workdir / "prepared"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", pipeline, "--corpus", str(corpus), "--workers",
           str(workers), "--out", str(out), "--max-bytes", str(max_bytes), "--reference-dupe-factor", str(dupe_factor)]  # fmt: skip
    result = common.run_sampled(cmd, env, f"{pipeline} (workers={workers})")
    shutil.rmtree(out, ignore_errors=True)
    result.update(
        pipeline=pipeline,
        workers=workers,
        threads=threads,
        corpus_mb=(max_bytes if pipeline.startswith("reference") else corpus.stat().st_size) / MB,
    )
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    result["tokens_per_cpu_s"] = result["tokens"] / (result["main_cpu_s"] + result["workers_cpu_s"])
    return result


def make_corpus(workdir: Path, size_mb: float) -> Path:
    from bertgpu.data import samples

    one = samples.write_english_corpus(workdir / "one.txt", repeat=1).stat().st_size
    repeat = math.ceil(size_mb * MB / one)
    return samples.write_english_corpus(workdir / f"corpus-{size_mb:g}mb.txt", repeat=repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, nargs="+", default=[50, 200],
                    help="corpus sizes (MB = 10^6 bytes) for prepare; the largest is the headline (default 50 200)")  # fmt: skip
    ap.add_argument(
        "--reference-mb", type=float, default=20, help="prefix of the largest corpus the two references run on"
    )
    ap.add_argument("--reference-dupe-factor", type=int, nargs="+", default=[1, 10],
                    help="dupe_factor(s) of the create_pretraining_data.py port, a row each (the rounds of instance "
                    "creation and masking over the corpus): 1, the least work it can do, and 10, the original's "
                    "default (its way to vary the masks across epochs; bertgpu needs none, it masks afresh each "
                    "epoch). Default: 1 10")  # fmt: skip
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-rayon", action="store_true",
                    help="skip the extra workers=1 rows with tokenizers' thread pool on (TOKENIZERS_PARALLELISM=true)")  # fmt: skip
    common.add_repeat_options(ap)
    # internal: one measurement
    ap.add_argument("--child", choices=["prepare", "limit", "reference", "reference-lean"], help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--max-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return

    print(reporting.machine_line("torch", "transformers", "tokenizers"))
    print(f"# load average at start: {reporting.load_average()}")
    workdir, tmp = common.work_directory(args.workdir, "prepare-bench-")
    sizes = sorted(args.size_mb)
    corpora = {s: make_corpus(workdir, s) for s in sizes}
    big = corpora[sizes[-1]]
    started = time.perf_counter()
    # The references first (a prefix of the largest corpus), then prepare and the limit side by side.
    ref_bytes = int(min(args.reference_mb, sizes[-1]) * MB)
    dupes = sorted(set(args.reference_dupe_factor))
    plan = [("reference", big, w, "1thr", ref_bytes, d) for d in dupes for w in args.workers]
    plan += [("reference-lean", big, w, "1thr", ref_bytes, 1) for w in args.workers]
    for s in sizes:
        for w in args.workers:
            plan.append(("prepare", corpora[s], w, "1thr", 0, 1))
            if s == sizes[-1]:
                plan.append(("limit", corpora[s], w, "1thr", 0, 1))
    if not args.no_rayon and 1 in args.workers:
        # workers=1 with tokenizers' own threads: on the smallest corpus (the rate does not depend on size)
        plan += [("prepare", corpora[sizes[0]], 1, "rayon", 0, 1), ("limit", corpora[sizes[0]], 1, "rayon", 0, 1)]

    def one(pipeline: str, corpus: Path, w: int, threads: str, max_bytes: int, dupe: int) -> dict:
        r = measure(pipeline, corpus, w, threads, workdir, max_bytes, dupe)
        if pipeline == "reference":
            r["pipeline"] = f"reference, dupe {dupe}"
        print(
            f"  {r['pipeline']:<18} {r['corpus_mb']:6.1f} MB  workers={r['workers']} {r['threads']:<5} "
            f"{r['tokens_per_s']:>11,.0f} tokens/s  {r['seconds']:7.1f} s  peak tree RSS {r['peak_tree_mb']:7.0f} MB",
            flush=True,
        )
        return r

    results = [common.best_of(config_runs) for config_runs in common.round_robin(plan, args.repeat, one)]
    print(
        f"\n# load average at end: {reporting.load_average()}; measurements took {time.perf_counter() - started:.0f} s"
    )
    columns = ["pipeline", "corpus", "workers", "tokenizers threads", "tokens", "s", "tokens/s", "all runs, tokens/s",
               "CPU s, main / workers", "tokens per CPU s", "peak RSS, tree (MB)", "main / largest worker peak (MB)"]  # fmt: skip
    rows = []
    for r in results:
        corpus = f"{r['corpus_mb']:.0f} MB" + (" prefix" if r["pipeline"].startswith("reference") else "")
        threads = "rayon (default)" if r["threads"] == "rayon" else "1 per worker"
        worker = f"{r['worker_peak_mb']:.0f}" if r["workers"] > 1 else "-"
        all_runs = ", ".join(f"{x / 1000:,.0f}k" for x in r["all_tokens_per_s"])
        rows.append((r["pipeline"], corpus, r["workers"], threads, f"{r['tokens']:,}", f"{r['seconds']:.1f}",
                     f"{r['tokens_per_s']:,.0f}", all_runs, f"{r['main_cpu_s']:.1f} / {r['workers_cpu_s']:.1f}",
                     f"{r['tokens_per_cpu_s']:,.0f}", f"{r['peak_tree_mb']:.0f}", f"{r['main_peak_mb']:.0f} / {worker}"))  # fmt: skip
    print("\n".join(reporting.markdown_table(columns, rows, compact=True)))

    def find(pipeline: str, workers: int, threads: str = "1thr", corpus: Path | None = None) -> dict | None:
        mb = None if corpus is None else corpus.stat().st_size / MB
        for r in results:
            if (r["pipeline"], r["workers"], r["threads"]) == (pipeline, workers, threads) and (
                mb is None or abs(r["corpus_mb"] - mb) < 1e-6
            ):
                return r
        return None

    print()
    for w in args.workers:
        verdicts(w, find, big, dupes, ref_bytes)
    ours, lim = find("prepare", 1, "rayon"), find("limit", 1, "rayon")
    if ours and lim:
        print(f"prepare / limit, workers=1 with rayon threads: {ours['tokens_per_s'] / lim['tokens_per_s']:.1%}")
    if len(sizes) > 1:
        for w in args.workers:
            small, large = find("prepare", w, corpus=corpora[sizes[0]]), find("prepare", w, corpus=big)
            print(f"prepare peak tree RSS, workers={w}: {reporting.flat_memory(small, large, sizes)}")
    reporting.load_warning()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()


def verdicts(w: int, find, big: Path, dupes: list[int], ref_bytes: int) -> None:
    """At ``w`` workers: prepare against each reference (the issue's target at 2 workers) and against the limit,
    and the most the limit would allow against each reference."""
    ours, lim = find("prepare", w, corpus=big), find("limit", w, corpus=big)
    refs = {f"reference, dupe {d}": find(f"reference, dupe {d}", w) for d in dupes}
    ref, lean = refs[f"reference, dupe {dupes[0]}"], find("reference-lean", w)
    for name, r in refs.items():
        if ours and r:
            ratio = ours["tokens_per_s"] / r["tokens_per_s"]
            verdict = f" (target >= 10x: {'met' if ratio >= 10 else 'MISSED'})" if w == 2 else ""
            print(
                f"prepare / {name}, workers={w}: {ratio:.1f}x{verdict}; reference (create_pretraining_data.py "
                f"port, dupe_factor {r['dupe_factor']}) rate measured on the first {ref_bytes / MB:.0f} MB"
            )
    if ours and lean:
        same = "" if not ref or ref["tokens"] == lean["tokens"] else (
            f"; token counts differ: reference {ref['tokens']} vs lean {lean['tokens']}")  # fmt: skip
        print(
            f"prepare / reference-lean, workers={w}: {ours['tokens_per_s'] / lean['tokens_per_s']:.1f}x "
            f"(the lean variant: one batched call per document, no masking; no target){same}"
        )
    if ours and lim:
        ratio = ours["tokens_per_s"] / lim["tokens_per_s"]
        same = "" if ours["tokens"] == lim["tokens"] else f"; token counts differ: {ours['tokens']} vs {lim['tokens']}"
        print(f"prepare / limit, workers={w}: {ratio:.1%} (target >= 80%: {'met' if ratio >= 0.8 else 'MISSED'}{same})")
    for name, r in (*refs.items(), ("reference-lean", lean)):
        if r and lim:
            print(
                f"  ceiling for prepare / {name} at workers={w} (limit / {name}): "
                f"{lim['tokens_per_s'] / r['tokens_per_s']:.1f}x"
            )


if __name__ == "__main__":
    main()
