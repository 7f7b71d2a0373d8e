"""Running, watching and killing real bertgpu runs from the tests (shared by the resume tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import ROOT

from bertgpu.training.runlog import read_records


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())}


def start(args: list, *, torchrun: bool = False, slow: dict | None = None) -> subprocess.Popen:
    """Start a run in a session of its own, so that killing the group kills launcher and workers. ``slow``: the
    environment of tests/slow_rank.py (SLOW_RANK, SLOW_SECONDS), which then runs the command."""
    cmd = (
        [
            str(Path(sys.executable).with_name("torchrun")),
            "--standalone",
            "--nproc_per_node",
            "2",
            "--max-restarts",
            "1",
            "-m",
            "bertgpu",
        ]
        if torchrun
        else [sys.executable, str(ROOT / "tests" / "slow_rank.py")]
        if slow
        else [sys.executable, "-m", "bertgpu"]
    )
    return subprocess.Popen(
        [*cmd, *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(slow or {})},
    )


def live_records(run_dir: Path) -> list[dict]:
    """The records of a running run's log.jsonl: its complete lines (a read can meet a line half-written)."""
    log = run_dir / "log.jsonl"
    return read_records(log) if log.exists() else []


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
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


def kill_torchrun_worker(proc: subprocess.Popen, local_rank: int = 1) -> None:
    """SIGKILL one worker (by LOCAL_RANK) of the torchrun started as ``proc``."""
    workers = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit()
        and env_of(int(p)).get("TORCHELASTIC_RUN_ID")
        and env_of(int(p)).get("LOCAL_RANK") == str(local_rank)
        and parent_chain_has(int(p), proc.pid)
    ]
    assert workers, f"no worker of local rank {local_rank} found"
    os.kill(min(workers), signal.SIGKILL)
