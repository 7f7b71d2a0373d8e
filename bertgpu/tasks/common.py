"""The parts of a training run that pretrain and finetune share, each with one job and built whole.

Before any process starts, the command's process runs ``tasks.prelaunch``. Inside every worker, the loop
(``pretrain.train``, ``finetune.train``) makes a ``Session`` (the process group and its mesh, the run
directory, the checkpoint to resume from, read once), then its ``Task`` (``pretrain.Pretraining``,
``finetune.FineTuning``), made whole from its config sections: its data, its loop where the checkpoint left it,
its model spread over the processes (``spread``), its step plan (``plan.FixedSteps``, ``plan.BudgetSteps``: how
many steps, the rate of each, the last), what it logs and what its checkpoints hold. ``build_run(session, task)``
then makes the shared parts in order, each complete when made:

- ``Optimization``: the model's optimizer, gradient scaler and learning-rate schedule (restored on resume),
  clipping; a loop's ``train_step`` calls its parts after the forward and backward passes (``clip_grad_norm``,
  ``step``, ``zero_grad``, ``schedule.step``);
- ``Records``: the running sums of the log, the log and its progress bar, the throughput meter, the summary;
- ``Checkpoints``: what a checkpoint holds, written when its ``checkpoint.Checkpointer`` finds one due;
- ``StepFlags``: what each step's end hears, read lagged (a stop signal, a skipped step, the clock).

``Run`` holds them, and names the phases every loop calls after its ``train_step``: ``account`` (the step
counted and recorded, its flags acted on), ``log``, ``evaluate``, ``save``; the loop stops on one condition,
``run.finished(step)`` (its last step, or a signal: ``stopped`` once its checkpoint is written, and the
process then exits with ``run.interrupted``). Where a loop is lives in a ``LoopState`` (step, epoch, data
position, counters), which a checkpoint saves and a resumed run loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from bertgpu.checkpoints import checkpoint, model_card
from bertgpu.config import AdapterConfig, OptimConfig, TrainingConfig
from bertgpu.errors import UserError
from bertgpu.models.config import EncoderConfig
from bertgpu.parallel import ParallelModel, SpreadOptions, launch, parallelize
from bertgpu.parallel.balance import Balancer
from bertgpu.parallel.balance import describe as describe_balance
from bertgpu.parallel.compression import Compression
from bertgpu.parallel.layout import check_layout
from bertgpu.parallel.rng import gather_rng_states, restore_rng_state
from bertgpu.tasks.prelaunch import check_out_dir
from bertgpu.training import drift, memory
from bertgpu.training.batch import accumulation
from bertgpu.training.fused_step import FusedStep
from bertgpu.training.metrics import Sums, Throughput, peak_memory_mb
from bertgpu.training.optim import build_optimizer, optimizer_step, unscale_and_clip
from bertgpu.training.plan import FixedSteps
from bertgpu.training.precision import allow_tf32, autocast, resolve_precision
from bertgpu.training.runlog import RunLog, console_is_tty, format_duration
from bertgpu.training.signals import LaggedFlags, StopSignal


def check_shared(out: Path, rank: int, world_size: int) -> None:
    """On many machines the run directory must be one that all of them share: every restart resumes from
    the checkpoints there. Rank 0 leaves a token in it; a rank that cannot read it back is on a machine
    with a directory of its own, and would resume from nothing (every rank calls this, together)."""
    if world_size == 1:
        return
    import socket
    import uuid

    token = launch.broadcast_object(uuid.uuid4().hex)
    probe = out / ".bertgpu-shared"
    if rank == 0:
        probe.write_text(token)
    launch.barrier()
    try:
        seen = probe.read_text() == token
    except OSError:
        seen = False
    answers = launch.all_gather_object((seen, socket.gethostname()))
    launch.barrier()
    if rank == 0:
        probe.unlink(missing_ok=True)
    missing = [(rank, host) for rank, (ok, host) in enumerate(answers) if not ok]
    if missing:
        who = ", ".join(f"{rank} ({host})" for rank, host in missing[:4]) + (" ..." if len(missing) > 4 else "")
        raise UserError(
            f"--out {out} is not shared: rank(s) {who} do not see what rank 0 ({answers[0][1]}) wrote there; "
            "on many machines the run directory must be on a file system every machine mounts (NFS, Lustre, ...), "
            "or a restart would resume from nothing"
        )


@dataclass
class LoopState:
    """Where a training loop is, and what it counted since its last log line. Each task's subclass adds
    its data position and records; ``state_dict`` is what a checkpoint keeps of it (under the keys
    checkpoints have always had, so that older runs resume) and ``load_state_dict`` reads it back."""

    sizes: list[int]  # each data-parallel rank's batch size (--balance auto may change them)
    step: int = 0  # optimizer steps done
    epoch: int = 0
    steps_in_window: int = 0  # steps since the last log line
    comm_bytes: int = 0  # gradient bytes this process exchanged since the last log line

    def state_dict(self) -> dict[str, Any]:
        return {"batch_sizes": self.sizes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]


@dataclass
class LogSpec:
    """What a task logs, as plain values: what a step sums and where a checkpoint keeps the sums, the unit of a
    batch, the values logged after the learning rates, the model card's values and how often the held-out
    evaluation runs. The task's ``log_values`` and ``log_line`` make its values and line; ``Records`` adds the
    values every task logs (learning rate, rates, memory, ...)."""

    names: tuple[str, ...]  # what a step sums for the log, in the order of its sums (the task's LOG_SUMS)
    keys: tuple[str, ...]  # the checkpoint keys of the running sums, the log window's first
    unit: str  # what a batch holds ("sequence", "example"): the balancer's word, and the sums' key plus s
    extra: dict[str, Any] = field(default_factory=dict)  # logged after the learning rates (pretraining's batch)
    card_keys: tuple[str, ...] = ()  # the last logged values a checkpoint's model card shows
    eval_every: int = 0  # the held-out evaluation every N steps (0: with every checkpoint)


class Evaluation(Protocol):
    """A held-out evaluation during training (pretraining's): its values at ``step`` and their log line."""

    def __call__(self, step: int) -> tuple[dict[str, Any], str]: ...


class Task(Protocol):
    """What a training command brings to its run, made whole from its config sections before ``build_run``
    makes the shared parts (``pretrain.Pretraining``, ``finetune.FineTuning``): its loop where the checkpoint
    left it, its model spread over the processes, its step plan and optimizer settings, its meter, what it logs
    and what every checkpoint of it holds; and what those parts ask of it as the run goes."""

    loop: LoopState  # where the loop is: resumed (``Session.resume_loop``)
    balance: bool  # --balance auto is yet to measure
    net: ParallelModel  # the model spread over the processes (``spread``)
    steps: FixedSteps  # the step plan: how many steps, the rate of each, the last
    optim: OptimConfig  # the optimizer's settings, with this run's peak rate and steps
    meter: Throughput
    log: LogSpec
    evaluation: Evaluation | None  # a held-out evaluation every --eval-every steps (pretraining's), or none
    files: checkpoint.ModelFiles  # the model's config and vocab, in every checkpoint
    fixed: dict[str, Any]  # the state that stays the same for the whole run, in every checkpoint
    warnings: Sequence[str]  # said before the start line
    lr_factor: Callable[[str], float] | None  # a parameter's rate as a multiple of the run's (None: all the same)

    def start_line(self) -> str:
        """The run's first line (every process calls it: the parameter count is a collective under --pp)."""
        ...

    def log_values(self, sums: dict[str, float]) -> dict[str, Any]:
        """The task's values of a log window, from its sums (``LogSpec.names``)."""
        ...

    def log_line(self, step: int, values: dict[str, Any]) -> str:
        """The console line of a log window (``values``: the task's and those every task logs)."""
        ...

    def sample_batch(self) -> dict[str, torch.Tensor]:
        """A batch of two on the device, for PowerSGD's silent first step on resume (``settle_buckets``)."""
        ...

    def settle(self, cfg: Any) -> tuple[Any, dict[str, Any]]:
        """``cfg`` with the values the task settled at run time, and notes for bertgpu.json
        (``Checkpoints.ran_config``)."""
        ...


class Session:
    """One worker's place in a training run, set up once: the process group and its mesh, the precision, the
    run directory (checked, opened, seen by every machine), SIGINT/SIGTERM heard from here on, and the
    checkpoint to resume from with its plain values read once (``state``: each part reads its own).

    ``cfg`` is the sections every training config has (``TrainingConfig``: ``out``, ``parallel`` and ``run``);
    the ``task`` passes what is its own: its name, fine-tuning's ``adapter``, pretraining's --recipe fast
    (``cpu_bf16``). A restart by torchrun --max-restarts (or our --max-restarts) resumes by itself.
    """

    def __init__(
        self,
        cfg: TrainingConfig,
        model_config: EncoderConfig,
        task: str = "pretrain",
        *,
        adapter: AdapterConfig | None = None,
        cpu_bf16: bool = False,
    ):
        self.cfg, self.run_cfg, self.task = cfg, cfg.run, task
        self.env = launch.init(cfg.run.device)
        self.device, self.is_main = self.env.device, self.env.is_main
        self.precision = resolve_precision(cfg.run.precision, self.device, cpu_bf16=cpu_bf16)
        self.dims = check_layout(cfg, model_config, adapter=adapter, cpu_bf16=cpu_bf16)
        self.dims.build_mesh(self.device.type)
        allow_tf32(self.device)

        # A restarted group resumes (rank 0's view, so that every rank decides alike); a first start on many
        # machines checks --out here, where one rank does it for all.
        restarted = launch.broadcast_object(launch.restarted(cfg.out))
        self.resume = cfg.run.resume or restarted
        self.out = Path(cfg.out)
        refused = ""
        if self.is_main and not restarted:
            try:
                check_out_dir(cfg.out, cfg.run.overwrite, cfg.run.resume)
            except UserError as e:
                refused = str(e)
        refused = launch.broadcast_object(refused)
        if refused:
            raise UserError(refused)
        if self.is_main:
            checkpoint.open_run_dir(self.out, start_afresh=cfg.run.overwrite and not self.resume)
        launch.barrier()
        check_shared(self.out, self.env.rank, self.env.world_size)
        if self.is_main:
            launch.mark_job(self.out)
        self.resume_from = checkpoint.latest_checkpoint(self.out) if self.resume else None
        # The plain values of the checkpoint (data position, records, RNGs); each part reads its own.
        self.state = checkpoint.load_training_state(self.resume_from) if self.resume_from is not None else None
        self.start_step = self.state["step"] if self.state else 0
        self.stop = StopSignal()  # from here on a signal stops the run after a step, its checkpoint written
        self.started = time.monotonic()  # --save-every-minutes counts from here, the model's set-up included

    @property
    def layout(self) -> tuple[int, int, int]:
        return self.dims.world_size, self.dims.dp, self.dims.tp

    def layout_change(self) -> str:
        """For the resume line: the layout now and the checkpoint's, when they differ (a restart on fewer or
        more machines, or a resume by hand with another --nproc)."""
        if self.state is None or list(self.state.get("layout", ())) == list(self.layout):
            return ""
        was = self.state.get("layout_name") or f"{self.state['layout'][0]} process(es)"
        return f" on {self.dims.describe()} (was {was})"

    def resume_loop(self, loop: LoopState, same_batches: bool = True) -> bool:
        """``loop`` where the checkpoint left it, with the per-rank batch sizes --balance auto chose (unless
        the global batch changed: ``same_batches`` False). Return whether --balance auto is yet to measure."""
        balance = self.cfg.parallel.balance == "auto"
        loop.step = self.start_step
        state = self.state
        if state is None:
            return balance
        loop.load_state_dict(state)
        balanced = state.get("balanced") and len(state.get("batch_sizes", ())) == self.dims.dp
        if same_batches and balance and balanced:
            loop.sizes, balance = list(state["batch_sizes"]), False
        return balance

    def warn(self, message: str) -> None:
        if self.is_main:
            print(f"bertgpu: warning: {message}", file=sys.stderr, flush=True)


def warn_if_batch_too_big(
    session: Session,
    model: torch.nn.Module,
    config: EncoderConfig,
    seq_length: int,
    prediction_slots: int = 0,
    examples: int | None = None,
) -> None:
    """Before the first step: a UserError when a step's estimated memory (``memory``: the state of
    ``model``, of ``config``'s shape; the activations of this rank's micro-batch of ``seq_length``-token
    sequences and of the masked-LM head's ``prediction_slots`` per sequence) exceeds what the device
    has (a run started so swaps for minutes a step or is killed), a warning with --ignore-memory-estimate.
    On CPU the machine's processes share its memory. ``examples``: all the data there is, when a rank's
    batch can be no larger than its share of it (fine-tuning on fewer rows than --batch-size). Rank 0
    estimates; every rank decides alike."""
    message = _batch_too_big(session, model, config, seq_length, prediction_slots, examples) if session.is_main else ""
    message = launch.broadcast_object(message)
    if not message:
        return
    if not session.run_cfg.ignore_memory_estimate:
        raise UserError(f"{message}; --ignore-memory-estimate starts it anyway")
    session.warn(f"{message} (started anyway: --ignore-memory-estimate)")


def _batch_too_big(
    session: Session,
    model: torch.nn.Module,
    config: EncoderConfig,
    seq_length: int,
    prediction_slots: int,
    examples: int | None,
) -> str:
    """``warn_if_batch_too_big``'s line, '' when the batch fits (or the memory is not known)."""
    dims, parallel, device = session.dims, session.cfg.parallel, session.device
    sizes, _ = accumulation(session.run_cfg, dims.dp)
    batch = sizes[dims.dp_rank]
    if examples is not None:
        batch = max(1, min(batch, -(-examples // dims.dp)))
    state = memory.state_bytes(model, dims.tp * dims.pp * (dims.dp if dims.fsdp else 1))
    activations = memory.activation_bytes(
        config,
        batch,
        seq_length,
        session.precision,
        device.type,
        prediction_slots=prediction_slots,
        split=memory.Split(dims.tp, dims.pp, parallel.activation_checkpointing),
    )
    processes = session.env.local_world_size if device.type == "cpu" else 1
    message = memory.batch_warning(
        state,
        activations,
        memory.available_bytes(device),
        processes,
        f"a batch of {batch} x {seq_length} tokens per process on {device.type}",
        parallel.activation_checkpointing,
    )
    return message or ""


def spread(
    session: Session, model: torch.nn.Module, total_steps: int, compile: bool = False, seq_length: int | None = None
) -> ParallelModel:
    """Spread ``model`` (the same weights on every process) over the processes; seed dropout: the
    processes of one tensor-parallel group draw the same masks, each data-parallel rank its own.
    ``seq_length``: the longest a batch's sequences can be, when batches differ in length."""
    parallel, run = session.cfg.parallel, session.run_cfg
    compression = Compression(
        parallel.grad_compression, parallel.powersgd_rank, parallel.powersgd_warmup or max(2, total_steps // 10)
    )
    options = SpreadOptions(
        precision=session.precision,
        activation_checkpointing=parallel.activation_checkpointing,
        compile=compile,
        compression=compression,
        seed=run.seed,
        pipeline=parallel,
        seq_length=seq_length,
        cuda_graphs=run.cuda_graphs,
        compile_step=run.compile_step,
        autotune=run.autotune,
    )
    net = parallelize(model, session.dims, session.device, options)
    torch.manual_seed(run.seed + 1 + session.dims.dp_rank)
    return net


class Optimization:
    """What steps the task's spread model ``net``: its optimizer (``optim``: the task's settings, with this run's
    peak rate and steps), the gradient scaler and the step plan's learning-rate ``schedule``, all restored on
    resume; clipping, the precision's autocast, and --balance auto's timing of the forward passes. A loop's
    ``train_step`` calls its parts after the forward and backward passes, in order: ``clip_grad_norm``,
    ``step``, ``zero_grad``, ``schedule.step()``."""

    def __init__(self, session: Session, task: Task):
        self.net, self.optim, self.precision, self.device = task.net, task.optim, session.precision, session.device
        self.optimizer = build_optimizer(task.net.model, task.optim, session.device, task.lr_factor)
        self.scaler = torch.amp.GradScaler(session.device.type, enabled=session.precision == "fp16")
        if session.state is not None:
            self._restore(session, task)
        self.schedule = task.steps.schedule(self.optimizer, session.start_step)
        self.balancer = Balancer(session.device, enabled=task.balance)
        # --compile-step where the whole step compiles (one process): the update compiled, on one GPU with CUDA
        # graphs the whole step one graph (training.fused_step); elsewhere each half runs as it is.
        whole = getattr(task.net, "whole_step", None) is not None
        self.fused = FusedStep(
            self.optimizer,
            enabled=whole and session.run_cfg.compile_step,
            graphs=getattr(task.net, "step_graphs", False),
        )

    def _restore(self, session: Session, task: Task) -> None:
        """On resume: the optimizer state (whatever layout wrote it), the gradient scaler, this
        process's RNG and PowerSGD's state (same layout only; the task's ``sample_batch`` for PowerSGD's
        silent first step, ``ParallelModel.settle_buckets``)."""
        net, state = self.net, session.state
        checkpoint.load_optimizer_state(net.model, self.optimizer, session.resume_from)
        self.scaler.load_state_dict(state["scaler"])
        if net.powersgd is not None:
            same_layout = list(state.get("layout", ())) == list(session.layout)
            saved = checkpoint.load_rank_tensors(session.resume_from, session.env.rank)
            if same_layout and saved is not None:
                net.load_rank_state_dict(saved, task.sample_batch)
            else:
                session.warn(
                    "PowerSGD starts afresh (warm-up included): the checkpoint was written by another layout "
                    "or without PowerSGD"
                )
        anew = hash((session.run_cfg.seed, session.dims.dp_rank, session.start_step)) % 2**63
        restore_rng_state(state["rng"], session.env.rank, session.layout, session.device, anew)

    def clip_grad_norm(self) -> torch.Tensor:
        """Unscale the gradients (fp16) and clip their global norm to --clip; return the 0-dim flag of a
        non-finite norm, on the device: the step that ``step`` skips (``optim.unscale_and_clip``)."""
        return unscale_and_clip(self.net, self.optimizer, self.scaler, self.optim.clip)

    def step(self, bad: torch.Tensor) -> None:
        """The optimizer step, skipped on the device where ``bad`` is 1 (``optim.optimizer_step``)."""
        optimizer_step(self.optimizer, self.scaler, bad, self.precision)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def run_step(self, forward_backward, update, micro: list[dict[str, torch.Tensor]]):
        """A step's device work, ``forward_backward(micro)`` then ``update()``, as --compile-step says
        (``fused_step.FusedStep``): (its log sums, its skipped flag), on the device."""
        return self.fused(forward_backward, update, micro)

    @contextlib.contextmanager
    def forward_context(self, micro_batch: dict[str, torch.Tensor]):
        """Around a micro-batch's forward pass: autocast to the run's precision, and the pass timed for
        ``--balance auto`` (by the micro-batch's examples)."""
        with autocast(self.precision, self.device), self.balancer.forward(len(micro_batch["input_ids"])):
            yield

    @property
    def lr(self) -> float:
        return self.schedule.get_last_lr()[0]


class Records:
    """What a run records of its ``task``: the running sums of the log window (one ``Sums`` of the task's
    ``LogSpec.names`` for each of its checkpoint keys, the first the log's; restored on resume), rank 0's log
    (console, log.jsonl, TensorBoard) with its progress bar at the step plan's total, the throughput ``meter``
    (which leaves out what the restored window counted before this process started), the held-out evaluation
    and the closing summary."""

    def __init__(self, session: Session, task: Task):
        self.session, self.task, self.plan, self.spec, self.meter = session, task, task.steps, task.log, task.meter
        self.evaluation = task.evaluation
        self.dims, self.device, self.is_main = session.dims, session.device, session.is_main
        spec, meter = task.log, task.meter
        self.sums = {key: Sums(session.device, *spec.names) for key in spec.keys}
        state = session.state
        if state is not None:
            for key, sums in self.sums.items():
                sums.restore(state[key], self.dims)
            window = self.window
            carried = dict(zip(window.names, state[spec.keys[0]].tolist()))
            meter.carry(
                task.loop.steps_in_window,
                int(carried[f"{spec.unit}s"]),
                int(carried["tokens"]),
                int(carried.get("masked", 0)),
            )
        self.started = time.perf_counter()
        self.log = RunLog(session.out, session.is_main, start_step=session.start_step)
        self.bar = tqdm(
            total=self.plan.total,
            initial=session.start_step,
            disable=not (session.is_main and console_is_tty()),
            unit="step",
        )

    @property
    def window(self) -> Sums:
        """The sums since the last log line."""
        return next(iter(self.sums.values()))

    def add(self, step_sums: torch.Tensor, bad: torch.Tensor) -> None:
        """A step's log sums, on the device; a skipped step's are not logged."""
        self.bar.total = self.plan.total  # a --time-budget re-plans the steps as it goes
        self.bar.update(1)
        kept = torch.where(bad > 0, 0.0, step_sums)
        for sums in self.sums.values():
            sums.add(kept)

    def write(self, line: str) -> None:
        """A line on the console (rank 0's) that does not break the progress bar."""
        if not self.is_main:
            return
        if not self.bar.disable:
            tqdm.write(line)
        else:
            print(line, flush=True)

    def log_window(self, loop: LoopState, lr: float, peak_lr: float, skipped: int) -> None:
        """A log line of the window since the last one: the task's values, then every task's."""
        gpu = self.device.type == "cuda"
        with self.meter.waits.on("device") if gpu else contextlib.nullcontext():  # waits for the queued steps
            s = self.window.read(self.dims)
        spec = self.spec
        unit = f"{spec.unit}s"
        rates = self.meter.rates(loop.steps_in_window, int(s[unit]), int(s["tokens"]), int(s.get("masked", 0)))
        values = {
            **self.task.log_values(s),
            "lr": lr,
            "peak_lr": peak_lr,
            **spec.extra,
            "epoch": loop.epoch,
            "skipped_steps": skipped,
            "layout": self.dims.describe(),
            "peak_memory_mb": self.peak_memory_mb(),
            **({"peak_memory_mb_per_stage": self.stage_peak_memory_mb()} if self.dims.pp > 1 else {}),
            "comm_bytes_per_step": loop.comm_bytes / max(loop.steps_in_window, 1),
            **rates,
        }
        loop.steps_in_window = loop.comm_bytes = 0
        self.log.log(loop.step, values, self.task.log_line(loop.step, values), write=self.write)

    def evaluate(self, step: int) -> None:
        """The held-out evaluation of ``step``, logged, off the meter's clock (the rates cover training steps);
        the step plan times it (a --time-budget keeps time for the last)."""
        self.meter.pause()
        self.plan.timed(self._evaluate)(step)
        self.meter.resume()

    def _evaluate(self, step: int) -> None:
        values, line = self.evaluation(step)
        self.log.log(step, values, line, write=self.write)

    def peak_memory_mb(self) -> float:
        """The largest peak memory of any process (a collective: call it at the same step everywhere)."""
        peak = torch.full((), peak_memory_mb(self.device), dtype=torch.float64, device=self.device)
        return launch.all_reduce_max(peak).item()

    def stage_peak_memory_mb(self) -> list[float]:
        """The largest peak memory of each pipeline stage's processes (a collective, as ``peak_memory_mb``)."""
        peaks = torch.zeros(self.dims.pp, dtype=torch.float64, device=self.device)
        peaks[self.dims.pp_rank] = peak_memory_mb(self.device)
        return launch.all_reduce_max(peaks).tolist()

    def summary(self, step: int, keys: dict[str, str], where: str) -> None:
        """The closing lines of a run (rank 0): the steps and time, each logged metric of ``keys`` from its
        first to its last value with the best, and where the result is."""
        if not self.is_main:
            return
        took = format_duration(time.perf_counter() - self.started)
        start = self.session.start_step
        # A resumed run's log holds the steps before (runlog.RunLog): the lines cover the whole run.
        when = f"(this start: {start:,} -> {step:,} in {took})" if start else f"in {took}"
        lines = [f"bertgpu {self.session.task}: done, steps 0 -> {step:,} {when}"]
        lines += [f"  {line}" for line in self.log.summary(keys)]
        lines.append(f"  {where}")
        print("\n".join(lines), flush=True)

    def close(self) -> None:
        self.bar.close()
        self.log.close()


class Checkpoints:
    """What a checkpoint of the run holds (``snapshot``: the loop's state, the plan's, the running sums, the
    ``task``'s fixed state, the scaler, every process's RNG, the layout, the model card; the task's model files),
    written when the ``checkpointer`` (``checkpoint.Checkpointer``: --save-every, --save-every-minutes, the last
    step) finds one due, or at once (``save_now``: a stop, a failing run, an epoch's end)."""

    def __init__(self, session: Session, task: Task, opt: Optimization, records: Records):
        self.session, self.task, self.plan, self.opt, self.records = session, task, task.steps, opt, records
        self.checkpointer = checkpoint.Checkpointer(session.out, session.run_cfg, started=session.started)
        self.checkpointer.set_contents(opt.net.model, opt.optimizer, task.files, session.cfg)

    def ran_config(self) -> tuple[Any, dict[str, Any]]:
        """The run's config as it runs, which its checkpoints record (bertgpu.json, the model card) so that
        ``--config bertgpu.json`` repeats it: --precision resolved, and what the task settled at run time
        (pretraining's --recipe fast and --time-budget); with the notes bertgpu.json keeps beside it."""
        cfg, notes = self.task.settle(self.session.cfg)
        return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, precision=self.session.precision)), notes

    def snapshot(self, loop: LoopState) -> checkpoint.Snapshot:
        """What a checkpoint of the loop's step holds besides model and optimizer; this process's own
        tensors; the model card. Every process calls this (it gathers)."""
        session, dims, fixed = self.session, self.session.dims, self.task.fixed
        values = {
            **loop.state_dict(),
            **self.plan.state_dict(loop.step),
            **{key: sums.gathered(dims) for key, sums in self.records.sums.items()},
            **fixed,
            "balanced": session.cfg.parallel.balance == "auto" and not self.opt.balancer.enabled,
            "scaler": self.opt.scaler.state_dict(),
            "rng": gather_rng_states(session.device, session.layout),
            "layout": list(session.layout),
            "layout_name": dims.describe(),
        }
        card_keys = self.records.spec.card_keys
        metrics = self.records.log.latest(*card_keys) if card_keys else None
        config, notes = self.ran_config()
        if metrics and drift.KEY in metrics:  # a continuation: how far its encoder moved (finetune pools by it)
            notes = {**(notes or {}), "start_cka": metrics[drift.KEY][0]}
        facts = model_card.RunFacts(
            loop.step,
            dims.describe(),
            metrics,
            asked_precision=session.cfg.run.precision,
            time_budget=notes.get("time_budget", ""),
            global_batch=fixed.get("global_batch"),
        )
        card = model_card.render(session.task, config, self.task.files.model_config, facts)
        return checkpoint.Snapshot(values, self.opt.net.rank_state_dict(), card, config, notes or None)

    def due(self, step: int, last: bool, epoch_end: bool) -> bool:
        return self.checkpointer.due(step, last, epoch_end)

    def save(self, loop: LoopState, *, last: bool, epoch_end: bool, force: bool) -> Path | None:
        """The checkpoint of the loop's step if one is due (or ``force``); its path, or None."""
        return self.checkpointer.save(
            loop.step, lambda: self.snapshot(loop), last=last, epoch_end=epoch_end, force=force
        )

    def save_now(self, loop: LoopState) -> Path:
        """A checkpoint of the loop's step, due or not (a stop, a failing run, an epoch's end)."""
        return self.checkpointer.write(loop.step, lambda: self.snapshot(loop))


class StepFlags:
    """What the end of every step hears, read lagged (``signals.LaggedFlags``: the previous steps' on a GPU, no
    host sync per step; all of them before a checkpoint): was the step skipped (non-finite), did a signal
    reach any process (``stopped`` once its checkpoint is written), is --save-every-minutes up by rank 0's
    clock. Skipped steps are counted and said; ``max_bad_steps`` in a row end the run with an error."""

    def __init__(self, session: Session, checkpointer: checkpoint.Checkpointer, meter: Throughput, write):
        self.device, self.precision, self.max_bad_steps = (
            session.device,
            session.precision,
            session.run_cfg.max_bad_steps,
        )
        self.stop, self.checkpointer, self.write = session.stop, checkpointer, write
        self.lagged = LaggedFlags(session.device, waits=meter.waits)  # the host's waits, beside those on data
        self.skipped = 0
        self.bad_in_a_row = 0
        self.stopped = False  # a signal reached some process: the checkpoint is written, the loop ends

    def end_step(self, step: int, bad: torch.Tensor, *, flush: bool, save: Callable[[], Path]) -> None:
        """Queue ``step``'s flags and act on those due, which are the previous step's on a GPU (no wait) and
        all of them when ``flush`` (a checkpoint follows, which must account for every step it holds)."""
        clock = self.checkpointer.clock()
        asked = launch.all_reduce_sum(
            torch.stack([torch.full((), float(v), device=self.device) for v in (self.stop.signum > 0, clock)])
        )
        due = self.lagged.push(step, torch.cat([asked, bad.reshape(1)]))
        if flush or any(values[0] or values[1] for _, values in due):
            due += self.lagged.flush()  # a checkpoint follows: it must account for every step it holds
        self._act_on(due, save)

    def flush(self, save: Callable[[], Path]) -> None:
        """At the end of an epoch: act on every queued step's flags. A stop signal among them writes the
        checkpoint here and stops the run (resumed, it starts with this epoch's evaluation)."""
        if self.stopped:
            return
        self._act_on(self.lagged.flush(), save)
        if self.stopped:
            save()

    def _act_on(self, due: list[tuple[int, list[float]]], save: Callable[[], Path]) -> None:
        """Note a stop signal (``stopped``) and the clock's checkpoint; count and report skipped steps, and
        after ``max_bad_steps`` in a row end the run with an error, the last good weights saved first."""
        for flag_step, (stop_flag, clock_flag, was_bad) in due:
            self.stopped |= stop_flag > 0
            self.checkpointer.clock_due |= clock_flag > 0
            if not was_bad:
                self.bad_in_a_row = 0
                continue
            self.skipped += 1
            self.bad_in_a_row += 1
            self.write(f"step {flag_step}: non-finite loss or gradient, step skipped ({self.skipped} so far)")
            if self.precision != "fp16" and self.bad_in_a_row >= self.max_bad_steps:
                self.lagged.flush()  # the steps after it are skipped too: nothing is lost by not reading them
                path = save()
                self.checkpointer.wait()
                raise UserError(
                    f"the loss was not finite for {self.bad_in_a_row} steps in a row (up to step "
                    f"{flag_step}); stopped with the last good weights in {path}; lower --lr or check "
                    "the data"
                )

    def stop_requested(self) -> bool:
        """Whether a signal reached any process, noted in ``stopped`` (a collective: every process asks at
        the same point)."""
        asked = launch.all_reduce_sum(torch.full((1,), float(self.stop.signum > 0), device=self.device)).item()
        self.stopped |= bool(asked)
        return self.stopped

    def interrupted(self, step: int) -> launch.Interrupted:
        """What a ``stopped`` run ends with once its loop is left: the process exits with the signal's
        status, the line naming the checkpoint written at the stop."""
        self.checkpointer.wait()  # the checkpoint the message names is complete
        signum = self.stop.signum
        name = signal.Signals(signum).name if signum else "a signal on another rank"
        return launch.Interrupted(
            f"stopped by {name} after step {step}; checkpoint {self.checkpointer.latest}. Run the same command "
            "with --resume to continue.",
            signum or signal.SIGTERM,
        )


@dataclass(frozen=True)
class Run:
    """A training run's parts, made by ``build_run``; the phases every loop calls after its ``train_step``."""

    session: Session
    plan: FixedSteps
    opt: Optimization
    records: Records
    checkpoints: Checkpoints
    flags: StepFlags

    @property
    def stopped(self) -> bool:
        return self.flags.stopped

    def finished(self, step: int) -> bool:
        """The loop's stop: its last step is done, or a signal stopped the run (its checkpoint written)."""
        return self.plan.done(step) or self.flags.stopped

    def _last(self, step: int, epoch_end: bool) -> bool:
        return self.plan.is_last(step) and not epoch_end  # fine-tuning's last step ends its last epoch

    def account(self, loop: LoopState, step_sums: torch.Tensor, bad: torch.Tensor, epoch_end: bool = False) -> None:
        """After a step's optimizer step: count it, add its log sums, and act on the flags due (stop, skipped
        steps, the clock), all of them when a checkpoint follows."""
        loop.step, loop.steps_in_window = loop.step + 1, loop.steps_in_window + 1
        loop.comm_bytes += self.opt.net.comm_bytes_per_step(loop.step)
        self.records.add(step_sums, bad)
        due = self.checkpoints.due(loop.step, self._last(loop.step, epoch_end), epoch_end)
        self.flags.end_step(loop.step, bad, flush=due, save=lambda: self.checkpoints.save_now(loop))

    def log(self, loop: LoopState, epoch_end: bool = False) -> None:
        """A log line every --log-every steps, and after the run's last."""
        if self._last(loop.step, epoch_end) or loop.step % self.session.run_cfg.log_every == 0:
            self.records.log_window(loop, self.opt.lr, self.opt.optim.lr, self.flags.skipped)

    def evaluate(self, step: int) -> None:
        """The held-out evaluation (pretraining's) every --eval-every steps, or else with each checkpoint
        (before it: its model card shows it); and after the run's last step."""
        spec, last = self.records.spec, self._last(step, False)
        if self.records.evaluation is not None:
            every = spec.eval_every
            if last or (step % every == 0 if every else self.checkpoints.due(step, last, False)):
                self.records.evaluate(step)

    def save(self, loop: LoopState, epoch_end: bool = False) -> Path | None:
        """The checkpoint the Checkpointer finds due (or a signal's); at an ``epoch_end`` (fine-tuning) the
        epoch's own follows its evaluation instead. Return its path, if one."""
        last = self._last(loop.step, epoch_end)
        return self.checkpoints.save(loop, last=last, epoch_end=epoch_end, force=self.flags.stopped)

    def rebalance(self, loop: LoopState) -> bool:
        """After the balancer's timed steps (--balance auto): each rank's new batch size, said on the
        console. Return whether the sizes changed (the loop then shares its batches anew)."""
        balanced = self.opt.balancer.end_step(loop.sizes)
        if balanced is None or balanced[0] == loop.sizes:
            return False
        self.records.write(describe_balance(loop.sizes, *balanced, self.records.spec.unit))
        loop.sizes = balanced[0]
        return True

    def flush(self, loop: LoopState) -> None:
        """At the end of an epoch: every queued step's flags acted on (a stop saves here)."""
        self.flags.flush(lambda: self.checkpoints.save_now(loop))

    def interrupted(self, step: int) -> launch.Interrupted:
        return self.flags.interrupted(step)

    def close(self) -> None:
        try:
            self.checkpoints.checkpointer.close()  # the last checkpoint is written before the run ends
        finally:
            self.session.stop.restore()
            self.records.close()


def build_run(session: Session, task: Task) -> Run:
    """The shared parts of a run, in order, around the ``task`` (made whole: its loop resumed, its model spread):
    the optimization (restored on resume), the start line with the task's warnings before it, the records, the
    checkpoints and the step flags."""
    opt = Optimization(session, task)
    for warning in task.warnings:
        session.warn(warning)
    line = task.start_line()  # on every process: the parameter count is a collective under pipeline parallelism
    if session.is_main:
        print(line, flush=True)
    records = Records(session, task)
    checkpoints = Checkpoints(session, task, opt, records)
    flags = StepFlags(session, checkpoints.checkpointer, task.meter, records.write)
    return Run(session, task.steps, opt, records, checkpoints, flags)
