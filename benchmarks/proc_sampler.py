"""Where a command's CPU goes by kind of process: every process on the machine sampled from /proc while it runs.

    .venv/bin/python benchmarks/proc_sampler.py -- .venv/bin/python -m pytest -q

reads /proc/PID/stat every 0.3 s while the command runs, keeps each process's last CPU time (user + system) with its
command line and parent, and prints a table of core-seconds by kind: the test workers, workers forked from a fork
server, fork servers, torchrun's agents and workers, fresh `python -m bertgpu` command lines, spawned workers.
A forked process shows its parent's command line, so kinds follow the parent chain. Processes that start and end
between two samples are missed (they cost little), and processes that were running before the command are left out.
Measure on an otherwise quiet machine: everything running is counted.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def sample(seen: dict[str, dict], t0: float) -> None:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2 :].split()
            key = f"{name}-{fields[19]}"  # the pid and its start time: a pid reused is another process
            if key not in seen:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{name}/environ", "rb") as f:
                    ranked = b"\0LOCAL_RANK=" in b"\0" + f.read()  # started by an elastic agent
                seen[key] = {"pid": int(name), "ppid": int(fields[1]), "cmd": cmd, "ranked": ranked}
                seen[key]["first"] = time.monotonic() - t0
            seen[key]["cpu"] = (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, ValueError, IndexError):
            pass  # ended while it was read


def kind(proc: dict, by_pid: dict[int, dict]) -> str:
    cmd, parent = proc["cmd"], by_pid.get(proc["ppid"], {}).get("cmd", "")
    if "bin/torchrun " in cmd or "torch.distributed.run " in cmd:
        return "torchrun agents"
    if "-m bertgpu" in cmd:  # torchrun's agent may be forked (tests/procs.start): its workers have a LOCAL_RANK
        return "torchrun workers" if proc["ranked"] else "fresh `python -m bertgpu`"
    if "forkserver import main" in cmd:
        return "forked from a fork server" if "forkserver import main" in parent else "fork servers"
    if "spawn_main" in cmd:
        return "spawned workers"
    if "sys.stdin.readline" in cmd:  # pytest-xdist's workers, and what they fork
        return "test workers and their forks"
    return "other: " + (cmd.split(" ")[0] or "(no command line)")


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    if not command:
        print(__doc__)
        return 2
    seen: dict[str, dict] = {}
    t0 = time.monotonic()
    sample(seen, t0)
    before = set(seen)
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            sample(seen, t0)
            time.sleep(0.3)

    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    code = subprocess.call(command)
    done.set()
    sampler.join()
    by_pid = {p["pid"]: p for p in sorted(seen.values(), key=lambda p: p["first"])}
    cpu, count = collections.Counter(), collections.Counter()
    for key, proc in seen.items():
        if key in before or proc["pid"] == os.getpid():
            continue
        cpu[kind(proc, by_pid)] += proc.get("cpu", 0.0)
        count[kind(proc, by_pid)] += 1
    print("\n| kind of process | processes | core-s |\n|---|---:|---:|")
    for name, seconds in cpu.most_common():
        print(f"| {name} | {count[name]} | {seconds:.1f} |")
    print(f"| all | {sum(count.values())} | {sum(cpu.values()):.1f} |")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
