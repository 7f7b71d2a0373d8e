"""What every training task does around its loop, written once for pretrain and finetune.

Before any process starts (in the command's process):

- ``check_out_dir``: a non-empty output directory needs --resume or --overwrite;
- ``parallel.layout.check_layout``: the processes, --tp, --strategy and precision fit each other and the model;
- ``run_workers``: train here (one process, or a worker of torchrun) or in local workers.

Inside every worker, a ``TrainingRun``: the process group and its mesh, the run directory, the
checkpoint to resume from, the dropout RNG, the model spread over the processes, stop signals,
skipped non-finite steps, and saving and restoring resumable checkpoints. The loops themselves
(``pretrain.train``, ``finetune.train``) keep only what is theirs: data, model, loss and records.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .. import checkpoint, model_card
from ..config import ModelConfig
from ..errors import UserError
from ..parallel import ParallelModel, launch, parallelize
from ..parallel.compression import Compression
from ..parallel.layout import check_layout
from ..training import (
    LaggedFlags,
    RunLog,
    StopSignal,
    allow_tf32,
    console_is_tty,
    format_duration,
    gather_rng_states,
    peak_memory_mb,
    resolve_precision,
    restore_rng_state,
)


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
    cfg: Any,
    length_flag: str,
    length_now: int,
    length_saved: Callable[[dict], Any],
    finished: Callable[[dict[str, Any]], bool],
) -> bool:
    """With --resume, before any process starts, say in one line what resuming will do: start from
    scratch (no checkpoint yet), nothing (the run is finished: return True), or train to a changed
    length (``length_flag``: the learning-rate schedule is stretched to it, so a rate that had decayed
    rises again)."""
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
    try:
        saved = length_saved(json.loads((latest / checkpoint.RUN_CONFIG_NAME).read_text(encoding="utf-8"))["config"])
    except (OSError, KeyError, ValueError):
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


def resolve_device(cfg: Any) -> Any:
    """``cfg`` with --device auto made cpu or cuda, before any process starts (every worker sees the same)."""
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, device=launch.resolve_device(cfg.run.device)))


def run_workers(train: Callable[[Any], Any], cfg: Any) -> None:
    """Run ``train(cfg)`` here (one process, or one worker of torchrun) or in ``nproc`` local workers
    started by torch's elastic launcher (restarted ``max_restarts`` times on a failure). The training
    commands keep those settings in ``cfg.run``; evaluate's config has them at its top level."""
    settings = getattr(cfg, "run", cfg)
    max_restarts = getattr(settings, "max_restarts", 0)
    if launch.launched_externally():
        launch.worker_main(train, cfg)
        return
    nproc = launch.resolve_nproc(settings.nproc, settings.device)
    if nproc == 1 and max_restarts == 0:
        launch.worker_main(train, cfg)
    else:
        launch.launch(launch.worker_main, (train, cfg), nproc, max_restarts=max_restarts)


