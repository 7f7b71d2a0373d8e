"""What a checkpoint costs the training: the stall per save, written in line (the default) against written
in the background (`--async-save`), for `base` on CPU, in one run.

`bertgpu pretrain` runs in this process (one process, so that the save can be timed from inside) on
the Python language reference tokenized with bert-base-uncased's vocab, saving every other step. For
each mode the table gives the median time of a step without a save and of a step with one, their
difference (the time a save costs the training: the stall), how long the training thread spends in
``save()`` (staging the state, plus the whole write when in line) and how long the write takes::

    python benchmarks/checkpoint_stall.py [--model base] [--steps 9] [--batch-size 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import corpora
from common import ROOT

sys.path.insert(0, str(ROOT))

from bertgpu.checkpoints import checkpoint  # noqa: E402


def run(mode: str, data: Path, work: Path, args) -> dict:
    from bertgpu.cli import main

    stalls, writes = [], []
    save, finish = checkpoint.Checkpointer.write, checkpoint._finish

    def timed_save(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return save(self, *a, **k)
        finally:
            stalls.append(time.perf_counter() - t0)

    def timed_finish(*a, **k):
        t0 = time.perf_counter()
        try:
            return finish(*a, **k)
        finally:
            writes.append((t0, time.perf_counter()))

    checkpoint.Checkpointer.write, checkpoint._finish = timed_save, timed_finish
    out = work / mode
    flags = ["--async-save"] if mode == "background" else []
    argv = ["pretrain", "--data", str(data), "--model", args.model, "--out", str(out), "--steps", str(args.steps)]
    argv += ["--batch-size", str(args.batch_size), "--save-every", "2", "--log-every", "1", "--keep", "1"]
    argv += ["--device", "cpu", "--precision", "fp32", "--loader-workers", "0", "--nproc", "1", *flags]
    step_ends = []
    from bertgpu.training import runlog

    original_log = runlog.RunLog.log

    def timed_log(self, step, values, *a, **k):
        if "steps_per_s" in values:
            step_ends.append((step, time.perf_counter()))
        return original_log(self, step, values, *a, **k)

    runlog.RunLog.log = timed_log
    try:
        sys.argv = ["bertgpu", *argv]
        try:
            main()
        except SystemExit as e:
            if e.code:
                raise
    finally:
        checkpoint.Checkpointer.write, checkpoint._finish, runlog.RunLog.log = save, finish, original_log
    # A step's time: from the previous log line (one per step, written before that step's save) to its
    # own. A save at step 2k lands in step 2k+1's time, with whatever the background write takes from it.
    times = {s: t1 - t0 for (_, t0), (s, t1) in zip(step_ends, step_ends[1:])}
    plain = statistics.median(t for s, t in times.items() if s % 2 == 0)
    after = statistics.median(t for s, t in times.items() if s % 2 == 1)
    return {
        "step": plain,
        "after": after,
        "lost": after - plain,
        "stall": statistics.median(stalls),
        "write": statistics.median(w1 - w0 for w0, w1 in writes),
        "saves": len(stalls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base")
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="bertgpu-stall-"))
    data = corpora.english_data(work)
    results = {mode: run(mode, data, work, args) for mode in ("in line", "background")}
    print(f"\n`{args.model}`, batch {args.batch_size}, 1 process on CPU, a checkpoint every 2 steps\n")
    print("| checkpoint | step without a save | step with a save | time lost per save | in save() | write | saves |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, r in results.items():
        print(
            f"| {mode} | {r['step']:.2f} s | {r['after']:.2f} s | **{r['lost']:.2f} s** | {r['stall']:.2f} s | "
            f"{r['write']:.2f} s | {r['saves']} |"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
