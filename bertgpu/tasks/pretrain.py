"""`bertgpu pretrain`: masked LM + next-sentence prediction, spread over processes.

``run`` checks everything a user can get wrong before any process starts, then trains in this
process or in ``nproc`` workers. ``train`` is the training loop of one worker, top to bottom (``Pretraining``
makes its part of the run from the config first, ``common.build_run`` the rest); ``train_step`` is one
optimizer step (forward and backward, clip, the optimizer step, zero, the schedule), ``log_line`` a line of
the log. How the model is spread over the processes (data parallel, FSDP, tensor
and pipeline parallel) is ``bertgpu.parallel``'s business, and what every training task does around its loop (resume,
checkpoints, stop signals, skipped steps, records) is ``tasks.common``'s parts.

Nothing is lost: checkpoints are atomic; ``--resume`` (or a restart by torchrun/our launcher)
continues from the latest complete checkpoint with the model, optimizer, schedule, scaler, every
rank's RNG and the exact data position (epoch, instances of it trained) restored, so the resumed
run is the uninterrupted run, bit for bit on CPU, with any layout of the same global batch. With
another global batch it continues from the same instance of the epoch. SIGINT/SIGTERM finish the
current step, write a checkpoint and exit non-zero.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertgpu.checkpoints import checkpoint, hf_dir
from bertgpu.config import OptimConfig, PretrainConfig
from bertgpu.data.heldout import DocumentSubset, EvalSet, heldout_documents, split_documents
from bertgpu.data.loader import run_loader
from bertgpu.data.pretraining import (
    IGNORE_INDEX,
    GlobalBatchSampler,
    PretrainingDataset,
    check_nsp_possible,
    token_counts,
    warn_wwm_fallback,
)
from bertgpu.data.shards import ShardedCorpus, warn_if_unknown
from bertgpu.data.tokenizer import load_vocab, vocab_sha256
from bertgpu.errors import UserError, did_you_mean
from bertgpu.models import architectures
from bertgpu.models.config import EncoderConfig
from bertgpu.models.interface import EncoderModel
from bertgpu.models.layers import use_bf16_stream
from bertgpu.parallel import ParallelModel, WholeModel, launch
from bertgpu.parallel.compression import describe as describe_compression
from bertgpu.parallel.layout import check_layout
from bertgpu.paths import real, refuse_clobbering
from bertgpu.tasks import continuation
from bertgpu.tasks.checks import check_pretrain_flags
from bertgpu.tasks.common import LogSpec, LoopState, Run, Session, build_run, spread, warn_if_batch_too_big
from bertgpu.tasks.model_dirs import hub_hint, model_directory
from bertgpu.tasks.prelaunch import (
    announce_resume,
    check_out_dir,
    parse_nnodes,
    resolve_device,
    run_workers,
    warn_before_start,
)
from bertgpu.training import drift, evaluation, recipe
from bertgpu.training.batch import accumulation, peak_lr
from bertgpu.training.budget import parse_duration
from bertgpu.training.metrics import Throughput, describe_waits
from bertgpu.training.optim import describe_lr
from bertgpu.training.plan import BudgetSteps, FixedSteps
from bertgpu.training.precision import peak_flops
from bertgpu.training.runlog import describe_batch, format_duration, format_rate
from bertgpu.training.step import (
    LOG_SUMS,
    MODEL_INPUTS,
    drop_full_mask,
    pretraining_loss,
    pretraining_objective,
    real_tokens,
)


@dataclass
class Plan:
    """What ``check`` worked out from the config: the model to build, where its weights come from, and the
    prepared data, opened once."""

    model_config: EncoderConfig
    init_from: Path | None  # a BERT directory whose weights to start from
    corpus: ShardedCorpus

    @property
    def lowercase(self) -> bool:
        return bool(self.corpus.meta.get("lowercase", True))


def _check_same_vocab(model_dir: Path, corpus: ShardedCorpus, data_dir: str) -> None:
    if (model_dir / "vocab.txt").exists() and vocab_sha256(model_dir / "vocab.txt") != corpus.vocab_sha256:
        raise UserError(
            f"{data_dir} was prepared with another vocab than the model's ({model_dir / 'vocab.txt'}); "
            f"run `bertgpu prepare` with --vocab {model_dir / 'vocab.txt'}"
        )


def _check_same_data(checkpoint_dir: Path, corpus: ShardedCorpus, data_dir: str) -> None:
    """A resumed run goes on over the data it trained on, as fine-tuning's does: its position (epoch, instance) and
    held-out documents mean nothing in other data. Told by the shards' identity its checkpoint recorded (a copy or
    a move of the same shards is the same data), or, in a checkpoint from before that, by its config's path."""
    record = checkpoint.read_run_record(checkpoint_dir)
    saved = record["config"].get("data") if record else None
    was = saved.get("data") if isinstance(saved, dict) else None
    if not was:
        return
    identity = checkpoint.load_training_state(checkpoint_dir).get("data_identity")
    same_path = real(was) == real(data_dir)
    if (identity == corpus.identity) if identity is not None else same_path:
        return
    raise UserError(
        f"cannot resume from {checkpoint_dir}: it was trained on --data {was}, now --data {data_dir}"
        + (" (prepared again since: other shards)" if same_path else "")
        + "; resume with the same data, or start afresh with --overwrite"
    )