class TrainingRun:
    """One worker's side of a training run: everything around the loop that pretrain and finetune share.

    ``cfg`` is the task's config: ``out``, ``parallel`` and ``run`` (a ``RunConfig``: ``resume``,
    ``overwrite``, ``device``, ``nproc``, ``precision``, ``seed``, ``max_bad_steps``). A restart by
    torchrun --max-restarts (or our --max-restarts) resumes by itself.
    """

    def __init__(self, cfg: Any, model_config: ModelConfig):
        self.cfg = cfg
        self.task = "finetune" if hasattr(cfg, "epochs") else "pretrain"
        self.env = launch.init(cfg.run.device)
        self.device = self.env.device
        self.is_main = self.env.is_main
        self.precision = resolve_precision(cfg.run.precision, self.device)
        self.dims = check_layout(cfg, model_config)
        self.dims.build_mesh(self.device.type)
        allow_tf32(self.device)

        self.resume = cfg.run.resume or launch.restart_count() > 0
        self.out = Path(cfg.out)
        if self.is_main:
            checkpoint.open_run_dir(self.out, start_afresh=cfg.run.overwrite and not self.resume)
        launch.barrier()
        self.resume_from = checkpoint.latest_checkpoint(self.out) if self.resume else None
        # The plain values of the checkpoint (data position, records, RNGs); the loop reads its own.
        self.state: dict[str, Any] | None = None
        if self.resume_from is not None:
            self.state = checkpoint.load_training_state(self.resume_from)
        self.start_step = self.state["step"] if self.state else 0

        self.stop = StopSignal()
        self.flags = LaggedFlags(self.device)
        self.skipped = 0
        self.bad_in_a_row = 0
        self.log: RunLog | None = None
        self.bar: tqdm | None = None

    @property
    def layout(self) -> tuple[int, int, int]:
        return self.dims.world_size, self.dims.dp, self.dims.tp

    def parallelize(self, model: torch.nn.Module, total_steps: int, compile: bool = False) -> ParallelModel:
        """Spread ``model`` (the same weights on every process) over the processes; seed dropout: the
        processes of one tensor-parallel group draw the same masks, each data-parallel rank its own."""
        parallel = self.cfg.parallel
        compression = Compression(
            parallel.grad_compression, parallel.powersgd_rank, parallel.powersgd_warmup or max(2, total_steps // 10)
        )
        net = parallelize(
            model,
            self.dims,
            self.device,
            precision=self.precision,
            activation_checkpointing=parallel.activation_checkpointing,
            compile=compile,
            compression=compression,
            seed=self.cfg.run.seed,
        )
        torch.manual_seed(self.cfg.run.seed + 1 + self.dims.dp_rank)
        return net

    def restore(
        self,
        net: ParallelModel,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        sample_forward: Callable[[], Any],
    ) -> None:
        """On resume: the optimizer state (whatever layout wrote it), the gradient scaler, this
        process's RNG and PowerSGD's state (same layout only). ``sample_forward`` runs the model on a
        batch, for PowerSGD's silent first step (``ParallelModel.settle_buckets``). The loop restores
        its own fields from ``self.state``."""
        if self.state is None:
            return
        checkpoint.load_optimizer_state(net.model, optimizer, self.resume_from)
        scaler.load_state_dict(self.state["scaler"])
        if net.powersgd is not None:
            same_layout = list(self.state.get("layout", ())) == list(self.layout)
            saved = checkpoint.load_rank_tensors(self.resume_from, self.env.rank)
            if same_layout and saved is not None:
                net.load_rank_state_dict(saved, sample_forward)
            else:
                self.warn(
                    "PowerSGD starts afresh (warm-up included): the checkpoint was written by another layout "
                    "or without PowerSGD"
                )
        anew = hash((self.cfg.run.seed, self.dims.dp_rank, self.start_step)) % 2**63
        restore_rng_state(self.state["rng"], self.env.rank, self.layout, self.device, anew)

    def start(self, line: str, total_steps: int) -> None:
        """Print the start line (rank 0), open the log and the progress bar."""
        self.started = time.perf_counter()
        if self.is_main:
            print(line, flush=True)
        self.log = RunLog(self.out, self.is_main, start_step=self.start_step)
        self.bar = tqdm(
            total=total_steps, initial=self.start_step, disable=not (self.is_main and console_is_tty()), unit="step"
        )

    def write(self, line: str) -> None:
        """A line on the console (rank 0's) that does not break the progress bar."""
        if not self.is_main:
            return
        if self.bar is not None and not self.bar.disable:
            tqdm.write(line)
        else:
            print(line, flush=True)

    def save(
        self,
        step: int,
        net: ParallelModel,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        state: dict[str, Any],
        model_config: ModelConfig,
        *,
        vocab_path: str | Path,
        do_lower_case: bool,
        keep: int,
        architecture: str | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> Path:
        """A resumable checkpoint of step ``step``: the loop's ``state`` plus the scaler, every
        process's RNG and the layout. Every process calls this."""
        full = {
            **state,
            "scaler": scaler.state_dict(),
            "rng": gather_rng_states(self.device, self.layout),
            "layout": list(self.layout),
        }
        card = model_card.render(self.task, self.cfg, step, model_config, self.dims.describe(), metrics)
        return checkpoint.save_checkpoint(
            self.out,
            step,
            net.model,
            optimizer,
            model_config,
            full,
            self.cfg,
            vocab_path=vocab_path,
            do_lower_case=do_lower_case,
            keep=keep,
            architecture=architecture,
            rank_tensors=net.rank_state_dict(),
            card=card,
        )

    def end_step(self, step: int, bad: torch.Tensor, *, flush: bool, save: Callable[[], Path]) -> bool:
        """After every optimizer step: queue its flags (was it skipped; was any process asked to stop)
        and act on those due, which are the previous step's on a GPU (no wait) and all of them when
        ``flush`` (a checkpoint follows, which must account for every step it holds). Return whether
        to stop now (a signal reached some process)."""
        asked = launch.all_reduce_sum(torch.full((), float(self.stop.signum > 0), device=self.device))
        due = self.flags.push(step, torch.stack([asked, bad]))
        if flush or any(values[0] for _, values in due):
            due += self.flags.flush()
        return self._act_on(due, save)

    def flush(self, save: Callable[[], Path]) -> bool:
        """Act on every queued step's flags (at the end of an epoch); return whether to stop now."""
        return self._act_on(self.flags.flush(), save)

    def _act_on(self, due: list[tuple[int, list[float]]], save: Callable[[], Path]) -> bool:
        """Count and report skipped steps; after ``max_bad_steps`` in a row stop the run, the last good
        weights saved first (``save``). Return whether a process was asked to stop."""
        stop_now = False
        for flag_step, (stop_flag, was_bad) in due:
            stop_now |= stop_flag > 0
            if not was_bad:
                self.bad_in_a_row = 0
                continue
            self.skipped += 1
            self.bad_in_a_row += 1
            self.write(f"step {flag_step}: non-finite loss or gradient, step skipped ({self.skipped} so far)")
            if self.precision != "fp16" and self.bad_in_a_row >= self.cfg.run.max_bad_steps:
                self.flags.flush()  # the steps after it are skipped too: nothing is lost by not reading them
                path = save()
                raise UserError(
                    f"the loss was not finite for {self.bad_in_a_row} steps in a row (up to step "
                    f"{flag_step}); stopped with the last good weights in {path}; lower --lr or check "
                    "the data"
                )
        return stop_now

    def stop_requested(self) -> bool:
        """Whether a signal reached any process (a collective: every process asks at the same point)."""
        return bool(launch.all_reduce_sum(torch.full((1,), float(self.stop.signum > 0), device=self.device)).item())

    def interrupted(self, step: int, path: Path) -> launch.Interrupted:
        signum = self.stop.signum
        name = signal.Signals(signum).name if signum else "a signal on another rank"
        return launch.Interrupted(
            f"stopped by {name} after step {step}; checkpoint {path}. Run the same command with --resume to continue.",
            signum or signal.SIGTERM,
        )

    def summary(self, step: int, keys: dict[str, str], where: str) -> None:
        """The closing lines of a run (rank 0): the steps and time, each logged metric of ``keys`` from its
        first to its last value with the best, and where the result is."""
        if not self.is_main:
            return
        took = format_duration(time.perf_counter() - self.started)
        lines = [f"bertgpu {self.task}: done, steps {self.start_step:,} -> {step:,} in {took}"]
        lines += [f"  {line}" for line in (self.log.summary(keys) if self.log else [])]
        lines.append(f"  {where}")
        print("\n".join(lines), flush=True)

    def peak_memory_mb(self) -> float:
        """The largest peak memory of any process (a collective: call it at the same step everywhere)."""
        peak = torch.full((), peak_memory_mb(self.device), dtype=torch.float64, device=self.device)
        return launch.all_reduce_max(peak).item()

    def warn(self, message: str) -> None:
        if self.is_main:
            print(f"bertgpu: warning: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.stop.restore()
        if self.bar is not None:
            self.bar.close()
        if self.log is not None:
            self.log.close()
