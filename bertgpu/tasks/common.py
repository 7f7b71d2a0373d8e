"""What every training task does around its loop, written once for pretrain and finetune.

Before any process starts (in the command's process):

- ``check_out_dir``: a non-empty output directory needs --resume or --overwrite;
- ``parallel.layout.check_layout``: the processes, --tp, --strategy and precision fit each other and the model;
- ``run_workers``: train here (one process, or a worker of torchrun) or in local workers (evaluate and
  predict: ``run_local_workers``).

Inside every worker, a ``TrainingRun``: the process group and its mesh, the run directory, the
checkpoint to resume from, the dropout RNG, the model spread over the processes, its optimizer,
stop signals, skipped non-finite steps, restoring resumable checkpoints and the state they hold, and
the tail of every optimizer step (``after_step``: the step itself, then log, evaluation, and the
checkpoint its ``checkpoint.Checkpointer`` finds due). Where a loop is lives in a ``LoopState`` (step,
epoch, data position, counters), which a checkpoint saves and a resumed run loads. The loops themselves
(``pretrain.train``, ``finetune.train``) keep only what is theirs: data, model, loss and records, and
their stop, one condition (``while not run.finished(step)``; a signal sets ``run.stopped`` once its
checkpoint is written, and the process then exits with ``run.interrupted``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .. import checkpoint, memory, model_card
from ..config import AdapterConfig, ModelConfig, OptimConfig, TrainingConfig, accumulation, parse_nnodes
from ..errors import UserError
from ..metrics import Sums, Throughput, peak_memory_mb
from ..optim import build_optimizer, build_schedule, optimizer_step
from ..parallel import ParallelModel, launch, parallelize
from ..parallel.balance import Balancer
from ..parallel.balance import describe as describe_balance
from ..parallel.compression import Compression
from ..parallel.layout import check_layout, cpu_oversubscription
from ..parallel.rng import gather_rng_states, restore_rng_state
from ..precision import allow_tf32, autocast, resolve_precision
from ..runlog import RunLog, console_is_tty, format_duration
from ..signals import LaggedFlags, StopSignal


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


def run_workers(train: Callable[[Any], Any], cfg: TrainingConfig) -> None:
    """``run_local_workers`` for a training command: its workers are restarted --max-restarts times on a
    failure (each restart resumes), and with --nnodes they meet those of the other machines."""
    run = cfg.run
    if launch.launched_externally():
        launch.worker_main(train, cfg)
        return
    nproc = launch.resolve_nproc(run.nproc, run.device)
    nnodes = parse_nnodes(run.nnodes)
    if nproc == 1 and run.max_restarts == 0 and nnodes == (1, 1):
        launch.worker_main(train, cfg)
    else:
        launch.launch(
            launch.worker_main,
            (train, cfg),
            nproc,
            max_restarts=run.max_restarts,
            nnodes=nnodes,
            rdzv_endpoint=run.rdzv_endpoint,
            run_id=run.rdzv_id or (launch.elastic_run_id(cfg.out) if nnodes[1] > 1 else ""),
            last_call=run.rdzv_last_call,
            heartbeat=run.rdzv_heartbeat,
        )


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
class Records:
    """What a task logs (``TrainingRun.start``): the values of its log window and their console line;
    the run adds the values every task logs (learning rate, rates, memory, ...)."""

    values: Callable[[dict[str, float]], dict[str, Any]]  # the window's sums -> the task's values
    line: Callable[[int, dict[str, Any]], str]  # (step, every value) -> the console line
    unit: str  # what a batch holds ("sequence", "example"): the balancer's word, and the sums' key plus s
    extra: dict[str, Any] = field(default_factory=dict)  # logged after the learning rates (pretraining's batch)
    card_keys: tuple[str, ...] = ()  # the last logged values a checkpoint's model card shows
    evaluate: Callable[[int], None] | None = None  # the held-out evaluation of a step (pretraining)
    eval_every: int = 0  # evaluate every N steps (0: with every checkpoint)


class TrainingRun:
    """One worker's side of a training run: everything around the loop that pretrain and finetune share.

    ``cfg`` is the sections every training config has (``TrainingConfig``: ``out``, ``parallel`` and
    ``run``, a ``RunConfig``: device, nproc, precision, seed, save/log cadence, resume, overwrite,
    max_bad_steps); the ``task`` passes what is its own: its name, fine-tuning's ``adapter``, pretraining's
    --recipe fast (``cpu_bf16``). A restart by torchrun --max-restarts (or our --max-restarts) resumes by
    itself. When to save, and the saving, is the ``checkpointer``'s (``checkpoint.Checkpointer``).

    The loop calls, in order: ``parallelize`` (the model), ``build_optimizer`` (optimizer, scaler and
    schedule, restored on resume), ``track`` (its log sums), ``resume_loop`` (its ``LoopState``),
    ``checkpoints`` (what a checkpoint holds), ``start``, then ``after_step`` after the forward and
    backward passes of every step while not ``finished``, and ``close``.
    """

    def __init__(
        self,
        cfg: TrainingConfig,
        model_config: ModelConfig,
        task: str = "pretrain",
        *,
        adapter: AdapterConfig | None = None,
        cpu_bf16: bool = False,
    ):
        self.cfg = cfg
        self.run_cfg = cfg.run
        self.task = task
        self.env = launch.init(cfg.run.device)
        self.device = self.env.device
        self.is_main = self.env.is_main
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
        # The plain values of the checkpoint (data position, records, RNGs); the loop reads its own.
        self.state: dict[str, Any] | None = None
        if self.resume_from is not None:
            self.state = checkpoint.load_training_state(self.resume_from)
        self.start_step = self.state["step"] if self.state else 0

        self.stop = StopSignal()
        self.flags = LaggedFlags(self.device)
        self.balancer = Balancer(self.device, enabled=cfg.parallel.balance == "auto")
        self.skipped = 0
        self.bad_in_a_row = 0
        self.checkpointer = checkpoint.Checkpointer(self.out, cfg.run)
        self.stopped = False  # a signal reached some process: the checkpoint is written, the loop ends
        self.sums: dict[str, Sums] = {}  # the loop's running sums by their checkpoint key; the first is the log's
        self.log: RunLog | None = None
        self.bar: tqdm | None = None

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

    def warn_if_batch_too_big(
        self,
        model: torch.nn.Module,
        config: ModelConfig,
        seq_length: int,
        prediction_slots: int = 0,
        examples: int | None = None,
    ) -> None:
        """Before the first step (rank 0): one line when a step's estimated memory (``memory``: the state of
        ``model``, of ``config``'s shape; the activations of this rank's micro-batch of ``seq_length``-token
        sequences and of the masked-LM head's ``prediction_slots`` per sequence) exceeds what the device
        has. On CPU the machine's processes share its memory. ``examples``: all the data there is, when a rank's
        batch can be no larger than its share of it (fine-tuning on fewer rows than --batch-size)."""
        if not self.is_main:
            return
        dims, parallel = self.dims, self.cfg.parallel
        sizes, _ = accumulation(self.run_cfg, dims.dp)
        batch = sizes[dims.dp_rank]
        if examples is not None:
            batch = max(1, min(batch, -(-examples // dims.dp)))
        state = memory.state_bytes(model, dims.tp * dims.pp * (dims.dp if dims.fsdp else 1))
        activations = memory.activation_bytes(
            config,
            batch,
            seq_length,
            self.precision,
            self.device.type,
            prediction_slots=prediction_slots,
            tp=dims.tp,
            pp=dims.pp,
            activation_checkpointing=parallel.activation_checkpointing,
        )
        processes = self.env.local_world_size if self.device.type == "cpu" else 1
        message = memory.batch_warning(
            state,
            activations,
            memory.available_bytes(self.device),
            processes,
            f"a batch of {batch} x {seq_length} tokens per process on {self.device.type}",
            parallel.activation_checkpointing,
        )
        if message:
            self.warn(message)

    def parallelize(
        self, model: torch.nn.Module, total_steps: int, compile: bool = False, seq_length: int | None = None
    ) -> ParallelModel:
        """Spread ``model`` (the same weights on every process) over the processes; seed dropout: the
        processes of one tensor-parallel group draw the same masks, each data-parallel rank its own.
        ``seq_length``: the longest a batch's sequences can be, when batches differ in length."""
        parallel = self.cfg.parallel
        compression = Compression(
            parallel.grad_compression, parallel.powersgd_rank, parallel.powersgd_warmup or max(2, total_steps // 10)
        )
        self.net = parallelize(
            model,
            self.dims,
            self.device,
            precision=self.precision,
            activation_checkpointing=parallel.activation_checkpointing,
            compile=compile,
            compression=compression,
            seed=self.run_cfg.seed,
            pipeline=parallel,
            seq_length=seq_length,
            cuda_graphs=self.run_cfg.cuda_graphs,
        )
        torch.manual_seed(self.run_cfg.seed + 1 + self.dims.dp_rank)
        return self.net

    def build_optimizer(self, optim: OptimConfig, sample_forward: Callable[[], Any]) -> None:
        """The optimizer of the parallelized model (``optim``: its peak rate and steps already this run's),
        the gradient scaler and the schedule, all restored on resume."""
        self.optim = optim
        self.optimizer = build_optimizer(self.net.model, optim, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.restore(sample_forward)
        self.schedule = build_schedule(self.optimizer, optim, self.start_step)

    def restore(self, sample_forward: Callable[[], Any]) -> None:
        """On resume: the optimizer state (whatever layout wrote it), the gradient scaler, this
        process's RNG and PowerSGD's state (same layout only). ``sample_forward`` runs the model on a
        batch, for PowerSGD's silent first step (``ParallelModel.settle_buckets``)."""
        if self.state is None:
            return
        net = self.net
        checkpoint.load_optimizer_state(net.model, self.optimizer, self.resume_from)
        self.scaler.load_state_dict(self.state["scaler"])
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
        anew = hash((self.run_cfg.seed, self.dims.dp_rank, self.start_step)) % 2**63
        restore_rng_state(self.state["rng"], self.env.rank, self.layout, self.device, anew)

    def track(self, names: tuple[str, ...], *keys: str) -> list[Sums]:
        """Running sums of ``names``, one for each checkpoint key in ``keys`` (the first: the log window's),
        restored on resume; ``after_step`` adds every step's values to each."""
        for key in keys:
            self.sums[key] = Sums(self.device, *names)
            if self.state is not None:
                self.sums[key].restore(self.state[key], self.dims)
        return [self.sums[key] for key in keys]

    def resume_loop(self, loop: LoopState, same_batches: bool = True) -> None:
        """``loop`` where the checkpoint left it, and the per-rank batch sizes --balance auto chose
        (unless the global batch changed: ``same_batches`` False)."""
        loop.step = self.start_step
        state = self.state
        if state is None:
            return
        loop.load_state_dict(state)
        balanced = state.get("balanced") and len(state.get("batch_sizes", ())) == self.dims.dp
        if same_batches and self.balancer.enabled and balanced:
            loop.sizes, self.balancer.enabled = list(state["batch_sizes"]), False

    def checkpoints(
        self,
        model_config: ModelConfig,
        *,
        vocab_path: str | Path,
        do_lower_case: bool,
        fixed: dict[str, Any],
        architecture: str | None = None,
        settle: Callable[[Any], tuple[Any, dict[str, Any]]] | None = None,
    ) -> None:
        """What every checkpoint of the run holds besides the loop's state: the model and optimizer, the
        model's config and vocab, and ``fixed``, the state that stays the same for the whole run. ``settle``:
        the task's config with the values it settled at run time, and notes for bertgpu.json (``ran_config``)."""
        self.model_config, self.fixed, self.settle = model_config, fixed, settle
        self.checkpointer.set_contents(
            self.net.model,
            self.optimizer,
            model_config,
            self.cfg,
            vocab_path=vocab_path,
            do_lower_case=do_lower_case,
            architecture=architecture,
        )

    def ran_config(self) -> tuple[Any, dict[str, Any]]:
        """The run's config as it runs, which its checkpoints record (bertgpu.json, the model card) so that
        ``--config bertgpu.json`` repeats it: --precision resolved, and what the task settled at run time
        (pretraining's --recipe fast and --time-budget); with the notes bertgpu.json keeps beside it."""
        cfg, notes = self.settle(self.cfg) if self.settle is not None else (self.cfg, {})
        return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, precision=self.precision)), notes

    def finished(self, step: int) -> bool:
        """The loop's stop: its last step is done, or a signal stopped the run (its checkpoint written)."""
        return step >= self.total_steps or self.stopped

    def start(self, line: str, total_steps: int, meter: Throughput, records: Records, loop: LoopState) -> None:
        """Print the start line (rank 0), open the log and the progress bar; the throughput ``meter``
        leaves out what the restored log window counted before this process started."""
        self.meter, self.records = meter, records
        self.flags.waits = meter.waits  # the host's waits on the device, beside the loop's on data
        if self.state is not None:
            key, window = next(iter(self.sums.items()))
            carried = dict(zip(window.names, self.state[key].tolist()))
            meter.carry(
                loop.steps_in_window,
                int(carried[f"{records.unit}s"]),
                int(carried["tokens"]),
                int(carried.get("masked", 0)),
            )
        self.total_steps = total_steps
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

    def after_step(self, loop: LoopState, step_sums: torch.Tensor, epoch_end: bool = False) -> Path | None:
        """The tail of every optimizer step, once the loop's forward and backward passes are done and its
        data position moved on: the optimizer step, the step's records, then a log line every --log-every
        steps, the held-out evaluation (pretraining's) every --eval-every steps or else with each checkpoint
        (before it: its model card shows it), and the checkpoint the ``checkpointer`` finds due; all three
        after the run's last step. At an ``epoch_end`` (fine-tuning) the epoch's evaluation and checkpoint
        follow instead. A signal that reached some process writes a checkpoint and ``stopped`` the run.
        Return the checkpoint written, if one."""
        net = self.net
        bad = optimizer_step(net, self.optimizer, self.scaler, self.schedule, self.optim.clip, self.precision)
        loop.step, loop.steps_in_window = loop.step + 1, loop.steps_in_window + 1
        loop.comm_bytes += net.comm_bytes_per_step(loop.step)
        self.bar.update(1)
        kept = torch.where(bad > 0, 0.0, step_sums)  # a skipped step's loss is not logged
        for sums in self.sums.values():
            sums.add(kept)
        step, last, checkpointer = loop.step, loop.step == self.total_steps and not epoch_end, self.checkpointer
        self.end_step(loop, bad, flush=checkpointer.due(step, last, epoch_end))
        save = checkpointer.due(step, last, epoch_end)  # the clock's flag, just read, may have made one due
        if last or step % self.run_cfg.log_every == 0:
            self._log(loop)
        records, every = self.records, self.records.eval_every
        if records.evaluate is not None and (last or (step % every == 0 if every else save)):
            self.meter.pause()  # the rates cover training steps only
            records.evaluate(step)
            self.meter.resume()
        return checkpointer.save(step, lambda: self.snapshot(loop), last=last, epoch_end=epoch_end, force=self.stopped)

    def _log(self, loop: LoopState) -> None:
        """A log line of the window since the last one: the task's values, then every task's."""
        key, window = next(iter(self.sums.items()))
        gpu = self.device.type == "cuda"
        with self.meter.waits.on("device") if gpu else contextlib.nullcontext():  # waits for the queued steps
            s = window.read(self.dims)
        records = self.records
        unit = f"{records.unit}s"
        rates = self.meter.rates(loop.steps_in_window, int(s[unit]), int(s["tokens"]), int(s.get("masked", 0)))
        values = {
            **records.values(s),
            "lr": self.schedule.get_last_lr()[0],
            "peak_lr": self.optim.lr,
            **records.extra,
            "epoch": loop.epoch,
            "skipped_steps": self.skipped,
            "layout": self.dims.describe(),
            "peak_memory_mb": self.peak_memory_mb(),
            **({"peak_memory_mb_per_stage": self.stage_peak_memory_mb()} if self.dims.pp > 1 else {}),
            "comm_bytes_per_step": loop.comm_bytes / max(loop.steps_in_window, 1),
            **rates,
        }
        loop.steps_in_window = loop.comm_bytes = 0
        self.log.log(loop.step, values, records.line(loop.step, values), write=self.write)

    def rebalance(self, loop: LoopState) -> bool:
        """After the balancer's timed steps (--balance auto): each rank's new batch size, said on the
        console. Return whether the sizes changed (the loop then shares its batches anew)."""
        balanced = self.balancer.end_step(loop.sizes)
        if balanced is None or balanced[0] == loop.sizes:
            return False
        self.write(describe_balance(loop.sizes, *balanced, self.records.unit))
        loop.sizes = balanced[0]
        return True

    def snapshot(self, loop: LoopState) -> checkpoint.Snapshot:
        """What a checkpoint of the loop's step holds besides model and optimizer: the loop's state, the
        run's fixed state and running sums, the scaler, every process's RNG and the layout; this process's
        own tensors; the model card. Every process calls this (it gathers)."""
        values = {
            **loop.state_dict(),
            **{key: sums.gathered(self.dims) for key, sums in self.sums.items()},
            **self.fixed,
            "balanced": self.cfg.parallel.balance == "auto" and not self.balancer.enabled,
            "scaler": self.scaler.state_dict(),
            "rng": gather_rng_states(self.device, self.layout),
            "layout": list(self.layout),
            "layout_name": self.dims.describe(),
        }
        metrics = self.log.latest(*self.records.card_keys) if self.records.card_keys else None
        config, notes = self.ran_config()
        card = model_card.render(
            self.task,
            config,
            loop.step,
            self.model_config,
            self.dims.describe(),
            metrics,
            asked_precision=self.cfg.run.precision,
            time_budget=notes.get("time_budget", ""),
            global_batch=self.fixed.get("global_batch"),
        )
        return checkpoint.Snapshot(values, self.net.rank_state_dict(), card, config, notes or None)

    def save_now(self, loop: LoopState) -> Path:
        """A checkpoint of the loop's step, due or not (a stop, a failing run, an epoch's end)."""
        return self.checkpointer.write(loop.step, lambda: self.snapshot(loop))

    def end_step(self, loop: LoopState, bad: torch.Tensor, *, flush: bool) -> None:
        """After every optimizer step: queue its flags (was it skipped; was any process asked to stop; is
        --save-every-minutes up by rank 0's clock) and act on those due, which are the previous step's on a
        GPU (no wait) and all of them when ``flush`` (a checkpoint follows, which must account for every
        step it holds)."""
        clock = self.checkpointer.clock()
        asked = launch.all_reduce_sum(
            torch.stack([torch.full((), float(v), device=self.device) for v in (self.stop.signum > 0, clock)])
        )
        due = self.flags.push(loop.step, torch.cat([asked, bad.reshape(1)]))
        if flush or any(values[0] or values[1] for _, values in due):
            due += self.flags.flush()  # a checkpoint follows: it must account for every step it holds
        self._act_on(due, loop)

    def flush(self, loop: LoopState) -> None:
        """At the end of an epoch: act on every queued step's flags. A stop signal among them writes the
        checkpoint here and stops the run (resumed, it starts with this epoch's evaluation)."""
        if self.stopped:
            return
        self._act_on(self.flags.flush(), loop)
        if self.stopped:
            self.save_now(loop)

    def _act_on(self, due: list[tuple[int, list[float]]], loop: LoopState) -> None:
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
            if self.precision != "fp16" and self.bad_in_a_row >= self.run_cfg.max_bad_steps:
                self.flags.flush()  # the steps after it are skipped too: nothing is lost by not reading them
                path = self.save_now(loop)
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

    def summary(self, step: int, keys: dict[str, str], where: str) -> None:
        """The closing lines of a run (rank 0): the steps and time, each logged metric of ``keys`` from its
        first to its last value with the best, and where the result is."""
        if not self.is_main:
            return
        took = format_duration(time.perf_counter() - self.started)
        # A resumed run's log holds the steps before (runlog.RunLog): the lines cover the whole run.
        when = f"(this start: {self.start_step:,} -> {step:,} in {took})" if self.start_step else f"in {took}"
        lines = [f"bertgpu {self.task}: done, steps 0 -> {step:,} {when}"]
        lines += [f"  {line}" for line in (self.log.summary(keys) if self.log else [])]
        lines.append(f"  {where}")
        print("\n".join(lines), flush=True)

    @contextlib.contextmanager
    def forward_context(self, micro_batch: dict[str, torch.Tensor]):
        """Around a micro-batch's forward pass: autocast to the run's precision, and the pass timed for
        ``--balance auto`` (by the micro-batch's examples)."""
        with autocast(self.precision, self.device), self.balancer.forward(len(micro_batch["input_ids"])):
            yield

    def peak_memory_mb(self) -> float:
        """The largest peak memory of any process (a collective: call it at the same step everywhere)."""
        peak = torch.full((), peak_memory_mb(self.device), dtype=torch.float64, device=self.device)
        return launch.all_reduce_max(peak).item()

    def stage_peak_memory_mb(self) -> list[float]:
        """The largest peak memory of each pipeline stage's processes (a collective, as ``peak_memory_mb``)."""
        peaks = torch.zeros(self.dims.pp, dtype=torch.float64, device=self.device)
        peaks[self.dims.pp_rank] = peak_memory_mb(self.device)
        return launch.all_reduce_max(peaks).tolist()

    def warn(self, message: str) -> None:
        if self.is_main:
            print(f"bertgpu: warning: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        try:
            self.checkpointer.close()  # the last checkpoint is written before the run ends
        finally:
            self.stop.restore()
            if self.bar is not None:
                self.bar.close()
            if self.log is not None:
                self.log.close()