def check(cfg: PretrainConfig) -> Plan:
    """Every user mistake we can see before training, as a UserError. No side effects."""
    model_path = None if cfg.model in architectures.presets(cfg.arch) else cfg.model
    refuse_clobbering(
        {"--out": cfg.out}, {"--model": model_path, "--data": cfg.data.data, "--eval-data": cfg.heldout.eval_data}
    )
    corpus = ShardedCorpus(cfg.data.data)
    init_from = None
    model = cfg.model
    if model in architectures.presets(cfg.arch):
        mcfg = architectures.preset(cfg.arch, model, corpus.vocab_size, load_vocab(corpus.vocab_path))
    else:
        path = Path(model)
        if not path.exists():
            presets = architectures.presets(cfg.arch)
            raise UserError(
                f"--model {model}: no such preset, file or directory (presets: {', '.join(presets)})"
                + did_you_mean(model, presets)
                + hub_hint(model)
            )
        if path.is_dir():  # a pretraining run: its newest checkpoint (BERT's second phase starts from the first's)
            path = model_directory(model)
        mcfg = architectures.load_config(path)
        architectures.check_arch(cfg.arch, mcfg, f"--model {model}")
        if not architectures.of(mcfg).nsp and cfg.data.nsp:
            raise UserError(
                f"--model {model} is a {architectures.of(mcfg).title}, trained on masked LM only: add --no-nsp"
            )
        if path.is_dir():
            if (path / "model.safetensors").exists() or (path / "pytorch_model.bin").exists():
                init_from = path
            if (path / hf_dir.WEIGHTS_NAME).exists():
                hf_dir.check_weights(path)  # a damaged file: one line before --out is made
            _check_same_vocab(path, corpus, cfg.data.data)
        if mcfg.vocab_size != corpus.vocab_size:
            raise UserError(
                f"model vocab_size {mcfg.vocab_size} ({model}) differs from the data's vocab of "
                f"{corpus.vocab_size} tokens ({cfg.data.data}): the data was prepared with another vocab"
            )
    if cfg.data.max_seq_length > mcfg.max_position_embeddings:
        raise UserError(
            f"--max-seq-length {cfg.data.max_seq_length} is beyond the model's "
            f"{mcfg.max_position_embeddings} positions (max_position_embeddings)"
        )
    if cfg.data.nsp:
        check_nsp_possible(corpus)
    if cfg.run.fp8:
        from bertgpu.training.fp8 import check_fp8

        check_fp8(cfg.run.device)
    if cfg.dropout is not None:
        mcfg = architectures.with_dropout(mcfg, cfg.dropout)
    dims = check_layout(cfg, mcfg, cpu_bf16=recipe.cpu_bf16(cfg))
    heldout_split(cfg, corpus, None, dims.dp)
    resume_from = checkpoint.latest_checkpoint(cfg.out) if cfg.run.resume else None
    if resume_from is not None:
        _check_same_data(resume_from, corpus, cfg.data.data)
        _check_same_vocab(resume_from, corpus, cfg.data.data)
    return Plan(mcfg, init_from, corpus)


def _warn_if_packed_by_an_older_bertgpu(checkpoint_dir: Path, cfg: PretrainConfig) -> None:
    """A --pack run saved before rows were filled to the brim (no data.pack_attention in its bertgpu.json) goes
    on over rows cut another way: it cannot resume exactly, so say so rather than pretend."""
    record = checkpoint.read_run_record(checkpoint_dir)
    saved = record["config"].get("data") if record else None
    if cfg.data.pack and isinstance(saved, dict) and saved.get("pack") and "pack_attention" not in saved:
        print(
            f"bertgpu: warning: {checkpoint_dir} was packed by an older bertgpu (rows cut at sentence ends, attention "
            "across documents); the run goes on over today's packed rows, so its data order from here differs "
            "from what the old version would have trained",
            file=sys.stderr,
            flush=True,
        )


