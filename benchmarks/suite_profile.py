"""Where the test suite's CPU goes, from a py-spy recording of every process it starts (issue 39).

cpu_per_test (benchmarks/pytest_plugins) says which tests cost most; this says what in them: interpreters importing
torch, fork servers, the workers' training steps, checkpoints. Record a serial run (py-spy is no dependency of the
project: install it in a venv of its own), then summarise:

    python -m venv /tmp/spy && /tmp/spy/bin/pip install py-spy
    /tmp/spy/bin/py-spy record --subprocesses --rate 40 --format raw -o suite.raw -- .venv/bin/python -m pytest -q -n 0
    python benchmarks/suite_profile.py suite.raw --rate 40

py-spy's raw format is one collapsed stack per line with its sample count; each stack starts with the chain of
processes it ran in (``process PID:"COMMAND"``), which tells a test's own process, a fork server, a worker forked
from one and a fresh interpreter apart. Sampled time is CPU time: py-spy leaves idle threads out by default.
"""

from __future__ import annotations

import argparse
import collections
import re

HEADER = re.compile(r'process (\d+):"(.*?)";(?=process |[^"]*\()', re.S)
LINE = re.compile(r":\d+\)$")


def parse(path: str):
    """(the chain of process commands, the frames, the count) of each stack."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            chain, pos = [], 0
            while m := HEADER.match(stack, pos):
                chain.append(m.group(2))
                pos = m.end()
            yield chain, [LINE.sub(")", frame) for frame in stack[pos:].split(";") if frame], int(count)


def kind(chain: list[str]) -> str:
    """What started the process a stack ran in."""
    if len(chain) <= 1:
        return "the test process (pytest)"
    own = chain[-1]
    if "forkserver import main" in own:
        forked = len(chain) > 2 and "forkserver import main" in chain[-2]
        return "workers forked from a fork server" if forked else "fork servers"
    if "multiprocessing.spawn" in own:
        return "spawned workers (prepare's pool, spawned runs)"
    if "torchrun" in own or any("torchrun" in c for c in chain[:-1]):
        return "torchrun agents and their workers"
    if "bertgpu" in own or "slow_rank.py" in own:
        return "fresh bertgpu command lines"
    return "other interpreters (benchmarks, scripts, pip)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", help="py-spy record --format raw output")
    ap.add_argument("--rate", type=float, default=100, help="the samples a second py-spy took (its --rate)")
    ap.add_argument("--top", type=int, default=25, help="rows of the function table")
    args = ap.parse_args()

    total = 0
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0])  # [all, importing]
    ours: collections.Counter[str] = collections.Counter()  # bertgpu functions, inclusive
    for chain, frames, count in parse(args.raw):
        total += count
        row = by_kind[kind(chain)]
        row[0] += count
        row[1] += count if any("_find_and_load" in f for f in frames) else 0
        for frame in set(frames):
            if "(bertgpu/" in frame:
                ours[frame] += count

    def s(n: float) -> str:
        return f"{n / args.rate:,.1f}"

    print(f"{s(total)} core-seconds sampled\n")
    print("| where | core-s | of which importing |\n|---|---:|---:|")
    for name, (all_, imports) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"| {name} | {s(all_)} | {s(imports)} |")
    print("\n| bertgpu function (inclusive, every process) | core-s |\n|---|---:|")
    for frame, count in ours.most_common(args.top):
        print(f"| `{frame}` | {s(count)} |")


if __name__ == "__main__":
    main()
