"""`bertgpu finetune`, `evaluate` and `predict`: from a pretrained BERT to a classifier people use.

As in pretraining, each ``run_*`` checks everything a user can get wrong before any process starts,
then works in this process or in ``nproc`` workers. ``train`` is the whole fine-tuning loop of one
worker, top to bottom: data parallel steps, an evaluation after every epoch, checkpoints kept by
the chosen metric, and the best one as the final output.

Evaluation is sharded so that every example counts exactly once: the batches are the same whatever
the number of processes, rank r takes every world-th of them, and the logits are gathered into one
array in example order before any metric is computed. The metrics of N processes are therefore
those of one.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import math
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from .. import checkpoint, distributed
from ..classifier import Classifier, model_lowercase, model_vocab
from ..config import EvaluateConfig, FinetuneConfig, ModelConfig, OptimConfig, PredictConfig
from ..data.classification import (ClassificationDataset, Examples, Table, as_data_labels, check_labels, detect_format,
                                   eval_batches, label_names, load_examples, read_table, require_columns,
                                   split_examples, train_batches)
from ..data.tokenizer import Tokenizer, load_vocab
from ..errors import UserError
from ..model import BertForSequenceClassification
from ..training import (LaggedFlags, RunLog, StopSignal, Throughput, allow_tf32, autocast, build_optimizer,
                        build_schedule, console_is_tty, format_rate, gather_rng_states, resolve_precision,
                        restore_rng_state)

# transformers' Trainer defaults that have no flag here.
DEFAULT_EVAL_SPLIT = 0.1
ADAM_EPS = 1e-8
MAX_GRAD_NORM = 1.0
ARCHITECTURE = "BertForSequenceClassification"
METRICS_NAME = "metrics.json"


# ---------------------------------------------------------------------------------------------
# Checks in the parent process


@dataclass
class Plan:
    """What ``check`` worked out: the model to build, where its weights come from, and the data."""

    model_dir: Path
    model_config: ModelConfig  # id2label = the training labels
    keep_head: bool  # the directory already holds a classifier for exactly these labels
    lowercase: bool
    train: Examples
    eval: Examples
    warnings: list[str]


def check_model_dir(path: str) -> tuple[Path, ModelConfig]:
    """A BERT directory with config.json, model.safetensors and vocab.txt."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise UserError(f"--model {path}: no such directory "
                        f"(a BERT directory: config.json, model.safetensors, vocab.txt)")
    config = ModelConfig.load(model_dir)
    if not (model_dir / checkpoint.WEIGHTS_NAME).is_file():
        if (model_dir / "pytorch_model.bin").is_file():
            raise UserError(f"{model_dir} holds only pytorch_model.bin, a pickle that can run code when loaded; "
                            f"convert it to model.safetensors first "
                            f"(in transformers: from_pretrained, then save_pretrained)")
        raise UserError(f"{model_dir} has no {checkpoint.WEIGHTS_NAME}: fine-tuning starts from trained weights "
                        f"(a `bertgpu pretrain` checkpoint or a Hugging Face BERT directory)")
    vocab_size = len(load_vocab(model_vocab(model_dir)))
    if vocab_size > config.vocab_size:
        raise UserError(f"{model_dir / 'vocab.txt'} has {vocab_size} tokens, more than the model's vocab_size "
                        f"{config.vocab_size} (config.json): the vocab is not this model's")
    return model_dir, config


def check(cfg: FinetuneConfig) -> Plan:
    """Every user mistake we can see before training, as a UserError. No side effects."""
    model_dir, base = check_model_dir(cfg.model)
    if cfg.max_seq_length > base.max_position_embeddings:
        raise UserError(f"--max-seq-length {cfg.max_seq_length} is beyond the model's "
                        f"{base.max_position_embeddings} positions (max_position_embeddings in {model_dir})")
    resolve_precision(cfg.precision, torch.device(distributed.resolve_device(cfg.device)))
    columns = dict(text_column=cfg.text_column, pair_column=cfg.pair_column or None,
                   label_column=cfg.label_column, fmt=cfg.format)
    train = load_examples(cfg.train, **columns)
    names = label_names(train)
    warnings = [train.skipped_warning()]
    if cfg.eval:
        evaluation = load_examples(cfg.eval, **columns)
        check_labels(evaluation, names, f"the training data {cfg.train}")
        warnings.append(evaluation.skipped_warning())
    else:
        train, evaluation = split_examples(train, cfg.eval_split or DEFAULT_EVAL_SPLIT, cfg.seed)
    id2label = dict(enumerate(names))
    config = dataclasses.replace(base, id2label=id2label)
    return Plan(model_dir, config, base.id2label == id2label, model_lowercase(model_dir), train, evaluation,
                [w for w in warnings if w])