def heldout_split(
    cfg: PretrainConfig, corpus: ShardedCorpus, state: dict | None, dp: int
) -> tuple[ShardedCorpus | DocumentSubset, EvalSet | None, np.ndarray | None]:
    """(the text to train on, the evaluation set or None, the held-out document ids or None). A resumed
    run holds out the documents its checkpoint recorded, whatever --eval-fraction says now."""
    h = cfg.heldout
    documents = None
    if state is not None and state.get("heldout_documents") is not None:
        documents = state["heldout_documents"].numpy()
    elif h.eval_fraction:
        documents = heldout_documents(corpus.num_documents, h.eval_fraction, cfg.run.seed)
    if documents is not None:
        train_text, eval_text = split_documents(corpus, documents)
        where = f"{len(documents):,} held-out documents of {cfg.data.data}"
        if cfg.data.nsp and len(documents) < 2:
            raise UserError(
                f"--eval-fraction {h.eval_fraction:g} holds out {len(documents)} document of "
                f"{cfg.data.data}: next-sentence prediction needs 2; hold out more or use --no-nsp"
            )
    elif h.eval_data:
        train_text, eval_text, where = corpus, ShardedCorpus(h.eval_data), f"--eval-data {h.eval_data}"
        if eval_text.vocab_sha256 != corpus.vocab_sha256:
            raise UserError(
                f"--eval-data {h.eval_data} was prepared with another vocab than --data {cfg.data.data}: "
                f"prepare it with --vocab {corpus.vocab_path}"
            )
        if cfg.data.nsp:
            check_nsp_possible(eval_text)
    else:
        return corpus, None, None
    eval_set = EvalSet(eval_text, cfg.data, cfg.run.seed, h.eval_instances, where)
    eval_set.check_enough(dp)
    return train_text, eval_set, documents


def keep_model_arch(cfg: PretrainConfig, model_config: EncoderConfig) -> PretrainConfig:
    """A directory or config.json trained on without --arch keeps its own architecture (``check_arch`` refuses an
    --arch that contradicts it): the run records that one, and --recipe fast chooses for it."""
    arch = architectures.arch_of(model_config)
    return cfg if arch == cfg.arch else recipe.with_arch(cfg, arch)


def run(cfg: PretrainConfig) -> None:
    """Check the flags, plan (the recipe's values), check the rest, then train here (one process, or one worker of
    torchrun) or in local workers."""
    cfg = resolve_device(recipe.apply_fast_recipe(check_pretrain_flags(cfg)))
    plan = check(cfg)
    corpus, cfg = plan.corpus, keep_model_arch(cfg, plan.model_config)
    if plan.init_from is not None:  # a pretrained start: a head it lacks starts as recipe.for_continuation says
        cfg = recipe.for_continuation(cfg)
    if not launch.restarted(cfg.out) and parse_nnodes(cfg.run.nnodes)[1] == 1:  # many machines: rank 0 checks it
        check_out_dir(cfg.out, cfg.run.overwrite, cfg.run.resume)
        if int(os.environ.get("RANK", 0)) == 0:  # once per run: not again in every torchrun worker
            warn_wwm_fallback(corpus, cfg.data)
            warn_if_unknown(corpus.meta, cfg.data.data)
    if cfg.time_budget:  # in seconds; the run is finished once it took its last step
        length = ("--time-budget (seconds)", round(parse_duration(cfg.time_budget)), _saved_budget)
        finished = lambda state: _budget_spent(state, length[1])  # noqa: E731
    else:
        length = ("--steps", cfg.optim.steps, lambda saved: saved["config"]["optim"]["steps"])
        finished = lambda state: state["step"] >= cfg.optim.steps  # noqa: E731
    if announce_resume(cfg, *length, finished):
        return
    warn_before_start(cfg)
    # Once per run, as announce_resume: check() runs again in every worker.
    if cfg.run.resume and launch.restart_count() == 0 and int(os.environ.get("RANK", 0)) == 0:
        latest = checkpoint.latest_checkpoint(cfg.out)
        if latest is not None:
            _warn_if_packed_by_an_older_bertgpu(latest, cfg)
    run_workers(train, cfg)


def _budget_spent(state: dict, seconds: float) -> bool:
    """Whether a checkpoint's run took its last step within a budget at least ``seconds`` long."""
    budget = state.get("budget") or {}
    return bool(budget.get("done")) and budget["seconds"] >= seconds


def _saved_budget(saved: dict) -> int | None:
    """A checkpoint's --time-budget in seconds, from its bertgpu.json (beside the config; in it before issue 40)."""
    text = saved.get("time_budget") or saved["config"].get("time_budget")
    return round(parse_duration(text, bare_seconds=True)) if text else None  # a bare number: seconds, as it ran


@dataclass
class Loop(LoopState):
    """Where pretraining is: the epoch and how many of its instances are trained (its data position)."""

    instance: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": {"epoch": self.epoch, "instance": self.instance}, **super().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.epoch, self.instance = state["position"]["epoch"], state["position"]["instance"]


