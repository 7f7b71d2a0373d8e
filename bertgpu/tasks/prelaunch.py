"""What a training command does before any process starts, in the command's process: ``check_out_dir`` (a
non-empty output directory needs --resume or --overwrite), ``announce_resume`` (what --resume will do, in one
line), ``warn_before_start``, ``resolve_device``, and ``run_workers`` (train here, one process or a worker of
torchrun, or in local workers; evaluate and predict: ``run_local_workers``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertgpu.checkpoints import checkpoint
from bertgpu.config import TrainingConfig
from bertgpu.errors import UserError
from bertgpu.parallel import launch
from bertgpu.parallel.layout import cpu_oversubscription


def check_out_dir(out: str, overwrite: bool, resume: bool) -> None:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not (overwrite or resume):
        raise UserError(
            f"output directory {path} is not empty; pass --resume to continue the run there, "
            "or --overwrite to start afresh"
        )


def announce_resume(
    cfg: TrainingConfig,
    length_flag: str,
    length_now: int,
    length_saved: Callable[[dict], Any],
    finished: Callable[[dict[str, Any]], bool],
) -> bool:
    """With --resume, before any process starts, say in one line what resuming will do: start from
    scratch (no checkpoint yet), nothing (the run is finished: return True), or train to a changed
    length (``length_flag``: the learning-rate schedule is stretched to it, so a rate that had decayed
    rises again). ``length_saved`` reads the length the latest checkpoint's bertgpu.json records."""
    if not cfg.run.resume or launch.restart_count() > 0 or int(os.environ.get("RANK", 0)) != 0:
        return False
    latest = checkpoint.latest_checkpoint(cfg.out)
    if latest is None:
        print(f"bertgpu: no checkpoint in {cfg.out}: starting from scratch", flush=True)
        return False
    state = checkpoint.load_training_state(latest)
    if finished(state):
        print(
            f"bertgpu: the run in {cfg.out} is finished (its last checkpoint, {latest.name}, is at the end of "
            f"{length_flag} {length_now}): nothing to train; pass a larger {length_flag} to train further",
            flush=True,
        )
        return True
    record = checkpoint.read_run_record(latest)
    if record is None:
        return False
    try:
        saved = length_saved(record)
    except (KeyError, ValueError):
        return False
    if saved != length_now:
        step = state["step"]
        print(
            f"bertgpu: {length_flag} raised from {saved} to {length_now} on resume: the learning-rate schedule "
            f"(warm-up, then linear decay to 0) is stretched to the new end, so from step {step} the rate is the "
            "longer schedule's (it rises again where it had decayed)"
            if length_now > saved
            else f"bertgpu: {length_flag} lowered from {saved} to {length_now} on resume: the learning-rate schedule "
            f"now ends sooner, so from step {step} the rate decays faster",
            flush=True,
        )
    return False


def warn_before_start(cfg: TrainingConfig) -> None:
    """The warnings of a training run's set-up that hold for each machine, printed once on it before any
    process starts (not again on a restart): more processes than cores."""
    if launch.restart_count() > 0 or int(os.environ.get("LOCAL_RANK", 0)) != 0:
        return
    for message in (cpu_oversubscription(cfg),):
        if message:
            print(f"bertgpu: warning: {message}", file=sys.stderr, flush=True)


def resolve_device(cfg: Any) -> Any:
    """``cfg`` with --device auto made cpu or cuda, before any process starts (every worker sees the same)."""
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, device=launch.resolve_device(cfg.run.device)))


def run_local_workers(train: Callable[[Any], Any], cfg: Any, nproc: int, device: str) -> None:
    """Run ``train(cfg)`` here (one process, or one worker of torchrun) or in ``nproc`` local workers
    started by torch's elastic launcher, on one machine and never restarted (evaluate and predict)."""
    if launch.launched_externally() or launch.resolve_nproc(nproc, device) == 1:
        launch.worker_main(train, cfg)
    else:
        launch.launch(launch.worker_main, (train, cfg), launch.resolve_nproc(nproc, device))


def parse_nnodes(value: str) -> tuple[int, int]:
    """--nnodes N or MIN:MAX as (min, max)."""
    try:
        parts = [int(p) for p in str(value).split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not 1 <= parts[0] <= parts[1]:
        raise UserError(f"--nnodes {value}: give a number of machines, or MIN:MAX with 1 <= MIN <= MAX (1:4)")
    return parts[0], parts[1]


def run_workers(train: Callable[[Any], Any], cfg: TrainingConfig, preload: tuple[str, ...] = ()) -> None:
    """``_run_workers``, and a run that fails before it wrote anything (a model it cannot load, a batch refused
    for memory) leaves no --out behind when it made that directory itself: an empty one would ask the next start
    for --overwrite. A directory that was there before, or holds any file but the launcher's job mark, is left
    alone; so is one that other machines share, or torchrun's workers."""
    made = not launch.launched_externally() and parse_nnodes(cfg.run.nnodes)[1] == 1 and not os.path.lexists(cfg.out)
    try:
        _run_workers(train, cfg, preload)
    except BaseException:
        if made and os.path.isdir(cfg.out):
            files = [Path(root, name) for root, _, names in os.walk(cfg.out) for name in names]
            if all(f == Path(cfg.out, launch.JOB_FILE) for f in files):
                shutil.rmtree(cfg.out, ignore_errors=True)
        raise


def _run_workers(train: Callable[[Any], Any], cfg: TrainingConfig, preload: tuple[str, ...] = ()) -> None:
    """``run_local_workers`` for a training command: its workers are restarted --max-restarts times on a
    failure (each restart resumes), and with --nnodes they meet those of the other machines. ``preload``: the
    optional libraries its workers import (``launch.launch``)."""
    run = cfg.run
    if launch.launched_externally():
        launch.worker_main(train, cfg)
        return
    nproc = launch.resolve_nproc(run.nproc, run.device)
    nnodes = parse_nnodes(run.nnodes)
    if nproc == 1 and run.max_restarts == 0 and nnodes == (1, 1):
        launch.worker_main(train, cfg)
    else:
        elastic = launch.Elastic(
            max_restarts=run.max_restarts,
            nnodes=nnodes,
            rdzv_endpoint=run.rdzv_endpoint,
            run_id=run.rdzv_id or (launch.elastic_run_id(cfg.out) if nnodes[1] > 1 else ""),
            last_call=run.rdzv_last_call,
            heartbeat=run.rdzv_heartbeat,
        )
        launch.launch(launch.worker_main, (train, cfg), nproc, elastic=elastic, preload=preload)