def check_out_dir(out: str, overwrite: bool, resume: bool = False) -> None:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not (overwrite or resume):
        raise UserError(f"output directory {path} is not empty; pass --resume to continue the run there, "
                        "or --overwrite to start afresh")


def _run_workers(fn: Callable[[Any], Any], cfg: Any, nproc: int, max_restarts: int = 0) -> None:
    """Run ``fn(cfg)`` here (one process, or one worker of torchrun) or in ``nproc`` local workers."""
    if distributed.launched_externally():
        distributed.worker_main(fn, cfg)
        return
    nproc = distributed.resolve_nproc(nproc, cfg.device)
    if nproc == 1 and max_restarts == 0:
        distributed.worker_main(fn, cfg)
    else:
        distributed.launch(distributed.worker_main, (fn, cfg), nproc, max_restarts=max_restarts)


def run_finetune(cfg: FinetuneConfig) -> None:
    """Check, then fine-tune here or in local workers."""
    cfg = dataclasses.replace(cfg, device=distributed.resolve_device(cfg.device))
    check(cfg)
    if distributed.restart_count() == 0:
        check_out_dir(cfg.out, cfg.overwrite, cfg.resume)
    _run_workers(train, cfg, cfg.nproc, cfg.max_restarts)


# ---------------------------------------------------------------------------------------------
# Fine-tuning