def train(cfg: PretrainConfig) -> Path:
    plan = check(cfg)
    session = Session(cfg, plan.model_config, "pretrain", cpu_bf16=recipe.cpu_bf16(cfg))
    task = Pretraining(cfg, plan, session)  # the data, the loop, the model spread, the steps, what is logged and saved
    run, loop, dataset, accum = build_run(session, task), task.loop, task.dataset, task.accum
    if task.start is not None and task.start.holds(cfg.head_warmup, task.steps):
        # fresh heads warm up alone, the encoder held: hooked once build_run has restored the optimizer state
        continuation.EncoderHold(task.net.model, run.opt.optimizer, run.opt.schedule, task.steps)
    device, dims, seed, global_batch = session.device, session.dims, cfg.run.seed, task.global_batch
    if task.evaluation is not None and session.resume_from is None:
        run.records.evaluate(0)  # the held-out curve starts from the untrained model
    saved, batches = session.resume_from, None
    run.plan.begin(loop.step)
    # One loader for the run: its workers live from the first epoch to the last (data.loader).
    loader, run_batches = run_loader(dataset, cfg.data.loader_workers, device.type == "cuda", seed)
    waits = run.records.meter.waits
    # A batch without any padding (packed sequences that all came out full) goes without its attention mask: SDPA's
    # fastest kernel. The pipeline's stages take a fixed set of tensors: they keep the mask.
    unmask = drop_full_mask if dims.pp == 1 else (lambda batch: batch)
    try:
        while not run.finished(loop.step):
            dataset.set_epoch(loop.epoch)
            sampler = GlobalBatchSampler(len(dataset), loop.sizes, dims.dp_rank, accum, seed, loop.epoch, loop.instance)
            run_batches.set(sampler, loop.epoch)
            batches = iter(loader)
            for _ in range(sampler.steps):
                run.plan.next(loop.step)  # --time-budget: how many steps fit by the clock (the last: this one)
                if run.finished(loop.step):  # the last step is done, or a signal stopped the run
                    break
                with waits.on("data"):
                    host = [unmask(next(batches)) for _ in range(accum)]
                micro = [{k: v if v is None else v.to(device, non_blocking=True) for k, v in mb.items()} for mb in host]
                step_sums, bad = train_step(run, micro, global_batch, cfg.data.nsp)  # forward, backward, optimizer
                loop.instance += global_batch
                run.account(loop, step_sums, bad)  # counted and recorded; its flags (stop, skipped, clock) read
                run.log(loop)  # every --log-every steps
                run.evaluate(loop.step)  # every --eval-every steps, or with each checkpoint
                saved = run.save(loop) or saved  # when due, and on a stop signal
                if run.rebalance(loop):
                    break  # a new sampler, from this instance on, with the new sizes
            if len(dataset) - loop.instance < global_batch:
                loop.epoch, loop.instance = loop.epoch + 1, 0
    finally:
        if batches is not None and hasattr(batches, "_shutdown_workers"):
            batches._shutdown_workers()  # stop DataLoader workers now, not during interpreter exit
        run.close()
    if run.stopped:
        raise run.interrupted(loop.step)  # the process exits with the signal's status, the checkpoint written
    run.records.summary(loop.step, summary_keys(cfg), summary_where(plan, saved))
    return saved


