"""Threads per process against fine-tuning speed, on a quiet machine and on a busy one.

Why bertgpu's CPU default is "the cores this process may use, shared between the local processes",
and why OMP_NUM_THREADS wins when set: each cell is a child process that trains a `mini` BERT
classifier (bertgpu's model, AdamW, batch 16 x 64 tokens of real English text) for a fixed number of
steps with torch.set_num_threads(N), alone (quiet) or beside B busy-looping processes (busy: another
job on the machine). The peer is the same run at another thread count, in the same invocation.

    python benchmarks/threads.py [--steps 30] [--busy 1]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time, torch
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForSequenceClassification
threads, steps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
torch.manual_seed(0)
config = BertConfig.preset("mini", vocab_size=30522, id2label={0: "a", 1: "b"})
model = BertForSequenceClassification(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(1000, 30000, (16, 64))
labels = torch.randint(0, 2, (16,))
mask = torch.ones_like(ids)
def step():
    loss = torch.nn.functional.cross_entropy(model(ids, torch.zeros_like(ids), mask), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
for _ in range(3):
    step()
start = time.perf_counter()
for _ in range(steps):
    step()
print(json.dumps({"examples_per_s": 16 * steps / (time.perf_counter() - start)}))
"""


def _spin() -> None:
    while True:
        pass


def measure(threads: int, steps: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(threads), str(steps)], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["examples_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--busy", type=int, default=1, help="busy-looping processes beside the run, for 'busy'")
    parser.add_argument("--threads", default="", help="thread counts to try (default: 1 .. the cores, and twice that)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    counts = (
        [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, max(1, cores // 2), cores, 2 * cores})
    )
    rows = []
    for load in ("quiet", "busy"):
        spinners = [
            multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy if load == "busy" else 0)
        ]
        for p in spinners:
            p.start()
        time.sleep(0.5)
        try:
            for threads in counts:
                rows.append((load, threads, measure(threads, args.steps)))
        finally:
            for p in spinners:
                p.terminate()
    print(f"{cores} cores available to this process; mini classifier, batch 16 x 64 tokens, {args.steps} steps")
    print("| machine | threads | examples/s | vs 1 thread |")
    print("| --- | --- | --- | --- |")
    for load, threads, rate in rows:
        one = next(r for lo, t, r in rows if lo == load and t == 1)
        print(
            f"| {load}{f' ({args.busy} busy process)' if load == 'busy' else ''} | {threads} | {rate:.1f} | "
            f"{rate / one:.2f}x |"
        )


if __name__ == "__main__":
    main()