def train(cfg: FinetuneConfig) -> Path:
    env = distributed.init(cfg.device)
    # A restart by torchrun --max-restarts (or our --max-restarts) resumes by itself.
    resume = cfg.resume or distributed.restart_count() > 0
    plan = check(cfg)
    device, world = env.device, env.world_size
    out = Path(cfg.out)
    if env.is_main:
        checkpoint.open_run_dir(out, start_afresh=cfg.overwrite and not resume)
    distributed.barrier()
    resume_from = checkpoint.latest_checkpoint(out) if resume else None
    state = checkpoint.load_training_state(resume_from) if resume_from is not None else None

    # Data: encoded once; every epoch a fresh order, cut into global batches shared by the ranks.
    tokenizer = Tokenizer(model_vocab(plan.model_dir), plan.lowercase)
    id2label = plan.model_config.id2label
    label2id = {name: i for i, name in id2label.items()}
    train_set = ClassificationDataset(plan.train, tokenizer, cfg.max_seq_length, label2id)
    eval_set = ClassificationDataset(plan.eval, tokenizer, cfg.max_seq_length, label2id)
    b = cfg.batch_size
    lengths = train_set.lengths if cfg.group_by_length else None  # batches of similar length pad little
    steps_per_epoch = len(train_batches(len(train_set), b, world, env.rank, cfg.seed, 1, lengths))
    if steps_per_epoch == 0:
        raise UserError(f"{len(train_set)} training example(s) cannot be shared by {world} processes")
    optim = OptimConfig(lr=cfg.lr, warmup=cfg.warmup, steps=cfg.epochs * steps_per_epoch,
                        weight_decay=cfg.weight_decay, clip=MAX_GRAD_NORM, adam_eps=ADAM_EPS)
    if state is not None:
        _check_resumable(state, resume_from, list(id2label.values()), len(train_set), b * world,
                         cfg.group_by_length)

    # Model: the pretrained encoder; a fresh head unless the directory has one for these very labels.
    # On resume, the checkpoint's whole classifier.
    torch.manual_seed(cfg.seed)
    model = BertForSequenceClassification(plan.model_config)
    if resume_from is not None:
        checkpoint.load_weights(model, resume_from)
    else:
        checkpoint.load_weights(model if plan.keep_head else model.bert, plan.model_dir)
    model.to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world > 1 else None
    net = ddp or model
    torch.manual_seed(cfg.seed + 1 + env.rank)  # dropout: a generator of this rank's own

    precision = resolve_precision(cfg.precision, device)
    optimizer = build_optimizer(model, optim, device)
    schedule = build_schedule(optimizer, optim)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    allow_tf32(device)
    # Running sums on the device (no host sync inside a step): loss, correct, examples, real tokens.
    window = torch.zeros(4, dtype=torch.float64, device=device)
    epoch_sums = torch.zeros(4, dtype=torch.float64, device=device)
    history: list[dict[str, Any]] = []
    kept: list[Path] = []
    best: dict[str, Any] | None = None
    step = steps_in_window = in_epoch = 0
    first_epoch = 1
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        scaler.load_state_dict(state["scaler"])
        step, first_epoch, in_epoch = state["step"], state["position"]["epoch"], state["position"]["step_in_epoch"]
        restore_rng_state(state["rng"], env.rank, world, device)
        history, best = state["history"], state["best"]
        kept = [out / p for p in state["kept"]]
        steps_in_window = state["steps_in_window"]
        if env.is_main:  # the all-reduced sums of the interrupted run come back once, on rank 0
            window += state["window"].to(device)
            epoch_sums += state["epoch_sums"].to(device)

    meter = Throughput(0.0, None, world)
    log = RunLog(out, env.is_main, start_step=step)
    if env.is_main:
        for warning in plan.warnings:
            print(f"bertgpu: warning: {warning}", file=sys.stderr, flush=True)
        n_params = sum(p.numel() for p in model.parameters())
        how = f"; resuming from {resume_from} at step {step}" if resume_from is not None else ""
        print(f"bertgpu finetune: {n_params / 1e6:.1f}M parameters, {world} process(es) on {device.type}, "
              f"{precision}, {len(train_set):,} training and {len(eval_set):,} evaluation examples, "
              f"labels {', '.join(id2label.values())}, global batch {b * world} = {b} x {world}, "
              f"{optim.steps} steps in {cfg.epochs} epoch(s){how}", flush=True)
    bar = tqdm(total=optim.steps, initial=step, disable=not (env.is_main and console_is_tty()), unit="step")
    write = tqdm.write if not bar.disable else _print

    def save_state(epoch: int, in_epoch: int) -> Path:
        """A resumable checkpoint (out/checkpoints/step-N, only the newest kept): the classifier plus
        optimizer, schedule, scaler, every rank's RNG, the data position and the run's records."""
        rngs = gather_rng_states(device)
        sums = [distributed.all_reduce_sum(t.clone()).cpu() for t in (window, epoch_sums)]
        path = out / "checkpoints" / f"step-{step:07d}"
        if env.is_main:
            state = {"position": {"epoch": epoch, "step_in_epoch": in_epoch}, "optimizer": optimizer.state_dict(),
                     "schedule": schedule.state_dict(), "scaler": scaler.state_dict(), "rng": rngs,
                     "window": sums[0], "epoch_sums": sums[1], "steps_in_window": steps_in_window,
                     "history": history, "best": best, "kept": [str(p.relative_to(out)) for p in kept],
                     "labels": list(id2label.values()), "train_examples": len(train_set), "global_batch": b * world,
                     "group_by_length": cfg.group_by_length,
                     "world_size": world}
            path = checkpoint.save_checkpoint(out, step, model, plan.model_config, state, cfg,
                                              vocab_path=model_vocab(plan.model_dir), do_lower_case=plan.lowercase,
                                              keep=1)
        distributed.barrier()
        return path

    def interrupted(signum: int, path: Path) -> distributed.Interrupted:
        name = signal.Signals(signum).name if signum else "a signal on another rank"
        return distributed.Interrupted(f"stopped by {name} after step {step}; checkpoint {path}. "
                                       "Run the same command with --resume to continue.", signum or signal.SIGTERM)

    stop = StopSignal()
    flags = LaggedFlags(device)
    try:
        for epoch in range(first_epoch, cfg.epochs + 1):
            net.train()
            batches = train_batches(len(train_set), b, world, env.rank, cfg.seed, epoch, lengths)
            for indices, global_size in batches[in_epoch:]:  # on resume: straight to the next batch
                batch = {k: v.to(device, non_blocking=True) for k, v in train_set.batch(indices).items()}
                with autocast(precision, device):
                    logits = net(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
                loss_sum = F.cross_entropy(logits.float(), batch["labels"], reduction="sum")
                # DDP averages gradients over processes; scale so the result is the global batch's mean loss's.
                scaler.scale(loss_sum / global_size * world).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
                scaler.step(optimizer)
                scaler.update()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                in_epoch += 1
                steps_in_window += 1
                bar.update(1)
                with torch.no_grad():
                    sums = torch.stack([loss_sum.detach(), (logits.argmax(-1) == batch["labels"]).sum(),
                                        torch.full((), len(indices), device=device),
                                        batch["attention_mask"].sum()]).double()
                    window += sums
                    epoch_sums += sums
                # Did any rank get SIGINT/SIGTERM? Read on the host one step late on a GPU (no wait).
                stop_flag = distributed.all_reduce_sum(torch.full((1,), float(stop.signum > 0), device=device))
                stop_now = any(values[0] > 0 for _, values in flags.push(step, stop_flag))

                if step % cfg.log_every == 0:
                    s = distributed.all_reduce_sum(window.clone()).tolist()
                    window.zero_()
                    rates = meter.rates(steps_in_window, int(s[2]), int(s[3]))
                    steps_in_window = 0
                    values = {"loss": s[0] / s[2], "accuracy": s[1] / s[2], "lr": schedule.get_last_lr()[0],
                              "epoch": epoch, **rates}
                    _check_finite(values["loss"], step)
                    log.log(step, values, f"epoch {epoch} step {step}/{optim.steps} | loss {values['loss']:.4f} | "
                            f"acc {values['accuracy']:.3f} | lr {values['lr']:.2e} | "
                            f"{format_rate(rates['seq_per_s'])} examples/s", write=write)
                if stop_now:
                    raise interrupted(stop.signum, save_state(epoch, in_epoch))
                if step % cfg.save_every == 0 and in_epoch < len(batches):  # the epoch's end saves anyway
                    save_state(epoch, in_epoch)

            if any(values[0] > 0 for _, values in flags.flush()):
                raise interrupted(stop.signum, save_state(epoch, in_epoch))  # resumes at this evaluation
            in_epoch = 0

            # Evaluate, save, keep the best.
            meter.pause()
            s = distributed.all_reduce_sum(epoch_sums.clone()).tolist()
            epoch_sums.zero_()
            metrics = compute_metrics(predict_logits(model, eval_set, b, env, precision), eval_set.labels)
            record = {"epoch": epoch, "step": step, "train_loss": s[0] / s[2], "train_accuracy": s[1] / s[2],
                      **{f"eval_{k}": v for k, v in metrics.items()}}
            _check_finite(record["train_loss"], step)
            history.append(record)
            is_best = best is None or record[f"eval_{cfg.metric}"] > best[f"eval_{cfg.metric}"]
            best = record if is_best else best
            line = (f"epoch {epoch} eval | loss {metrics['loss']:.4f} | accuracy {metrics['accuracy']:.4f} | "
                    f"f1 {metrics['f1']:.4f} | {metrics['examples']} examples{' | best so far' if is_best else ''}")
            log.log(step, {k: v for k, v in record.items() if k != "step"}, line, write=write)
            if env.is_main:
                kept = save_epoch(out, epoch, model, plan, cfg, record, kept, best, is_best)
                _write_json_atomic(out / METRICS_NAME, {
                    "metric": cfg.metric, "best_epoch": best["epoch"], "best_checkpoint": _epoch_dir(best["epoch"]),
                    "best": best, "labels": list(id2label.values()), "train_examples": len(train_set),
                    "eval_examples": len(eval_set), "epochs": history})
            path = save_state(epoch + 1, 0)
            meter.resume()  # the rate covers training steps only, not this evaluation
            if distributed.all_reduce_sum(torch.tensor([float(stop.signum > 0)], device=device)).item():
                raise interrupted(stop.signum, path)  # a signal during the evaluation: all of it is saved
    finally:
        stop.restore()
        bar.close()
        log.close()
    if env.is_main:
        print(f"best: epoch {best['epoch']}, {cfg.metric} {best[f'eval_{cfg.metric}']:.4f} -> {out / 'best'}  "
              f"(transformers.BertForSequenceClassification.from_pretrained('{out / 'best'}'), "
              f"or bertgpu predict --model {out / 'best'} TEXT)", flush=True)
    return out / "best"


def _check_resumable(state: dict[str, Any], path: Path, labels: list[str], train_examples: int,
                     global_batch: int, group_by_length: bool) -> None:
    """A resumed run must see the data and batches it was trained on, or its position means nothing."""
    was = (state.get("labels"), state.get("train_examples"), state.get("global_batch"))
    if was[0] != labels:
        raise UserError(f"cannot resume from {path}: it was trained on labels {was[0]}, the data has {labels}")
    if was[1] != train_examples:
        raise UserError(f"cannot resume from {path}: it was trained on {was[1]} examples, the training data now "
                        f"has {train_examples}; resume with the same data, or start afresh with --overwrite")
    if was[2] != global_batch:
        raise UserError(f"cannot resume from {path}: its global batch was {was[2]} (batch size x processes), "
                        f"now {global_batch}; resume with the same --batch-size and number of processes")
    if state.get("group_by_length", group_by_length) != group_by_length:
        raise UserError(f"cannot resume from {path}: it was trained with{'out' if group_by_length else ''} "
                        f"--no-group-by-length, which orders the batches; resume with the same setting")


def _print(line: str) -> None:
    print(line, flush=True)


def _check_finite(loss: float, step: int) -> None:
    """Stop on a diverged run (every rank sees the same all-reduced loss, so all stop together)."""
    if not math.isfinite(loss):
        raise UserError(f"the training loss became {loss} by step {step}; lower --lr, or use fp32/bf16 "
                        f"instead of fp16")


def _epoch_dir(epoch: int) -> str:
    return f"checkpoints/epoch-{epoch:03d}"


def save_epoch(out: Path, epoch: int, model: torch.nn.Module, plan: Plan, cfg: FinetuneConfig,
               record: dict[str, Any], kept: list[Path], best: dict[str, Any], is_best: bool) -> list[Path]:
    """Write this epoch's checkpoint, keep the best and the newest up to --save-total-limit, and
    refresh ``out/best``. Every directory appears complete or not at all. Return the kept ones."""
    path = out / _epoch_dir(epoch)
    try:
        with checkpoint.atomic_directory(path) as tmp:
            checkpoint.write_pretrained(model, plan.model_config, tmp, vocab_path=model_vocab(plan.model_dir),
                                        do_lower_case=plan.lowercase, architecture=ARCHITECTURE)
            _write_json(tmp / METRICS_NAME, record)
            _write_json(tmp / checkpoint.RUN_CONFIG_NAME, {"task": "finetune", "epoch": epoch, "step": record["step"],
                                                           "config": dataclasses.asdict(cfg)})
        if is_best:
            # Hard links: the best directory costs no space, and stays whole when its epoch is pruned.
            with checkpoint.atomic_directory(out / "best") as tmp:
                shutil.copytree(path, tmp, dirs_exist_ok=True, copy_function=_link_or_copy)
    except OSError as e:
        raise UserError(f"could not write checkpoint {path} ({e.strerror or e})") from None
    kept = kept + [path]
    best_path = out / _epoch_dir(best["epoch"])
    newest = [p for p in kept if p != best_path][-(cfg.save_total_limit - 1):] if cfg.save_total_limit > 1 else []
    keep = (set(newest) | {best_path}) if cfg.save_total_limit else set(kept)
    for old in kept:
        if old not in keep:
            shutil.rmtree(old, ignore_errors=True)
    return [p for p in kept if p in keep]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_json_atomic(path: Path, obj: Any) -> None:
    _write_atomic(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def _write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that a crash leaves the old file or the complete new one, never half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"could not write {path} ({e.strerror or e})") from None


# ---------------------------------------------------------------------------------------------
# Evaluation: sharded over the ranks, gathered in example order, metrics computed once.


@torch.no_grad()
def predict_logits(model: BertForSequenceClassification, dataset: ClassificationDataset, batch_size: int,
                   env: distributed.DistEnv, precision: str) -> torch.Tensor:
    """Logits of every example, ``[N, num_labels]`` in float64 on the CPU, identical on every rank.

    Each rank fills the rows of its batches in a zero array and the arrays are summed: every row
    comes from exactly one rank, and adding zeros is exact.
    """
    was_training = model.training
    model.eval()
    logits = torch.zeros(len(dataset), model.config.num_labels, dtype=torch.float64, device=env.device)
    for indices in eval_batches(dataset.lengths, batch_size, env.world_size, env.rank):
        batch = {k: v.to(env.device, non_blocking=True) for k, v in dataset.batch(indices).items()}
        with autocast(precision, env.device):
            out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        logits[indices] = out.double()
    model.train(was_training)
    return distributed.all_reduce_sum(logits).cpu()


def compute_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """Mean loss, accuracy and F1 (of label id 1 with two classes, else the macro average over the
    classes present in labels or predictions, as scikit-learn's f1_score), and the confusion matrix
    (rows: true label, columns: predicted)."""
    num_labels = logits.size(1)
    labels = labels.cpu()
    predictions = logits.argmax(-1)
    confusion = torch.zeros(num_labels, num_labels, dtype=torch.long)
    confusion.index_put_((labels, predictions), torch.ones_like(labels), accumulate=True)
    tp = confusion.diag()
    fp_fn = confusion.sum(0) + confusion.sum(1) - 2 * tp
    f1 = torch.where(2 * tp + fp_fn > 0, 2 * tp / (2 * tp + fp_fn).clamp(min=1), torch.zeros(()))
    if num_labels == 2:
        f1_value = f1[1].item()
    else:
        present = (confusion.sum(0) + confusion.sum(1)) > 0
        f1_value = f1[present].mean().item()
    return {"loss": F.cross_entropy(logits, labels).item(), "accuracy": tp.sum().item() / len(labels),
            "f1": f1_value, "examples": len(labels), "confusion": confusion.tolist()}


def check_evaluate(cfg: EvaluateConfig) -> tuple[Examples, list[str], Path]:
    """The labelled examples to evaluate on, the model's labels as the data names them (``as_data_labels``)
    and where the metrics go; UserError on any mistake."""
    model_dir, config = check_model_dir(cfg.model)
    if not config.id2label:
        raise UserError(f"{model_dir} is not a classifier: its config.json has no id2label "
                        f"(fine-tune it first: bertgpu finetune --model {model_dir} ...)")
    resolve_precision(cfg.precision, torch.device(distributed.resolve_device(cfg.device)))
    examples = load_examples(cfg.data, cfg.text_column, cfg.pair_column or None, cfg.label_column, cfg.format)
    names = as_data_labels([config.id2label[i] for i in sorted(config.id2label)], examples)
    check_labels(examples, names, f"the model's labels ({model_dir / 'config.json'})")
    output = Path(cfg.output) if cfg.output else model_dir / "eval_results.json"
    if output.is_dir() or not os.access(output.parent, os.W_OK):
        raise UserError(f"cannot write the metrics to {output}; choose another --output")
    return examples, names, output


def run_evaluate(cfg: EvaluateConfig) -> None:
    """Check, then evaluate here or in local workers (each takes a share of the batches)."""
    cfg = dataclasses.replace(cfg, device=distributed.resolve_device(cfg.device))
    check_evaluate(cfg)
    _run_workers(evaluate, cfg, cfg.nproc)


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    env = distributed.init(cfg.device)
    examples, names, output = check_evaluate(cfg)
    clf = Classifier.load(cfg.model, env.device, cfg.max_seq_length or None)
    dataset = ClassificationDataset(examples, clf.tokenizer, clf.max_seq_length, {name: i for i, name in enumerate(names)})
    precision = resolve_precision(cfg.precision, env.device)
    metrics = compute_metrics(predict_logits(clf.model, dataset, cfg.batch_size, env, precision), dataset.labels)
    result = {"model": str(cfg.model), "data": str(cfg.data), "labels": clf.labels,
              "f1_average": f"binary ({clf.labels[1]})" if len(clf.labels) == 2 else "macro",
              "max_seq_length": clf.max_seq_length, "skipped_rows": len(examples.skipped), **metrics}
    if env.is_main:
        if examples.skipped_warning():
            print(f"bertgpu: warning: {examples.skipped_warning()}", file=sys.stderr, flush=True)
        print(f"{cfg.data}: {metrics['examples']} examples | loss {metrics['loss']:.4f} | "
              f"accuracy {metrics['accuracy']:.4f} | f1 {metrics['f1']:.4f} ({result['f1_average']})", flush=True)
        _write_json_atomic(output, result)
        print(f"metrics: {output}", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Prediction: one process (it is the model's inference, not a training job).

PREDICTION_COLUMNS = ("prediction", "probability")


def run_predict(cfg: PredictConfig) -> None:
    device = distributed.resolve_device(cfg.device)
    if not cfg.input:
        check_model_dir(cfg.model)
        clf = Classifier.load(cfg.model, device, cfg.max_seq_length or None)
        result = clf(cfg.texts[0], cfg.texts[1] if len(cfg.texts) == 2 else None)
        print(f"{result['label']}\t{result['score']:.4f}")
        return
    table = read_table(cfg.input, cfg.format)
    require_columns(table, text_column=cfg.text_column, pair_column=cfg.pair_column or None)
    out_format = detect_format(cfg.output) if Path(cfg.output).suffix else table.format
    check_model_dir(cfg.model)
    clf = Classifier.load(cfg.model, device, cfg.max_seq_length or None)

    def field(record: dict[str, Any], column: str) -> str:
        value = record.get(column)
        return "" if value is None else str(value)

    inputs = [(field(r, cfg.text_column), field(r, cfg.pair_column) if cfg.pair_column else None)
              for _, r in table.rows]
    usable = [i for i, (a, b) in enumerate(inputs) if a.strip() and (b is None or b.strip())]
    predictions: dict[int, tuple[str, float]] = {}
    chunk = cfg.batch_size * 16
    with tqdm(total=len(usable), unit="example", disable=not console_is_tty(), file=sys.stderr) as bar:
        for start in range(0, len(usable), chunk):
            rows = usable[start:start + chunk]
            probs = clf.predict_proba([inputs[i] if inputs[i][1] is not None else inputs[i][0] for i in rows],
                                      batch_size=cfg.batch_size)
            for i, p in zip(rows, probs):
                k = int(p.argmax())
                predictions[i] = (clf.labels[k], round(float(p[k]), 6))
            bar.update(len(rows))
    skipped = [table.rows[i][0] for i in range(len(inputs)) if i not in predictions]
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        print(f"bertgpu: warning: {table.path}: {len(skipped)} row(s) with an empty text left without prediction "
              f"(lines {shown})", file=sys.stderr, flush=True)
    _write_atomic(Path(cfg.output), _render(table, predictions, out_format, cfg.output.lower().endswith(".gz")))
    print(f"{len(predictions)} predictions -> {cfg.output}")


def _render(table: Table, predictions: dict[int, tuple[str, float]], fmt: str, compress: bool) -> bytes:
    """The input's rows plus the prediction columns, as CSV, TSV or JSONL."""
    buffer = io.StringIO()
    if fmt == "jsonl":
        for i, (_, record) in enumerate(table.rows):
            label, score = predictions.get(i, ("", ""))
            buffer.write(json.dumps({**record, PREDICTION_COLUMNS[0]: label, PREDICTION_COLUMNS[1]: score},
                                    ensure_ascii=False) + "\n")
    else:
        columns = [c for c in table.columns if c not in PREDICTION_COLUMNS] + list(PREDICTION_COLUMNS)
        writer = csv.writer(buffer, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\n")
        writer.writerow(columns)
        for i, (_, record) in enumerate(table.rows):
            label, score = predictions.get(i, ("", ""))
            row = {**record, PREDICTION_COLUMNS[0]: label, PREDICTION_COLUMNS[1]: score}
            writer.writerow(["" if row.get(c) is None else row[c] for c in columns])
    data = buffer.getvalue().encode("utf-8")
    return gzip.compress(data) if compress else data