class Pretraining:
    """Pretraining's part of a run (``common.Task``), made whole from its config sections: the data (the held-out
    text apart, ``heldout_split``), the loop where the checkpoint left it, the model (``model_for``) spread over the
    processes, the step plan and the learning rate and warmup --recipe fast chose, what the log shows and what every
    checkpoint holds; with the micro-batches a step accumulates (``accum``) and the global batch."""

    def __init__(self, cfg: PretrainConfig, plan: Plan, session: Session):
        corpus, dims, device, seed = plan.corpus, session.dims, session.device, cfg.run.seed
        self.cfg, self.plan, self.session = cfg, plan, session
        if session.resume_from is not None:
            _check_same_vocab(session.resume_from, corpus, cfg.data.data)
        # Data: one global order per epoch; each data-parallel rank reads only its share of each global batch.
        # Held-out text (--eval-fraction, --eval-data) becomes a fixed evaluation set, never trained on.
        train_text, self.eval_set, heldout = heldout_split(cfg, corpus, session.state, dims.dp)
        self.dataset = PretrainingDataset(train_text, cfg.data, seed, load_vocab(corpus.vocab_path))
        sizes, self.accum = accumulation(cfg.run, dims.dp)  # --grad-accum, or what makes --global-batch here
        self.loop = Loop(sizes)  # the batch sizes per data-parallel rank
        self.global_batch = global_batch = sum(sizes) * self.accum
        if len(self.dataset) < global_batch:
            raise UserError(
                f"{cfg.data.data} gives {len(self.dataset)} instances per epoch, fewer than one global batch "
                f"of {global_batch} ({describe_batch(sizes, self.accum)})"
            )
        model = model_for(cfg, plan, session, train_text)
        # A pretrained start (not a --resume): what it lacks, its schedule (either recipe), a from-scratch rate warned
        self.start = None if plan.init_from is None else continuation.Start(plan.init_from, model)
        self.chosen, self.why = recipe.choose(cfg, plan.model_config, continued=self.start is not None)
        self.optim = dataclasses.replace(self.chosen, lr=peak_lr(self.chosen, global_batch))
        lr_warning = (
            None
            if self.start is None
            else recipe.continuation_warning(self.chosen.lr, self.optim.lr, self.chosen.lr_scaling)
        )
        # A continuation's fresh heads learn at a from-scratch rate, its pretrained encoder at the gentle one.
        self.lr_factor = None
        if self.start is not None:
            fresh_lr = recipe.fresh_head_lr(cfg, plan.model_config, global_batch)
            self.lr_factor = self.start.lr_factor(self.optim.lr, fresh_lr)
        self.steps = step_plan(cfg, session, self.optim, self.eval_set, global_batch)
        # MFU on the real tokens (padding is no work), against the card's own data-sheet peak or --peak-tflops.
        peak, peak_note = peak_flops(device, session.precision, cfg.peak_tflops)
        self.mfu_note = f"; MFU on real tokens, {peak_note}" if device.type == "cuda" or cfg.peak_tflops else ""
        self.meter = Throughput(
            functools.partial(architectures.training_flops, plan.model_config), peak, dims.world_size
        )
        self.files = checkpoint.ModelFiles(plan.model_config, corpus.vocab_path, plan.lowercase)
        self.fixed = {
            "global_batch": global_batch,
            "heldout_documents": None if heldout is None else torch.from_numpy(heldout),
            # Which prepared data the run trained and evaluated on: `bertgpu evaluate` says whether its --data is.
            "data_identity": corpus.identity,
            "eval_data_identity": (
                ShardedCorpus(cfg.heldout.eval_data).identity if self.eval_set is not None and heldout is None else None
            ),
        }
        self.net = spread(session, model, cfg.optim.steps, compile=cfg.run.compile)
        # Another global batch continues at the same instance, with the sizes it gives (not --balance auto's).
        same_batches = session.state is None or session.state["global_batch"] == global_batch
        self.balance = session.resume_loop(self.loop, same_batches=same_batches)
        nsp = cfg.data.nsp
        self.log = LogSpec(
            LOG_SUMS,
            ("log_sums",),
            "sequence",
            extra={"global_batch": global_batch},
            card_keys=("mlm_loss", "mlm_acc", *("nsp_loss", "nsp_acc") * nsp, *evaluation.SUMMARY_KEYS),
            eval_every=cfg.heldout.eval_every,
        )
        batch = cfg.heldout.eval_batch_size or max(self.loop.sizes)
        self.drift = run_drift(self.start, self.eval_set, session, self.fixed)
        self.evaluation = (
            None
            if self.eval_set is None
            else HeldOut(session, self.net, self.eval_set, batch, nsp, self.steps, moved=self.drift)
        )
        self.warnings: tuple[str, ...] = (lr_warning,) if lr_warning else ()

    def start_line(self) -> str:
        """The first line of a run: the model, layout, batch, learning rate (and, where --recipe fast chose it,
        why), length and data."""
        session, loop, eval_set, global_batch = self.session, self.loop, self.eval_set, self.global_batch
        dims, state, net, o, why = session.dims, session.state, self.net, self.chosen, self.why
        n_params = net.num_parameters()
        moved = ""
        if state is not None and state["global_batch"] != global_batch:
            moved = (
                f"; the global batch changed from {state['global_batch']} to {global_batch}: continuing at "
                f"instance {loop.instance:,} of epoch {loop.epoch}"
            )
        init_from = self.plan.init_from
        how = "starting" if init_from is None else f"starting from the weights of {init_from}"
        if self.start is not None:  # continued pretraining: the heads it lacks, the hold, the harm signal
            how += self.start.words(self.net.model, self.cfg, self.steps, self.drift, self.eval_set is not None)
        if session.resume_from:
            how = f"resuming from {session.resume_from} at step {loop.step}{session.layout_change()}{moved}"
        held = f", evaluated on {len(eval_set):,} instances of {eval_set.where}" if eval_set is not None else ""
        compressed = net.compression.kind != "none" and dims.dp > 1
        compressed = f", gradients {describe_compression(net.compression)}" if compressed else ""
        return (
            f"bertgpu pretrain: {n_params / 1e6:.1f}M parameters, {dims.describe()}{compressed}, on "
            f"{session.device.type}, {session.precision}, global batch {global_batch} = "
            f"{describe_batch(loop.sizes, global_batch // sum(loop.sizes))}, "
            f"{describe_lr(o.lr, peak_lr(o, global_batch), o.lr_scaling, global_batch, o.reference_batch)}"
            f"{' ' + why if why else ''}, warmup {f'{o.warmup:.0%}' if o.warmup < 1 else f'{o.warmup:g} steps'}, "
            f"{self.steps.describe()}, "
            f"{len(self.dataset):,} instances in epoch {loop.epoch}{held}; {how}"
        ) + self.mfu_note

    def log_values(self, sums: dict[str, float]) -> dict[str, float]:
        """MLM (and NSP) losses and accuracies; with a --time-budget, the training time so far."""
        return log_values(sums, self.cfg.data.nsp, self.steps if isinstance(self.steps, BudgetSteps) else None)

    def log_line(self, step: int, values: dict[str, Any]) -> str:
        # a --time-budget re-plans the total as it goes
        return log_line(step, values, self.steps.total, self.cfg.data.nsp, device=self.session.device.type)

    def sample_batch(self) -> dict[str, torch.Tensor]:
        """Two instances as a batch, for a step that only lays out DDP's buckets (settle_buckets)."""
        batch = torch.utils.data.default_collate([self.dataset[i] for i in range(2)])
        return {k: batch[k].to(self.session.device) for k in MODEL_INPUTS}

    def settle(self, cfg: PretrainConfig) -> tuple[PretrainConfig, dict[str, Any]]:
        """The run as it runs, for its checkpoints: the learning rate and warmup --recipe fast chose (before
        --lr-scaling), and the steps planned (--steps, or what --time-budget has planned so far: at the last
        checkpoint the steps taken). A budgeted run is recorded as a run of those steps, its budget beside the
        config (bertgpu.json's ``time_budget``), so that ``--config bertgpu.json`` repeats it step for step, with
        the same warmup share and decay to zero by steps rather than by the clock (docs/runs.md: Config files)."""
        optim = dataclasses.replace(self.chosen, steps=self.steps.total)
        if not cfg.time_budget:
            return dataclasses.replace(cfg, optim=optim), {}
        return dataclasses.replace(cfg, optim=optim, time_budget=""), {"time_budget": cfg.time_budget}


