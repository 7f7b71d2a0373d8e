"""`bertgpu finetune`: from a pretrained BERT to a classifier people use.

``run_finetune`` checks everything a user can get wrong before any process starts, then works in
this process or in ``nproc`` workers. ``train`` is the whole fine-tuning loop of one worker, top to
bottom (``FineTuning`` makes its part of the run from the config first, ``common.build_run`` the rest):
data-parallel steps (``train_step``: forward and backward, clip, the optimizer step, zero, the schedule, spread
over the processes by ``bertgpu.parallel``, as pretraining is), an evaluation after
every epoch (``end_epoch``, with ``tasks.sharded_eval``), checkpoints kept by the chosen metric, and the best
one as the final output. What every training task does around its loop (resume, checkpoints, stop signals,
skipped steps, records) is ``tasks.common``'s parts.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertgpu import atomic, finetuning
from bertgpu.checkpoints import checkpoint, hf_dir, model_card
from bertgpu.config import FinetuneConfig
from bertgpu.data.classification import known_columns, train_batches
from bertgpu.data.sharing import shares_of
from bertgpu.data.tokenizer import Tokenizer, fragmentation_warning, load_vocab, vocab_is_cased
from bertgpu.errors import UserError, did_you_mean
from bertgpu.finetuning.base import Options
from bertgpu.models import architectures
from bertgpu.models.config import PRESETS, EncoderConfig
from bertgpu.models.interface import EncoderModel
from bertgpu.parallel import launch
from bertgpu.parallel.dims import ParallelDims
from bertgpu.parallel.layout import check_layout
from bertgpu.paths import refuse_clobbering
from bertgpu.tasks.checks import check_finetune_flags
from bertgpu.tasks.classifier import model_lowercase, model_vocab
from bertgpu.tasks.common import LogSpec, LoopState, Run, Session, build_run, spread, warn_if_batch_too_big
from bertgpu.tasks.model_dirs import check_model_dir, hub_hint
from bertgpu.tasks.prelaunch import (
    announce_resume,
    check_out_dir,
    parse_nnodes,
    resolve_device,
    run_workers,
    warn_before_start,
)
from bertgpu.tasks.sharded_eval import describe_f1, per_class_table, predict_logits
from bertgpu.training import lora
from bertgpu.training.batch import accumulation, finetune_lr, peak_lr
from bertgpu.training.metrics import Throughput
from bertgpu.training.optim import describe_lr
from bertgpu.training.plan import FixedSteps
from bertgpu.training.runlog import describe_batch, format_duration, format_rate

# transformers' Trainer defaults that have no flag here (its Adam epsilon and gradient clipping are
# config.FinetuneOptimConfig's).
DEFAULT_EVAL_SPLIT = 0.1
# Fine-tuning's dropout when --dropout is not given: BERT's (Devlin et al. fine-tune with 0.1), not whatever the
# checkpoint's config.json holds (--recipe fast pretrains with 0).
DEFAULT_DROPOUT = 0.1
# Fine-tuning's epochs when --epochs is not given: BERT's 3, and for a small training set enough to see
# MIN_EXAMPLES_SEEN examples (about 150 steps of 16), at most MAX_DEFAULT_EPOCHS. Few-sample fine-tuning
# needs steps more than epochs (Mosbach et al. 2021); 200 labels, 3 seeds: 13 epochs instead of 3 fine-tuned a
# 10-minute BERT 5.1 points better (BENCHMARKS.md: Fine-tuning's epochs by the training set's size).
DEFAULT_EPOCHS = 3
MIN_EXAMPLES_SEEN = 2400
MAX_DEFAULT_EPOCHS = 20
METRICS_NAME = "metrics.json"
# What the log sums between two log lines, and over an epoch (summed over the data-parallel ranks).
# ``units``: what the task's loss averages over (examples, or labelled tokens); ``correct`` counts right units.
LOG_SUMS = ("loss", "correct", "units", "examples", "tokens")


@dataclass
class Plan:
    """What ``check`` worked out: the model to build, where its weights come from, and the data."""

    model_dir: Path | None  # None: a preset, random weights
    model_config: EncoderConfig  # id2label = the training labels
    keep_head: bool  # the directory already holds a classifier for exactly these labels
    lowercase: bool
    train: Any  # the task's examples (finetuning.base: what a task reads)
    eval: Any
    warnings: list[str]
    dp: int  # data-parallel processes: the global batch is batch size x dp x accumulation steps
    labels_line: str = ""  # the examples per label in --train
    vocab: Path = Path()  # the model directory's vocab.txt, or --vocab with a preset
    head_line: str = ""  # the dropout and pooling chosen, and why
    task: Any = None  # the fine-tuning task (bertgpu/finetuning/: classification, token-classification, ...)
    options: Options = Options()  # the task's settings from the command line
    task_line: str = ""  # the task, and why


def check(cfg: FinetuneConfig) -> Plan:
    """Every user mistake we can see before training, as a UserError. No side effects."""
    refuse_clobbering(
        {"--out": cfg.out},
        {
            "--model": None if cfg.model in PRESETS else cfg.model,
            "--vocab": cfg.vocab,
            "--train": cfg.train,
            "--eval": cfg.eval,
        },
    )
    if cfg.model in PRESETS:
        model_dir, base, vocab = None, *_preset(cfg)
        lowercase = not vocab_is_cased(vocab)
    else:
        if not Path(cfg.model).exists():
            raise UserError(
                f"--model {cfg.model}: no such preset or directory (presets: {', '.join(PRESETS)})"
                + did_you_mean(cfg.model, PRESETS)
                + hub_hint(cfg.model)
            )
        if cfg.vocab:
            raise UserError(
                f"--vocab goes with a preset --model ({', '.join(PRESETS)}); {cfg.model} brings its own vocab.txt"
            )
        model_dir, base = check_model_dir(cfg.model)
        vocab, lowercase = model_vocab(model_dir), model_lowercase(model_dir)
    if cfg.max_seq_length > base.max_position_embeddings:
        raise UserError(
            f"--max-seq-length {cfg.max_seq_length} is beyond the model's "
            f"{base.max_position_embeddings} positions (max_position_embeddings in {model_dir})"
        )
    options = Options.from_flags(cfg, cfg.max_seq_length)
    given = cfg.task_options.task
    task, why = (finetuning.get(given), "--task") if given else finetuning.detect(cfg.train, options)
    if cfg.metric and cfg.metric not in task.metrics:
        raise UserError(f"--metric {cfg.metric}: {task.name} reports {', '.join(task.metrics)}")
    dims = check_layout(resolve_device(cfg), base, adapter=cfg.adapter)
    if cfg.adapter.enabled:
        if model_dir is None:
            raise UserError(
                f"--lora-rank adapts a pretrained model; the preset {cfg.model} has random weights (fine-tune it whole)"
            )
        lora.check(cfg.adapter, base, head=task.head)
    train = task.read(Path(cfg.train), options)
    names = task.label_names(train)
    labels_line, label_warnings = task.describe(train, names)
    warnings = [train.note, *train.warnings(), *label_warnings]
    if model_dir is None and hasattr(train, "texts"):  # random weights: a misfit vocab costs every step
        warnings.append(fragmentation_warning(Tokenizer(vocab, lowercase), train.texts, vocab, f"{cfg.train}'s"))
    if cfg.eval:
        evaluation = task.read(Path(cfg.eval), options)
        task.check_eval(evaluation, names, f"the training data {cfg.train}")
        warnings += [evaluation.note, *evaluation.warnings()]
    else:
        train, evaluation = task.split(train, cfg.eval_split or DEFAULT_EVAL_SPLIT, cfg.run.seed)
    id2label = dict(enumerate(names))
    keep_head = model_dir is not None and base.id2label == id2label and _saved_head(model_dir, base, task)
    dropout = DEFAULT_DROPOUT if cfg.dropout is None else cfg.dropout
    if task.head == "sequence":
        pooling, pooling_why = choose_pooling(cfg.pooling, model_dir, base, keep_head)
    else:  # a token or span head reads every token's state: no pooling
        pooling, pooling_why = "pooler", ""
    base = dataclasses.replace(base, id2label=id2label, problem_type=task.problem_type)
    config = architectures.for_finetuning(base, dropout, pooling)
    head_line = (
        f"dropout {dropout:g} ("
        + (
            "--dropout"
            if cfg.dropout is not None
            else f"fine-tuning's default; the model's config says {_dropout(base)}"
        )
        + (f"), pooling {pooling} ({pooling_why})" if pooling_why else ")")
    )
    return Plan(
        model_dir,
        config,
        keep_head,
        lowercase,
        train,
        evaluation,
        [w for w in warnings if w],
        dims.dp,
        labels_line,
        vocab,
        head_line,
        task,
        options,
        f"task {task.name} ({why})",
    )


def _saved_head(model_dir: Path, base: EncoderConfig, task: Any) -> bool:
    """Whether ``model_dir`` holds the head ``task`` fine-tunes (its config.json's architectures say so)."""
    return architectures.saved_class(model_dir) == architectures.head_class_name(base, task.head)


def _dropout(config: EncoderConfig) -> str:
    return f"{config.hidden_dropout_prob:g}"


# The start CKA (training.drift) down to which a continuation's pooler still fits its encoder.
POOLER_FITS_CKA = 0.95


def masked_lm_only(model_dir: Path | None, base: EncoderConfig) -> dict[str, Any] | None:
    """The run record (bertgpu.json) of ``model_dir`` (of model config ``base``) when it is a bertgpu BERT
    pretraining checkpoint of masked LM alone (--no-nsp), which trains no pooler, else None. From scratch its pooler is
    as initialised, and fine-tuning through it sat at chance for an epoch (BENCHMARKS.md: The chance-level fine-tune).
    ModernBERT's classifier reads [CLS] through the masked-LM head's transform, which pretraining trains: its
    fine-tuning did as well either way there. The architecture is the model's own: a run continued from a ModernBERT
    without --arch recorded BERT's before 2026-11-29."""
    if model_dir is None or not architectures.of(base).pooler:
        return None
    record = checkpoint.read_run_record(model_dir)
    if record is None:
        return None  # not one of our pretraining checkpoints: a pooler of unknown history counts as trained
    data = record["config"].get("data")
    if not isinstance(data, dict) or "nsp" not in data:
        return None  # a fine-tuning run's, or another task's
    return None if data["nsp"] else record


def choose_pooling(asked: str, model_dir: Path | None, base: EncoderConfig, keep_head: bool) -> tuple[str, str]:
    """--pooling resolved ("pooler" or "mean"), and why."""
    if asked != "auto":
        return asked, "--pooling"
    if keep_head:
        return architectures.pooling_of(base), "the classifier's own, continued"
    if architectures.pooling_of(base) == "mean":  # e.g. a classifier fine-tuned so, now given other labels
        return "mean", "auto: the model's config.json says classifier_pooling mean"
    record = masked_lm_only(model_dir, base)
    if record is None:
        return "pooler", "auto"
    # A continuation's pooler is its start's: it still fits an encoder that barely moved (MiniLM continued on
    # Wikipedia, a pair task, docs/experiments.md: at start CKA 0.993 pooler 0.814 against mean 0.777, 3 seeds; at
    # 0.912 0.769 against 0.777, at 0.838 0.713 and 0.729 against 0.794 and 0.761, seeds 1-2). (A start whose own
    # pooler no loss trained is not told apart: continue it with NSP, or give --pooling mean.)
    cka = record.get("start_cka")
    if cka is not None and cka >= POOLER_FITS_CKA:
        return "pooler", f"auto: continued to start CKA {cka:.3f}, the start's pooler still fits"
    return "mean", "auto: pretrained without NSP, the pooler is untrained; --pooling pooler for transformers"


def _preset(cfg: FinetuneConfig) -> tuple[EncoderConfig, Path]:
    """A preset's config, sized to --vocab, and the vocab (a preset brings none)."""
    if not cfg.vocab:
        raise UserError(
            f"--model {cfg.model} is a preset with random weights: give --vocab VOCAB.txt to tokenize with "
            "(`bertgpu vocab` trains one on your text)"
        )
    vocab = Path(cfg.vocab)
    if not vocab.is_file():
        raise UserError(f"--vocab {cfg.vocab}: no such file")
    # finetune has no --arch: a preset is the default architecture's
    return architectures.preset(architectures.DEFAULT, cfg.model, len(load_vocab(vocab))), vocab


def _short(lr: float) -> str:
    """7.2e-4, 2e-5, 0.001: a learning rate as people write it."""
    return f"{lr:g}" if lr >= 1e-3 else f"{lr:.1e}".replace(".0e", "e").replace("e-0", "e-")


def resolve_lr(cfg: FinetuneConfig, model_config: EncoderConfig) -> tuple[FinetuneConfig, str]:
    """``cfg`` with --lr set (the width's default when not given), and a line saying which lr and why."""
    if cfg.optim.lr is not None:
        return cfg, f"lr {_short(cfg.optim.lr)} (--lr)"
    h, factor = model_config.hidden_size, model_config.finetune_lr_factor
    lr = finetune_lr(h, factor)
    times = f" x {factor:g} for {model_config.title}" if factor != 1 else ""
    if h < 768:
        rule = f"2e-5 x (768 / {h})^2{times}; narrower models take larger steps"
    else:
        rule = f"BERT's 2e-5{times}" if times else "BERT's"
    why = f"lr {_short(lr)}: the default for hidden size {h} ({rule}); --lr sets another"
    return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=lr)), why


