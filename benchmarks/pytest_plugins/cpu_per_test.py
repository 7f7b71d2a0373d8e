"""A pytest plugin that says where the suite's CPU goes, test by test (issue 39: the suite's time on 2 cores).

A test's own process is the least of it: most tests start workers (forked by fork servers, or fresh interpreters
under torchrun) that no per-process counter of the test sees. So this reads the machine's busy time
(/proc/stat, every core, every process) before and after each test. Run the suite serially on an otherwise idle
machine, or the figures mix tests (and other work) together:

    PYTHONPATH=benchmarks/pytest_plugins .venv/bin/python -m pytest -q -n 0 -p cpu_per_test

Each test appends ``{"test", "cpu", "wall"}`` (core-seconds, seconds; a module's fixtures count in its first test)
to CPU_PER_TEST (default ``cpu-per-test.jsonl`` in the working directory), and the end of the run prints the
heaviest tests and modules.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

OUT = os.environ.get("CPU_PER_TEST", "cpu-per-test.jsonl")
_rows: list[dict] = []


def _busy_seconds() -> float:
    """Core-seconds the machine has spent busy since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        # user nice system idle iowait irq softirq steal; guest time that follows is counted in user and nice already
        ticks = [int(x) for x in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    busy, start = _busy_seconds(), time.monotonic()
    yield
    row = {"test": item.nodeid, "cpu": round(_busy_seconds() - busy, 2), "wall": round(time.monotonic() - start, 2)}
    _rows.append(row)
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    write = terminalreporter.write_line
    write(f"CPU per test: {sum(r['cpu'] for r in _rows):.0f} core-seconds in all ({OUT})")
    for row in sorted(_rows, key=lambda r: -r["cpu"])[:15]:
        write(f"{row['cpu']:7.1f} core-s {row['wall']:6.1f} s  {row['test']}")
    modules: collections.Counter = collections.Counter()
    for row in _rows:
        modules[row["test"].split("::")[0]] += row["cpu"]
    for module, cpu in modules.most_common(10):
        write(f"{cpu:7.1f} core-s  {module}")