@dataclass
class HeldOut:
    """Pretraining's held-out evaluation (``common.Evaluation``): at a step, the masked-LM (and NSP) metrics of
    ``eval_set`` in batches of ``batch`` and their log line, which says when the model is still on the unigram
    plateau (once: ``warned``); on a continuation, how far the encoder moved from its start (``moved``)."""

    session: Session
    net: ParallelModel
    eval_set: EvalSet
    batch: int
    nsp: bool
    steps: FixedSteps
    warned: bool = False
    moved: drift.Drift | None = None  # a continuation's: how far the encoder moved from its start

    def __call__(self, step: int) -> tuple[dict[str, float], str]:
        session, eval_set = self.session, self.eval_set
        metrics = evaluation.evaluate_mlm(
            self.net, eval_set, session.dims, session.device, self.batch, self.nsp, session.precision
        )
        note, said = evaluation.plateau_note(
            metrics["eval_mlm_loss"], eval_set.unigram_loss(), step, self.steps.total, self.warned
        )
        self.warned |= said
        signal = warning = ""
        if self.moved is not None:
            metrics.update(self.moved.measure(self.net, session.device, self.batch, session.precision))
            signal, warning = self.moved.note(metrics[drift.KEY], step)
        return metrics, evaluation.describe(step, metrics, len(eval_set)) + signal + note + warning


def run_drift(
    start: continuation.Start | None, eval_set: EvalSet | None, session: Session, fixed: dict[str, Any]
) -> drift.Drift | None:
    """A continuation's harm signal (``training.drift``): on its held-out set, in a layout where every process
    computes the encoder's whole output, against the start's states, measured at the step-0 evaluation and kept in
    ``fixed`` (every checkpoint's; a resumed run's from its checkpoint: one written without them measures
    nothing)."""
    if start is None or eval_set is None or not drift.measurable(session.dims):
        return None
    saved = session.state
    if saved is not None and saved.get(drift.STATE_KEY) is None:
        return None
    instances = drift.Drift(eval_set, None if saved is None else saved[drift.STATE_KEY], fixed)
    return instances if len(instances) >= drift.MIN_SEQUENCES else None


def step_plan(
    cfg: PretrainConfig, session: Session, optim: OptimConfig, eval_set: EvalSet | None, global_batch: int
) -> FixedSteps:
    """--steps, or --time-budget: the steps and the learning rate follow the clock (``plan.BudgetSteps``)."""
    if not cfg.time_budget:
        return FixedSteps(optim)
    eval_steps = 0 if eval_set is None else len(eval_set) / global_batch / 3  # a forward pass: ~1/3 of a step
    return BudgetSteps(
        parse_duration(cfg.time_budget),
        optim,
        session.device,
        session.is_main,
        eval_cost=eval_steps,
        state=session.state,
        start_step=session.start_step,
    )