def resolve_epochs(cfg: FinetuneConfig, train_examples: int) -> tuple[FinetuneConfig, str]:
    """``cfg`` with --epochs set (the training set's default when not given; a resumed run's own when it has
    a checkpoint), and a line saying how many and why."""
    if cfg.epochs is not None:
        return cfg, f"{cfg.epochs} epoch(s) (--epochs)"
    latest = checkpoint.latest_checkpoint(cfg.out) if cfg.run.resume else None
    saved = (checkpoint.read_run_record(latest) or {}).get("config", {}).get("epochs") if latest else None
    if saved:
        epochs, why = int(saved), f"{saved} epoch(s): the resumed run's own"
    else:
        epochs = min(MAX_DEFAULT_EPOCHS, max(DEFAULT_EPOCHS, -(-MIN_EXAMPLES_SEEN // max(train_examples, 1))))
        rule = (
            f"BERT's {DEFAULT_EPOCHS}" if epochs == DEFAULT_EPOCHS else f"enough to see {MIN_EXAMPLES_SEEN:,} examples"
        )
        rule += f", at most {MAX_DEFAULT_EPOCHS}" if epochs == MAX_DEFAULT_EPOCHS else ""
        why = f"{epochs} epochs: the default for {train_examples:,} training examples ({rule})"
    return dataclasses.replace(cfg, epochs=epochs), f"{why}; --epochs sets another"


def run_finetune(cfg: FinetuneConfig) -> None:
    """Check, then fine-tune here or in local workers."""
    cfg, columns_note = with_known_columns(resolve_device(check_finetune_flags(cfg)))
    plan = check(cfg)
    cfg, lr_line = resolve_lr(cfg, plan.model_config)
    cfg, epochs_line = resolve_epochs(cfg, len(plan.train))
    if plan.model_dir is None:
        print(
            f"bertgpu: --model {cfg.model} is a preset: fine-tuning from random weights "
            f"({plan.model_config.num_hidden_layers} layers, hidden {plan.model_config.hidden_size}, "
            f"vocab {cfg.vocab})",
            flush=True,
        )
    elif plan.model_dir != Path(cfg.model):
        print(
            f"bertgpu: --model {cfg.model} is a run directory: starting from its newest checkpoint, {plan.model_dir}",
            flush=True,
        )
        cfg = dataclasses.replace(cfg, model=str(plan.model_dir))
    if not launch.restarted(cfg.out) and parse_nnodes(cfg.run.nnodes)[1] == 1:  # many machines: rank 0 checks it
        check_out_dir(cfg.out, cfg.run.overwrite, cfg.run.resume)
        if int(os.environ.get("RANK", 0)) == 0:
            if columns_note:
                print(f"bertgpu: {columns_note}", flush=True)
            print(f"bertgpu: {plan.task_line}", flush=True)
            print(plan.labels_line, flush=True)
            print(f"bertgpu: {lr_line}", flush=True)
            print(f"bertgpu: {epochs_line}", flush=True)
            print(f"bertgpu: {plan.head_line}", flush=True)
    if announce_resume(
        cfg,
        "--epochs",
        cfg.epochs,
        lambda saved: saved["config"]["epochs"],
        lambda state: state["position"]["epoch"] > cfg.epochs,
    ):
        return
    resume_from = checkpoint.latest_checkpoint(cfg.out) if cfg.run.resume else None
    if resume_from is not None:  # refused here, before any process starts (each worker checks again)
        sizes, accum = accumulation(cfg.run, plan.dp)
        _check_resumable(
            checkpoint.load_training_state(resume_from),
            resume_from,
            list(plan.model_config.id2label.values()),
            len(plan.train),
            sum(sizes) * accum,
            cfg.group_by_length,
            _adapter_record(cfg, plan),
        )
    warn_before_start(cfg)
    run_workers(train, cfg, lora.worker_imports(cfg.adapter))


# ---------------------------------------------------------------------------------------------
# Fine-tuning


@dataclass
class Loop(LoopState):
    """Where fine-tuning is (the epoch, from 1, and the steps done in it) and its records: every epoch's
    evaluation, the best, and the epoch checkpoints kept (in the run directory ``out``)."""

    out: Path = Path()
    epoch: int = 1
    step_in_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    kept: list[Path] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch},
            "steps_in_window": self.steps_in_window,
            "history": self.history,
            "best": self.best,
            "kept": [str(p.relative_to(self.out)) for p in self.kept],
            **super().state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.epoch, self.step_in_epoch = state["position"]["epoch"], state["position"]["step_in_epoch"]
        self.steps_in_window, self.history, self.best = state["steps_in_window"], state["history"], state["best"]
        self.kept = [self.out / p for p in state["kept"]]


def with_known_columns(cfg: FinetuneConfig) -> tuple[FinetuneConfig, str | None]:
    """``cfg`` with the training table's GLUE-named columns where the default column flags name none of its
    columns (``known_columns``), as the run records them for evaluate and predict; and the line that says so."""
    if cfg.task_options.task not in ("", "classification", "regression", "multi-label"):
        return cfg, None
    text, pair, label, note = known_columns(
        cfg.train, cfg.text_column, cfg.pair_column, cfg.label_column, cfg.format, cfg.delimiter
    )
    return dataclasses.replace(cfg, text_column=text, pair_column=pair, label_column=label), note


def train(cfg: FinetuneConfig) -> Path:
    plan = check(cfg)  # cfg as run_finetune resolved it (its columns, its device)
    cfg = resolve_lr(cfg, plan.model_config)[0]  # set by run_finetune; a config built elsewhere gets the default
    # as it ran (bertgpu.json and the model card): the dropout and pooling chosen
    cfg = dataclasses.replace(
        cfg,
        dropout=plan.model_config.hidden_dropout_prob,
        pooling=architectures.pooling_of(plan.model_config),
        metric=cfg.metric or plan.task.main_metric,
        task_options=dataclasses.replace(cfg.task_options, task=plan.task.name),
    )
    session = Session(cfg, plan.model_config, "finetune", adapter=cfg.adapter)
    task = FineTuning(cfg, plan, session)  # the data, the loop, the model spread, the steps, what is logged and saved
    run, loop, accum = build_run(session, task), task.loop, task.accum
    train_set, eval_set, dims = task.train_set, task.eval_set, session.dims
    try:
        while loop.epoch <= cfg.epochs and not run.stopped:
            run.opt.net.train()
            batches = epoch_batches(cfg, train_set, loop.sizes, accum, dims, loop.epoch)
            while loop.step_in_epoch < len(batches) and not run.stopped:  # on resume: straight to the next batch
                indices, global_size = batches[loop.step_in_epoch]
                micro = micro_batches(indices, global_size, [s * accum for s in loop.sizes], accum)
                step_sums, bad = train_step(run, plan.task, train_set, micro, global_size)  # the whole step
                loop.step_in_epoch += 1
                epoch_end = loop.step_in_epoch == len(batches)
                run.account(loop, step_sums, bad, epoch_end)  # counted and recorded; its flags read
                run.log(loop, epoch_end)  # every --log-every steps
                run.save(loop, epoch_end)  # when due (an epoch's own follows its evaluation), and on a stop signal
                if run.rebalance(loop):  # the same global batches, shared anew
                    batches = epoch_batches(cfg, train_set, loop.sizes, accum, dims, loop.epoch)
            run.flush(loop)  # the epoch's last flags: a stop signal saves here, resumed at this evaluation
            if not run.stopped:
                end_epoch(cfg, run, loop, plan, eval_set, len(train_set))
    finally:
        run.close()
    if run.stopped:
        raise run.interrupted(loop.step)  # the process exits with the signal's status, the checkpoint written
    run.records.summary(
        loop.step,
        {"loss": "min", "accuracy": "max", "eval_loss": "min", **{f"eval_{m}": "max" for m in plan.task.metrics}},
        summary_where(cfg, plan, loop.best, session.out),
    )
    return session.out / "best"


class FineTuning:
    """Fine-tuning's part of a run (``common.Task``), made whole from its config sections: the data (encoded once),
    the loop where the checkpoint left it, the classifier (``build_model``) spread over the processes, its steps
    (--epochs of the training set's global batches), what the log shows and what every checkpoint holds; with the
    micro-batches a step accumulates (``accum``). Its evaluation is every epoch's (``end_epoch``)."""

    def __init__(self, cfg: FinetuneConfig, plan: Plan, session: Session):
        dims = session.dims
        self.cfg, self.plan, self.session = cfg, plan, session
        sizes, self.accum = accumulation(cfg.run, dims.dp)  # --grad-accum, or what makes --global-batch here
        # Data: encoded once; every epoch a fresh order, cut into global batches shared by the data-parallel ranks.
        tokenizer = Tokenizer(plan.vocab, plan.lowercase)
        label2id = {name: i for i, name in plan.model_config.id2label.items()}
        self.train_set = plan.task.encode(plan.train, tokenizer, label2id, plan.options)
        self.eval_set = plan.task.encode(plan.eval, tokenizer, label2id, plan.options)
        self.loop = Loop(sizes, out=session.out)  # the batch sizes per data-parallel rank
        self.global_batch = global_batch = sum(sizes) * self.accum
        steps_per_epoch = len(epoch_batches(cfg, self.train_set, sizes, self.accum, dims, 1))
        if steps_per_epoch == 0:
            raise UserError(
                f"{len(self.train_set)} training example(s) cannot be shared by {dims.dp} data-parallel ranks"
            )
        steps = cfg.epochs * steps_per_epoch
        self.optim = dataclasses.replace(cfg.optim, lr=peak_lr(cfg.optim, global_batch), steps=steps)
        self.steps = FixedSteps(self.optim)
        self.fixed = {  # what a resumed run must share with the run it continues; every checkpoint records it
            "labels": list(label2id),
            "train_examples": len(self.train_set),  # rows: a long example's windows count each
            "global_batch": global_batch,
            "group_by_length": cfg.group_by_length,
            "adapter": _adapter_record(cfg, plan),
        }
        if session.state is not None:
            _check_resumable(session.state, session.resume_from, **self.fixed)

        model = build_model(cfg, plan, session)
        self.trainable, self.n_params = lora.parameter_counts(model)
        # Batches are padded to their longest example and hold at most the data there is: a --batch-size larger
        # than the training set, or a --max-seq-length longer than any example, costs no memory.
        longest = int(self.train_set.lengths.max()) if len(self.train_set) else cfg.max_seq_length
        warn_if_batch_too_big(session, model, plan.model_config, longest, examples=len(self.train_set))
        self.meter = Throughput(None, None, dims.world_size)
        self.files = model_files(plan)
        # The log's sums: since the last log line, and in the epoch (its evaluation's record).
        self.log = LogSpec(LOG_SUMS, ("window", "epoch_sums"), "example")
        self.evaluation = None  # every epoch's instead (end_epoch)
        self.warnings = plan.warnings
        self.lr_factor = None  # one rate for all: the head of a fine-tune starts with it
        self.net = spread(session, model, self.optim.steps, seq_length=cfg.max_seq_length)
        self.balance = session.resume_loop(self.loop)

    def start_line(self) -> str:
        cfg, session, loop, accum, optim = self.cfg, self.session, self.loop, self.accum, self.optim
        trainable, n_params = self.trainable, self.n_params
        how = (
            f"; resuming from {session.resume_from} at step {loop.step}{session.layout_change()}"
            if session.resume_from
            else ""
        )
        what = (
            f"{lora.describe(cfg.adapter)}: {trainable:,} of {n_params:,} parameters trainable "
            f"({100 * trainable / n_params:.2f}%)"
            if cfg.adapter.enabled
            else f"{n_params / 1e6:.1f}M parameters"
        )
        global_batch = sum(loop.sizes) * accum
        pooling = f"pooling {cfg.pooling}, " if self.plan.task.head == "sequence" else ""
        o = cfg.optim
        return (
            f"bertgpu finetune: {what}, {session.dims.describe()}, on {session.device.type}, "
            f"{session.precision}, task {self.plan.task.name}, {len(self.plan.train):,} training and "
            f"{len(self.plan.eval):,} evaluation examples{self._rows()}, "
            f"labels {', '.join(self.plan.model_config.id2label.values())}, global batch {global_batch} = "
            f"{describe_batch(loop.sizes, accum)}, "
            f"{describe_lr(o.lr, optim.lr, o.lr_scaling, global_batch, o.reference_batch)}, "
            f"dropout {cfg.dropout:g}, {pooling}{optim.steps} steps in {cfg.epochs} epoch(s){how}"
        )

    def _rows(self) -> str:
        """What the model reads when it is not one row per example (a long sentence's or context's windows)."""
        if len(self.train_set) == len(self.plan.train) and len(self.eval_set) == len(self.plan.eval):
            return ""
        rows = f"{len(self.train_set):,} and {len(self.eval_set):,} rows"
        return f" ({rows} of --max-seq-length {self.cfg.max_seq_length})"

    def log_values(self, sums: dict[str, float]) -> dict[str, float]:
        return log_values(sums)

    def log_line(self, step: int, values: dict[str, Any]) -> str:
        return log_line(step, values, self.optim.steps)

    def sample_batch(self) -> dict[str, torch.Tensor]:
        """Two examples as a batch, for a step that only lays out DDP's buckets (settle_buckets)."""
        batch = self.train_set.batch(list(range(min(2, len(self.train_set)))))
        return {k: batch[k].to(self.session.device) for k in ("input_ids", "token_type_ids", "attention_mask")}

    def settle(self, cfg: FinetuneConfig) -> tuple[FinetuneConfig, dict[str, Any]]:
        """Fine-tuning settles nothing at run time that its config does not say already."""
        return cfg, {}


def summary_where(cfg: FinetuneConfig, plan: Plan, best: dict[str, Any], out: Path) -> str:
    """The closing lines' last: the best epoch, where it is and how to use it, and its evaluation by label."""
    head = architectures.head_class_name(plan.model_config, plan.task.head)
    mean = plan.task.head == "sequence" and cfg.pooling == "mean"
    where = f"best: epoch {best['epoch']}, {cfg.metric} {best[f'eval_{cfg.metric}']:.4f} -> {out / 'best'}  " + (
        f"(bertgpu predict --model {out / 'best'} TEXT; mean pooling, which transformers' "
        f"{head} does not read: --pooling pooler for that)"
        if not architectures.of(plan.model_config).hf_reads_mean_pooling and mean
        else f"(transformers.{head}.from_pretrained('{out / 'best'}'), or bertgpu predict --model {out / 'best'} TEXT)"
    )
    if best.get("eval_per_class"):  # the best epoch's evaluation by label (a checkpoint of an older bertgpu has none)
        names = list(plan.model_config.id2label.values())
        f1 = describe_f1({"f1_labels": best["eval_f1_labels"]}, names)
        table = per_class_table({"per_class": best["eval_per_class"]})
        where += f"\n  epoch {best['epoch']} on the evaluation data by label (f1: {f1}):\n    " + "\n    ".join(table)
    return where


def epoch_batches(
    cfg: FinetuneConfig, train_set: Any, sizes: list[int], accum: int, dims: ParallelDims, epoch: int
) -> list[tuple[list[int], int]]:
    """The epoch's global batches in a fresh order (each with this rank's indices and its global size)."""
    lengths = train_set.lengths if cfg.group_by_length else None  # batches of similar length pad little
    shares = [s * accum for s in sizes]
    return train_batches(len(train_set), shares, dims.dp, dims.dp_rank, cfg.run.seed, epoch, lengths)


def model_files(plan: Plan) -> checkpoint.ModelFiles:
    """What every checkpoint of the run writes beside the weights: config.json naming the task's transformers class
    (BertForTokenClassification, ...), the vocab and the tokenizer's settings."""
    head_class = architectures.head_class_name(plan.model_config, plan.task.head)
    return checkpoint.ModelFiles(plan.model_config, plan.vocab, plan.lowercase, head_class)


def build_model(cfg: FinetuneConfig, plan: Plan, session: Session) -> EncoderModel:
    """The pretrained encoder; a fresh head unless the directory has one for these very labels. On
    resume, the checkpoint's whole classifier; with LoRA, the frozen base from --model again and the
    checkpoint's adapter and head."""
    torch.manual_seed(cfg.run.seed)
    model = architectures.head_model(plan.model_config, plan.task.head)
    if session.resume_from is not None and not cfg.adapter.enabled:
        hf_dir.load_weights(model, session.resume_from)
    elif plan.model_dir is not None:  # else a preset: the seeded random initialisation
        hf_dir.load_weights(model if plan.keep_head else architectures.encoder(model), plan.model_dir)
    model.freeze_unread()  # a pooler unread under mean pooling: no gradient, so no process may wait for one
    if cfg.adapter.enabled:
        lora.apply(model, cfg.adapter, session.device, session.precision, base_model=plan.model_dir)
        if session.resume_from is not None:
            lora.load_adapter(model, session.resume_from / lora.ADAPTER_DIR)
    return model


def train_step(
    run: Run, task: Any, dataset: Any, micro: list[list[int]], global_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over this rank's micro-batches (example indices) of a global batch of
    ``global_size`` examples: the forward and backward passes, the gradients unscaled and clipped, the optimizer
    step (a non-finite one skipped on the device), the gradients zeroed, the schedule moved on. Return the step's
    log sums (``LOG_SUMS`` order) and its skipped flag, both still on the device. The loss is the ``task``'s, its
    sum over the global batch divided by its examples times the training rows' mean units (examples: 1; a token
    task's labelled tokens), the same divisor on every rank and in every batch (``FinetuneTask.mean_units``)."""
    opt, sums = run.opt, run.records.window
    net, device = opt.net, run.session.device
    batches = [{k: v.to(device, non_blocking=True) for k, v in dataset.batch(part).items()} for part in micro]
    units = global_size * task.mean_units(dataset)

    def loss_fn(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return task.loss(logits, batch) / units

    def record(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return sums.of(
            **task.train_sums(logits.detach(), batch),
            examples=len(batch["input_ids"]),
            tokens=batch["attention_mask"].sum(),
        )

    step_sums = net.forward_backward(
        batches,
        ("input_ids", "token_type_ids", "attention_mask"),
        loss_fn,
        record,
        torch.zeros(len(LOG_SUMS), dtype=torch.float64, device=device),
        context=opt.forward_context,
        scale=opt.scaler.scale,
    )
    bad = opt.clip_grad_norm()  # unscaled and clipped; a non-finite norm flags the step to skip, on the device
    opt.step(bad)  # the optimizer step (skipped where bad)
    opt.zero_grad()
    opt.schedule.step()  # the next step's learning rate
    return step_sums, bad


def log_values(s: dict[str, float]) -> dict[str, float]:
    """The training loss and accuracy (of the task's units) from the sums of a log window."""
    return {"loss": s["loss"] / max(s["units"], 1), "accuracy": s["correct"] / max(s["units"], 1)}


def log_line(step: int, values: dict[str, Any], steps: int) -> str:
    return (
        f"epoch {values['epoch']} step {step}/{steps} | loss {values['loss']:.4f} | "
        f"acc {values['accuracy']:.3f} | lr {values['lr']:.2e} | "
        f"{format_rate(values['seq_per_s'])} examples/s | "
        f"peak mem {values['peak_memory_mb'] / 1024:.2f} GiB | eta "
        f"{format_duration((steps - step) / max(values['steps_per_s'], 1e-9))}"
    )


def end_epoch(cfg: FinetuneConfig, run: Run, loop: Loop, plan: Plan, eval_set: Any, train_examples: int) -> None:
    """After an epoch: evaluate, record, save the epoch's checkpoint and keep the best; then the resumable
    checkpoint at the start of the next epoch."""
    session, records, net = run.session, run.records, run.opt.net
    dims, sizes, epoch, out = session.dims, loop.sizes, loop.epoch, session.out
    records.meter.pause()
    s = records.sums["epoch_sums"].read(dims)
    names, task = list(plan.model_config.id2label.values()), plan.task
    shape = task.output_shape(eval_set, len(names))
    outputs = predict_logits(net, eval_set, max(sizes), dims, session.device, session.precision, sizes, shape)
    metrics = task.evaluate(outputs, eval_set, plan.eval, names)
    record = {
        "epoch": epoch,
        "step": loop.step,
        "train_loss": s["loss"] / max(s["units"], 1),
        "train_accuracy": s["correct"] / max(s["units"], 1),
        **{f"eval_{k}": v for k, v in metrics.items()},
    }
    loop.history.append(record)
    is_best = loop.best is None or record[f"eval_{cfg.metric}"] > loop.best[f"eval_{cfg.metric}"]
    loop.best = best = record if is_best else loop.best
    line = (
        f"epoch {epoch} eval | {task.eval_line(metrics)} | {metrics['examples']} examples"
        f"{' | best so far' if is_best else ''}"
    )
    records.log.log(loop.step, {k: v for k, v in record.items() if k != "step"}, line, write=records.write)
    loop.kept = save_epoch(run, loop, plan, cfg, record, is_best)
    if session.is_main:
        atomic.write_json(
            out / METRICS_NAME,
            {
                "metric": cfg.metric,
                "best_epoch": best["epoch"],
                "best_checkpoint": _epoch_dir(best["epoch"]),
                "best": best,
                "labels": list(plan.model_config.id2label.values()),
                "train_examples": train_examples,
                "eval_examples": len(eval_set),
                "epochs": loop.history,
            },
        )
    loop.epoch, loop.step_in_epoch = epoch + 1, 0
    run.checkpoints.save_now(loop)
    records.meter.resume()  # the rate covers training steps only, not this evaluation
    run.flags.stop_requested()  # a signal during the evaluation stops the run here: all of it is saved


def micro_batches(indices: list[int], global_size: int, shares: list[int], accum: int) -> list[list[int]]:
    """This rank's share of a global batch cut into its micro-batches: ``accum`` of them, fewer only
    when a short last batch leaves some rank fewer examples; every rank cuts its share into the same
    number (the processes must run the same forward and backward passes), none empty. ``shares``: the
    ranks' shares of a full global batch. The gradient is a sum over the examples, so how the share is
    cut changes only the order of additions."""
    count = min(accum, min(shares_of(global_size, shares)))
    size, extra = divmod(len(indices), count)
    bounds = [i * size + min(i, extra) for i in range(count + 1)]
    return [indices[bounds[i] : bounds[i + 1]] for i in range(count)]


def _adapter_record(cfg: FinetuneConfig, plan: Plan) -> dict[str, Any] | None:
    """What a resumed LoRA run must share with the run it continues: the adapter settings and the
    frozen base model it rebuilds from --model."""
    a = cfg.adapter
    if not a.enabled:
        return None
    return {
        "rank": a.lora_rank,
        "alpha": a.alpha,
        "dropout": a.dropout,
        "targets": a.targets,
        "quantize": a.quantize,
        "base_model": str(plan.model_dir.resolve()),
    }


def _check_resumable(
    state: dict[str, Any],
    path: Path,
    labels: list[str],
    train_examples: int,
    global_batch: int,
    group_by_length: bool,
    adapter: dict[str, Any] | None,
) -> None:
    """A resumed run must see the data and batches it was trained on, or its position means nothing:
    the length-grouped batches of another global batch are other batches, so that is refused too."""
    was = (state.get("labels"), state.get("train_examples"), state.get("global_batch"))
    if was[0] != labels:
        raise UserError(f"cannot resume from {path}: it was trained on labels {was[0]}, the data has {labels}")
    if was[1] != train_examples:
        raise UserError(
            f"cannot resume from {path}: it was trained on {was[1]} examples, the training data now "
            f"has {train_examples}; resume with the same data, or start afresh with --overwrite"
        )
    if was[2] != global_batch:
        raise UserError(
            f"cannot resume from {path}: its global batch was {was[2]} (batch size x data-parallel "
            f"processes x accumulation), now {global_batch}; resume with the same --batch-size, "
            "--grad-accum and data-parallel degree"
        )
    if state.get("adapter") != adapter:

        def said(a: dict[str, Any] | None) -> str:
            return (
                "full fine-tuning"
                if a is None
                else (
                    f"LoRA rank {a['rank']} alpha {a['alpha']:g} dropout "
                    f"{a['dropout']:g} on {','.join(a['targets'])}"
                    f"{' (' + a['quantize'] + ')' if a['quantize'] else ''} "
                    f"over {a['base_model']}"
                )
            )

        raise UserError(
            f"cannot resume from {path}: it was trained with {said(state.get('adapter'))}, now "
            f"{said(adapter)}; resume with the same --model and LoRA flags"
        )
    if state.get("group_by_length", group_by_length) != group_by_length:
        raise UserError(
            f"cannot resume from {path}: it was trained with{'out' if group_by_length else ''} "
            f"--no-group-by-length, which orders the batches; resume with the same setting"
        )


def _epoch_dir(epoch: int) -> str:
    return f"checkpoints/epoch-{epoch:03d}"


def save_epoch(
    run: Run, loop: Loop, plan: Plan, cfg: FinetuneConfig, record: dict[str, Any], is_best: bool
) -> list[Path]:
    """Write the checkpoint of the loop's epoch, its evaluation ``record`` beside it (every process calls this: the
    weights are gathered from them), keep the best (``loop.best``) and the newest up to --save-total-limit, and
    refresh ``out/best`` when the epoch ``is_best``. Every directory appears complete or not at all. Return the
    kept ones (``loop.kept`` and this epoch's)."""
    session, epoch, kept, best = run.session, loop.epoch, loop.kept, loop.best
    out, precision, layout = session.out, session.precision, session.dims.describe()
    path = out / _epoch_dir(epoch)
    files = model_files(plan)
    checkpoint.save_model_dir(
        path,
        run.opt.net.model,
        files,
        json_files={
            METRICS_NAME: record,
            checkpoint.RUN_CONFIG_NAME: {
                "task": "finetune",
                "epoch": epoch,
                "step": record["step"],
                # the precision used, not auto: a re-run from this file repeats the run
                "config": dataclasses.asdict(
                    dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, precision=precision or cfg.run.precision))
                ),
            },
        },
        card=model_card.render(
            "finetune",
            cfg,
            plan.model_config,
            model_card.RunFacts(
                record["step"], layout, {k: (v, record["step"]) for k, v in record.items() if k != "step"}, precision
            ),
        ),
    )
    kept = kept + [path]
    best_path = out / _epoch_dir(best["epoch"])
    newest = [p for p in kept if p != best_path][-(cfg.save_total_limit - 1) :] if cfg.save_total_limit > 1 else []
    keep = (set(newest) | {best_path}) if cfg.save_total_limit else set(kept)
    if session.is_main:
        if is_best:
            try:  # hard links: the best directory costs no space, and stays whole when its epoch is pruned
                with atomic.directory(out / "best") as tmp:
                    shutil.copytree(path, tmp, dirs_exist_ok=True, copy_function=_link_or_copy)
            except OSError as e:
                raise UserError(f"could not write {out / 'best'} ({e.strerror or e})") from None
        for old in kept:
            if old not in keep:
                shutil.rmtree(old, ignore_errors=True)
    launch.barrier()
    return [p for p in kept if p in keep]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst)
