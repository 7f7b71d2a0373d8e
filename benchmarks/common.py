"""The benchmarks' shared harness, so that each script reads as its experiment. Running: ``flags``,
``sh``/``bertgpu``/``evaluate`` (a command from the checkout, stopped with its own words if it fails),
``run_limited`` (with a time limit, to a log), ``print_result``/``child_result`` (a measurement in a fresh
process), ``run_sampled`` (the same, its process tree's peak memory sampled), ``work_directory``. Measuring:
``round_robin``, ``best_of``, ``own_usage``, ``log_records``. Reporting is reporting.py's; the data and vocab
several benchmarks prepare, corpora.py's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing a benchmark runs downloads a model
ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(__file__).resolve().parent / "peers"
PY = sys.executable
BERTGPU = [PY, "-m", "bertgpu"]
MB = 10**6


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
    bertgpu("evaluate", "--model", model_dir, "--data", data, "--output", output, "--overwrite", *more, **kwargs)
    return json.loads(Path(output).read_text())


_forked: Any = None  # the multiprocessing context of fork_phases_from, once called


def fork_phases_from(preload: list[str]) -> None:
    """From now on ``run_limited`` forks each Python command from a fork server that has imported ``preload``
    (torch, transformers, bertgpu) once, instead of a fresh interpreter importing them again: on a CPU a tiny
    phase is 4-5 s of imports and 1 s of work. Not for a GPU check, whose phases each want a fresh process (a
    CUDA context and compile caches of their own)."""
    global _forked
    import multiprocessing

    _forked = multiprocessing.get_context("forkserver")
    _forked.set_forkserver_preload(preload)  # a module that is not installed is skipped


def _run_forked(argv: list[str], log: str, env: dict) -> None:
    """A fork server's child running ``python ARGV`` (``-m MODULE ...`` or ``SCRIPT ...``) as that interpreter
    would: its own session, the checkout as working directory, output to ``log``, the exit code its own."""
    import runpy

    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for std in (1, 2):
        os.dup2(fd, std)
    os.chdir(ROOT)
    os.environ.update(env)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv, sys.path[0] = argv, str(Path(argv[0]).parent)
        runpy.run_path(argv[0], run_name="__main__")


def run_limited(cmd: list[str], log: Path, limit: float, env: dict | None = None) -> tuple[int | None, float, str]:
    """Run ``cmd`` from the checkout (its output to ``log``) for at most ``limit`` seconds: (exit code or None
    if it ran out, seconds, output). It runs in a session of its own, so that running out ends its workers
    too (pytest-xdist's, bertgpu's), which would otherwise hold the GPU for the phases after it."""
    t0 = time.perf_counter()
    if _forked is not None and cmd[0] == PY:
        proc = _forked.Process(target=_run_forked, args=(cmd[1:], str(log), env or {}))
        proc.start()
        proc.join(limit)
        ran_out = proc.is_alive()
        if ran_out:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.join()
        return None if ran_out else proc.exitcode, time.perf_counter() - t0, log.read_text(errors="replace")
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
    from bertgpu.training.runlog import read_records

    return read_records(Path(run_dir) / "log.jsonl")


def work_directory(workdir: Path | None, prefix: str) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """``--workdir`` (created if missing), or a temporary directory; the second item is what to clean up."""
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix=prefix)
        return Path(tmp.name), tmp
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir, None