def summary_keys(cfg: PretrainConfig) -> dict[str, str]:
    """The logged values the closing lines show, and which way is better."""
    nsp = {"nsp_loss": "min", "nsp_acc": "max"} if cfg.data.nsp else {}
    return {"mlm_loss": "min", "mlm_acc": "max", **nsp, **evaluation.SUMMARY_KEYS}


def summary_where(plan: Plan, saved: Path) -> str:
    hf_class = architectures.class_names(plan.model_config)[0]
    return (
        f"checkpoint: {saved}  (a Hugging Face directory: "
        f"transformers.{hf_class}.from_pretrained('{saved}'); bertgpu fill-mask {saved} TEXT)"
    )


def model_for(
    cfg: PretrainConfig, plan: Plan, session: Session, train_text: ShardedCorpus | DocumentSubset
) -> EncoderModel:
    """``build_model``, then its kernels (flash attention's variable-length one on a GPU, the fused QKV,
    --fp8), and one line where a step looks too big for the device's memory."""
    model = build_model(cfg, plan, session.resume_from, train_text)
    if session.device.type == "cuda":
        # padded rows through flash attention's variable-length kernel (--document-bounds: see docs/bench.md)
        model.use_varlen_attention(cfg.run.document_bounds)
    model.use_fused_qkv(cfg.fused_qkv)  # Q, K and V as one matmul (a BERT's; ModernBERT's are one weight)
    if cfg.run.bf16_stream:  # the encoder layers' residual stream and LayerNorms in bf16 under autocast
        use_bf16_stream(model)
    if cfg.run.fp8:
        from bertgpu.training.fp8 import apply_fp8

        float8_layers = apply_fp8(model, session.device, cfg.run.fp8_recipe)
        if session.is_main:
            print(
                f"--fp8: {len(float8_layers)} linear layers in float8 (torchao, {cfg.run.fp8_recipe} scaling; not "
                f"the first and last encoder layers nor the heads), the rest in {session.precision}",
                flush=True,
            )
    warn_if_batch_too_big(session, model, plan.model_config, cfg.data.max_seq_length, cfg.data.max_predictions)
    return model


def build_model(
    cfg: PretrainConfig, plan: Plan, resume_from: Path | None, train_text: ShardedCorpus | DocumentSubset
) -> EncoderModel:
    """The model with the same initial weights on every process: the seed's (with --mlm-bias-init unigram, the
    decoder's bias from ``train_text``), or those of the checkpoint resumed or the model continued from (its
    masked-LM bias, when it has none, as a random model's)."""
    torch.manual_seed(cfg.run.seed)
    model = architectures.pretraining_model(plan.model_config, pad_vocab_multiple=cfg.pad_vocab_multiple)
    fresh = True  # the masked-LM bias starts from nothing: random weights, or a start without that head
    if resume_from is not None or plan.init_from is not None:
        missing, _ = hf_dir.load_weights(model, resume_from or plan.init_from)
        fresh = resume_from is None and continuation.fresh_bias(model, missing)
    if fresh and cfg.mlm_bias_init == "unigram":
        init_bias_to_unigram(model, train_text, cfg.run.seed)
    if cfg.data.pack and cfg.data.pack_attention == "document":  # the rows' masks number their documents
        architectures.use_document_attention(model)
    if not architectures.of(plan.model_config).nsp:  # ModernBERT: no pooler, no NSP head
        return architectures.prefer_flex_attention(model, cfg.run.device)
    if not cfg.data.nsp:  # MLM alone: the pooler and NSP head neither run nor get a gradient
        model.use_next_sentence(False)
    return model


def init_bias_to_unigram(model: torch.nn.Module, text: ShardedCorpus | DocumentSubset, seed: int) -> None:
    """--mlm-bias-init unigram: the decoder's bias of a fresh model set to each token's log frequency in the
    training text (add-half smoothed, so a token the sample lacks gets a finite, low score): the initial masked-LM
    loss is then the unigram plateau's (logits of the random tied embedding are near zero), where a zero bias
    starts at log(vocab) and spends the first steps of the warmup learning token frequencies."""
    bias = model.mlm_output_bias()
    if bias is None:
        return
    counts, total = token_counts(text, seed=seed)
    log_p = np.log((counts + 0.5) / (total + 0.5 * len(counts)))
    with torch.no_grad():  # padded vocab rows (their logits are cut off) keep their zeros
        bias[: len(log_p)].copy_(torch.from_numpy(log_p))


