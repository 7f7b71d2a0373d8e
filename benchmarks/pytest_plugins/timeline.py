"""Each test's xdist worker, start and stop (wall clock), appended as JSON lines to $TIMELINE; run as a script, the
busy time of each worker and the wall seconds of the heaviest modules. Whether the workers end together (then only
less work shortens the suite) or one waits for the other (then the order does):

    TIMELINE=/tmp/timeline.jsonl PYTHONPATH=benchmarks/pytest_plugins .venv/bin/python -m pytest -p timeline
    .venv/bin/python benchmarks/pytest_plugins/timeline.py /tmp/timeline.jsonl
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

_started: dict[str, float] = {}


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or nodeid not in _started:  # the controller hears of every test too: the workers' record counts
        return
    with open(os.environ["TIMELINE"], "a") as f:
        f.write(json.dumps({"worker": worker, "test": nodeid, "start": _started[nodeid], "stop": time.time()}) + "\n")


def report(path: str, modules: int = 15) -> None:
    records = [json.loads(line) for line in open(path)]
    t0 = min(r["start"] for r in records)
    by_worker, by_module = collections.defaultdict(list), collections.Counter()
    for r in records:
        by_worker[r["worker"]].append(r)
        by_module[r["test"].split("::")[0]] += r["stop"] - r["start"]
    for worker, rs in sorted(by_worker.items()):
        busy = sum(r["stop"] - r["start"] for r in rs)
        print(f"{worker}: {len(rs)} tests, busy {busy:.1f} s, last stop at {max(r['stop'] for r in rs) - t0:.1f} s")
    for module, seconds in by_module.most_common(modules):
        print(f"{seconds:7.1f} s  {module}")


if __name__ == "__main__":
    report(sys.argv[1])
