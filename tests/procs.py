"""Running, watching and killing real bertgpu runs from the tests (shared by the resume tests)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import ROOT
from fork_server import limit_file_size

from bertgpu.training.runlog import read_records


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())}


def start(args: list, *, torchrun: bool = False, slow: dict | None = None) -> Forked:
    """Start a run in a session of its own, so that killing the group kills launcher and workers. ``slow``: the
    environment of tests/slow_rank.py (SLOW_RANK, SLOW_SECONDS), which then runs the command. The launcher, bertgpu's
    own or torchrun's agent (``torchrun=True``: 2 processes, --max-restarts 1), is forked from the test worker's
    fork server (``Forked``); so are torchrun's workers, from the agent's (fork_server.fork_torchruns_workers)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(slow or {})}
    if not torchrun:
        return Forked(["slow_rank" if slow else "bertgpu", *map(str, args)], env)
    import tempfile

    pids = Path(tempfile.mkdtemp(prefix="bertgpu-torchrun-")) / "workers"
    agent = ["torchrun", "--standalone", "--nproc_per_node", "2", "--max-restarts", "1"]
    proc = Forked([*agent, "-m", "bertgpu", *map(str, args)], {**env, "BERTGPU_TEST_WORKER_PIDS": str(pids)})
    proc.worker_pids = pids
    return proc


class Forked:
    """`python -m bertgpu ARGS` (or `python tests/slow_rank.py ARGS`, `torchrun ARGS`) as a process of its own,
    forked from the test worker's fork server (tests/fork_server.run_command) instead of a fresh interpreter that
    imports torch and bertgpu again (2.5 s of CPU a launcher; the suite starts about fifteen that it kills or stops),
    its own workers' fork server a fork of it (fork_server.serve_workers_from_here: 4.3 s more of imports saved):
    what a test does with a Popen (pid, poll, wait, communicate, send_signal, kill, returncode). Its output goes to
    files, read when it has ended; ``output`` sends both streams to one file that a test may watch. With
    BERTGPU_TEST_FRESH=1 it is that fresh interpreter, as every command of the suite then is."""

    def __init__(self, argv: list[str], env: dict[str, str], output: Path | None = None, file_size: int | None = None):
        import multiprocessing
        import tempfile

        from conftest import workers_from_a_fork_server
        from fork_server import ForkedProcess, run_command

        from bertgpu import cli

        self.args, self.returncode, self._popen = argv, None, None
        if output is None:
            folder = Path(tempfile.mkdtemp(prefix="bertgpu-forked-"))
            self._out, self._err = folder / "stdout", folder / "stderr"
        else:
            self._out = self._err = output
        if os.environ.get("BERTGPU_TEST_FRESH") == "1":
            self._popen = _fresh(argv, env, self._out, self._err, file_size)
            self.pid = self._popen.pid
            return
        workers_from_a_fork_server(cli.main, ())  # the server, started with tests/ on its path, once per test worker
        self._popen = ForkedProcess(
            multiprocessing.get_context("forkserver").Process(
                target=run_command, args=(argv, env, str(self._out), str(self._err), file_size)
            ),
            argv,
        )
        self.pid = self._popen.pid

    def poll(self) -> int | None:
        self.returncode = self._popen.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = self._popen.wait(timeout)
        return self.returncode

    def completed(self, timeout: float) -> subprocess.CompletedProcess:
        """Wait for it to end, as subprocess.run does: its session killed and TimeoutExpired after ``timeout``."""
        try:
            code = self.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            raise
        return subprocess.CompletedProcess(self.args, code, *self.communicate())

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        if self._out == self._err:
            return self._out.read_text(errors="replace"), ""
        return self._out.read_text(errors="replace"), self._err.read_text(errors="replace")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _fresh(argv: list[str], env: dict[str, str], out: Path, err: Path, file_size: int | None) -> subprocess.Popen:
    """Forked's command as a fresh interpreter (BERTGPU_TEST_FRESH=1), in a session of its own."""
    main = {
        "bertgpu": ["-m", "bertgpu"],
        "slow_rank": [str(ROOT / "tests" / "slow_rank.py")],
        "torchrun": ["-m", "torch.distributed.run"],
    }.get(argv[0], argv[:2])
    rest = argv[2:] if argv[0] == "-c" else argv[1:]
    with open(out, "w") as stdout, open(err, "w" if err != out else "a") as stderr:
        return subprocess.Popen(
            [sys.executable, *main, *rest],
            cwd=ROOT,
            stdout=stdout,
            stderr=subprocess.STDOUT if out == err else stderr,
            env={**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))},
            start_new_session=True,
            preexec_fn=functools.partial(limit_file_size, file_size),
        )


def live_records(run_dir: Path) -> list[dict]:
    """The records of a running run's log.jsonl: its complete lines (a read can meet a line half-written)."""
    log = run_dir / "log.jsonl"
    return read_records(log) if log.exists() else []


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen | Forked, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in live_records(run_dir)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended before step {step}: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def env_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def parent_chain_has(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def torchrun_workers(root: int) -> dict[int, int]:
    """The workers that elastic agents under process ``root`` started, by pid: their LOCAL_RANK. An agent's own
    environment has none; a process a worker started (a data loader's) inherits it, and is left out."""
    ranked = {
        int(p): int(env["LOCAL_RANK"])
        for p in os.listdir("/proc")
        if p.isdigit()
        and (env := env_of(int(p))).get("TORCHELASTIC_RUN_ID")
        and "LOCAL_RANK" in env
        and parent_chain_has(int(p), root)
    }
    return {p: rank for p, rank in ranked.items() if not any(q != p and parent_chain_has(p, q) for q in ranked)}


def kill_torchrun_worker(proc: Forked, local_rank: int = 1) -> None:
    """SIGKILL one worker (by LOCAL_RANK) of the torchrun started as ``proc`` (``start(torchrun=True)``): one its
    agent forked, as the file it lists them in says, or one of the fresh interpreters it started
    (BERTGPU_TEST_FRESH=1), found in /proc."""
    listed = proc.worker_pids.read_text().split() if proc.worker_pids.exists() else []
    found = dict(zip(map(int, listed[::2]), map(int, listed[1::2]))) or torchrun_workers(proc.pid)
    workers = [p for p, rank in found.items() if rank == local_rank]
    assert workers, f"no worker of local rank {local_rank} found"
    os.kill(min(workers), signal.SIGKILL)