def train_step(
    run: Run, micro: list[dict[str, torch.Tensor]], global_batch: int, nsp: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over this rank's micro-batches: the forward and backward passes, the gradients
    unscaled and clipped, the optimizer step (a non-finite one skipped on the device), the gradients zeroed, the
    schedule moved on. Return the step's log sums (``LOG_SUMS`` order) and its skipped flag, both still on the
    device.

    The loss is the global batch's: the MLM loss summed over the masked tokens divided by the masked
    tokens of the whole global batch (counted over the data-parallel ranks first: the one small
    collective of a step outside the gradients), the NSP loss by its sentence pairs. Gradient
    reduction averages over the data-parallel ranks, hence the factor dp. Forward pass and loss are
    one function (``step.pretraining_objective``: one cross-entropy, the log's value its detached
    sum), compiled as one graph under --compile with one process (``WholeModel.forward_backward_objective``);
    with --compile-step the update (clip, optimizer step, zero) is compiled too, and on one GPU with CUDA graphs
    the whole step replays as one graph (``opt.run_step``: ``training.fused_step``).
    """
    opt = run.opt
    net = opt.net

    def forward_backward(micro: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        device, dims = micro[0]["input_ids"].device, net.dims
        n_masked = dims.dp_sum(sum((mb["mlm_labels"] != IGNORE_INDEX).sum() for mb in micro).float())
        zeros = torch.zeros(len(LOG_SUMS), dtype=torch.float64, device=device)
        if isinstance(net, WholeModel):
            return net.forward_backward_objective(
                micro,
                pretraining_objective,
                (*MODEL_INPUTS, "mlm_labels", "nsp_label"),
                zeros,
                context=opt.forward_context,
                scale=opt.scaler.scale,
                n_masked=n_masked,
                global_batch=global_batch,
                nsp=nsp,
            )
        # the pipeline's schedule calls the loss on the last stage (with the targets alone), apart from the sums

        def loss_and_sums(outputs, mb: dict[str, torch.Tensor], tokens=0) -> tuple[torch.Tensor, torch.Tensor]:
            return pretraining_loss(outputs, mb["mlm_labels"], mb["nsp_label"], n_masked, global_batch, nsp, tokens)

        return net.forward_backward(
            micro,
            MODEL_INPUTS,
            lambda outputs, mb: loss_and_sums(outputs, mb)[0],
            lambda outputs, mb: loss_and_sums(outputs, mb, real_tokens(mb["attention_mask"]))[1],
            zeros,
            context=opt.forward_context,
            scale=opt.scaler.scale,
        )

    def update() -> torch.Tensor:
        bad = opt.clip_grad_norm()  # unscaled and clipped; a non-finite norm flags the step to skip, on the device
        opt.step(bad)  # the optimizer step (skipped where bad)
        opt.zero_grad()
        return bad

    # the two halves as they are, or under --compile-step compiled, on one GPU one CUDA graph (``fused_step``)
    step_sums, bad = opt.run_step(forward_backward, update, micro)
    opt.schedule.step()  # the next step's learning rate
    return step_sums, bad


def log_values(s: dict[str, float], nsp: bool, budget: BudgetSteps | None = None) -> dict[str, float]:
    """Losses and accuracies from the sums of a log window (and the training time so far of a --time-budget)."""
    mlm = s["mlm_loss"] / max(s["masked"], 1)
    values = {"loss": mlm, "mlm_loss": mlm, "mlm_acc": s["mlm_correct"] / max(s["masked"], 1)}
    if nsp:  # without NSP its head is untrained and its figures would mean nothing
        values["nsp_loss"] = s["nsp_loss"] / max(s["sequences"], 1)
        values["nsp_acc"] = s["nsp_correct"] / max(s["sequences"], 1)
        values["loss"] = mlm + values["nsp_loss"]
    if budget is not None:
        values["train_seconds"] = budget.elapsed()
    return values


def log_line(step: int, values: dict, steps: int, nsp: bool, device: str = "cpu") -> str:
    line = f"step {step}/{steps} | loss {values['loss']:.4f} | mlm {values['mlm_loss']:.4f} acc {values['mlm_acc']:.3f}"
    if nsp:
        line += f" | nsp {values['nsp_loss']:.4f} acc {values['nsp_acc']:.3f}"
    eta = format_duration((steps - step) / values["steps_per_s"]) if values["steps_per_s"] > 0 else "?"
    line += (
        f" | lr {values['lr']:.2e} | batch {values['global_batch']} | {values['steps_per_s']:.2f} steps/s"
        f" | {format_rate(values['seq_per_s'])} seq/s | {format_rate(values['tokens_per_s'])} tok/s"
    )
    if "mfu" in values:
        line += f" | mfu {100 * values['mfu']:.1f}%"
    if values.get("comm_bytes_per_step"):
        line += f" | grads {values['comm_bytes_per_step'] / 2**20:.2f} MiB/step"
    line += f" | peak mem {values['peak_memory_mb'] / 1024:.2f} GiB | eta {eta}"
    return line + describe_waits(values, device)
