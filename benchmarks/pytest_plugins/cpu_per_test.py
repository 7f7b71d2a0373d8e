"""A pytest plugin that says where the suite's CPU goes, test by test (issue 39: the suite's time on 2 cores).

A test's own process is the least of it: most tests start workers (forked by fork servers, or fresh interpreters
under torchrun) that no per-process counter of the test sees. So this counts two things before and after each test:

- ``cpu``: the CPU time of the test run's process tree: every live process under the root (its own and its reaped
  children's time, from /proc/PID/stat) plus what the root has reaped. Other people's work on the machine is left
  out, so this is the figure to compare on a shared machine. Processes orphaned by a kill (a torchrun's workers when
  its group is killed) would be reaped by init and lost; run pytest through this file, which makes itself their
  subreaper and reaps them, so that they count too:

      .venv/bin/python benchmarks/pytest_plugins/cpu_per_test.py -q -n 0 tests/test_resume.py

  which also sets OMP_NUM_THREADS=1 where it is unset: each of the suite's two xdist workers has one core's share
  (tests/conftest.py), and torch's threads would otherwise spin-wait for each other on a busy machine, which
  triples some tests' CPU.

- ``busy``: the machine's busy time (/proc/stat, every core, every process): what the test costs the machine,
  others' work included; meaningful on an otherwise idle machine only.

The plugin alone (``PYTHONPATH=benchmarks/pytest_plugins .venv/bin/python -m pytest -q -n 0 -p cpu_per_test``)
counts from the pytest process. Run serially (``-n 0``), or the figures mix tests together. Each test appends
``{"test", "cpu", "busy", "wall"}`` (core-seconds, seconds; a module's fixtures count in its first test) to
CPU_PER_TEST (default ``cpu-per-test.jsonl`` in the working directory), and the end of the run prints the heaviest
tests and modules.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

OUT = os.environ.get("CPU_PER_TEST", "cpu-per-test.jsonl")
ROOT = int(os.environ.get("CPU_PER_TEST_ROOT", os.getpid()))
_TICK = os.sysconf("SC_CLK_TCK")
_rows: list[dict] = []


def _busy_seconds() -> float:
    """Core-seconds the machine has spent busy since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        # user nice system idle iowait irq softirq steal; guest time that follows is counted in user and nice already
        ticks = [int(x) for x in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) / _TICK


def _tree_seconds(root: int = ROOT) -> float:
    """CPU seconds of ``root`` and its descendants: each live one's utime+stime plus cutime+cstime (its reaped
    children's, which a process passes on to its parent when it is reaped itself), so that each is counted once."""
    parent, own = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile: its parent's cutime has it, or will
            continue
        pid = int(name)
        parent[pid] = int(fields[1])
        own[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    children = collections.defaultdict(list)
    for pid, ppid in parent.items():
        children[ppid].append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += own.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / _TICK


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    tree, busy, start = _tree_seconds(), _busy_seconds(), time.monotonic()
    yield
    row = {
        "test": item.nodeid,
        "cpu": round(_tree_seconds() - tree, 2),
        "busy": round(_busy_seconds() - busy, 2),
        "wall": round(time.monotonic() - start, 2),
    }
    _rows.append(row)
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    write = terminalreporter.write_line
    cpu, busy = sum(r["cpu"] for r in _rows), sum(r["busy"] for r in _rows)
    write(f"CPU per test: {cpu:.0f} core-seconds of the test run's processes, machine busy {busy:.0f} ({OUT})")
    for row in sorted(_rows, key=lambda r: -r["cpu"])[:15]:
        write(f"{row['cpu']:7.1f} core-s {row['busy']:7.1f} busy {row['wall']:6.1f} s  {row['test']}")
    modules: collections.Counter = collections.Counter()
    for row in _rows:
        modules[row["test"].split("::")[0]] += row["cpu"]
    for module, cpu in modules.most_common(10):
        write(f"{cpu:7.1f} core-s  {module}")


def _main(argv: list[str]) -> int:
    """pytest ARGV with this plugin, as a child of this process, which reaps every process orphaned under it."""
    import ctypes
    import resource
    import subprocess
    import sys

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    here = os.path.dirname(os.path.abspath(__file__))
    env = {"OMP_NUM_THREADS": "1", **os.environ, "CPU_PER_TEST_ROOT": str(os.getpid())}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    start = time.monotonic()
    pytest_proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "cpu_per_test", *argv], env=env)
    code = None
    while True:  # pytest, and the orphans given to this process, until none is left
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == pytest_proc.pid:
            code = os.waitstatus_to_exitcode(status)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"cpu_per_test: {used.ru_utime + used.ru_stime:.1f} core-seconds in all, {time.monotonic() - start:.1f} s")
    return code if code is not None else 1


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
