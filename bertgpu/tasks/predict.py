"""`bertgpu evaluate` and `bertgpu predict`, and the evaluation fine-tuning runs after every epoch.

Evaluation is sharded so that every example counts exactly once: the batches are the same whatever
the number of processes, data-parallel rank r takes every dp-th of them, and the logits are gathered
into one array in example order before any metric is computed. The metrics of N processes are
therefore those of one.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import atomic, checkpoint, hf_dir
from ..classifier import Classifier, classifier_dir, model_vocab
from ..config import EvaluateConfig, ModelConfig, PredictConfig
from ..data.classification import (
    ClassificationDataset,
    Examples,
    Table,
    as_data_labels,
    check_labels,
    detect_format,
    eval_batches,
    load_examples,
    read_table,
    require_columns,
)
from ..data.tokenizer import load_vocab
from ..errors import UserError
from ..parallel import ParallelDims, launch
from ..paths import refuse_clobbering
from ..training import autocast, console_is_tty, resolve_precision
from .common import run_workers


def check_model_dir(path: str) -> tuple[Path, ModelConfig]:
    """A BERT directory with config.json, model.safetensors and vocab.txt."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise UserError(
            f"--model {path}: no such directory (a BERT directory: config.json, model.safetensors, vocab.txt)"
        )
    if not (model_dir / "config.json").is_file():
        newest = checkpoint.latest_checkpoint(model_dir)
        if newest is None:
            raise UserError(
                f"--model {path} has no config.json: not a BERT directory, nor a `bertgpu pretrain` run "
                "with a checkpoint"
            )
        model_dir = newest  # a pretraining run's --out: its newest checkpoint, as finetune's start line says
    config = ModelConfig.load(model_dir)
    if not (model_dir / hf_dir.WEIGHTS_NAME).is_file():
        if (model_dir / "pytorch_model.bin").is_file():
            raise UserError(
                f"{model_dir} holds only pytorch_model.bin, a pickle that can run code when loaded; "
                f"convert it to model.safetensors first "
                f"(in transformers: from_pretrained, then save_pretrained)"
            )
        raise UserError(
            f"{model_dir} has no {hf_dir.WEIGHTS_NAME}: fine-tuning starts from trained weights "
            f"(a `bertgpu pretrain` checkpoint or a Hugging Face BERT directory)"
        )
    vocab_size = len(load_vocab(model_vocab(model_dir)))
    if vocab_size > config.vocab_size:
        raise UserError(
            f"{model_dir / 'vocab.txt'} has {vocab_size} tokens, more than the model's vocab_size "
            f"{config.vocab_size} (config.json): the vocab is not this model's"
        )
    return model_dir, config


# ---------------------------------------------------------------------------------------------
# Evaluation: sharded over the data-parallel ranks, gathered in example order, metrics computed once.


@torch.no_grad()
def predict_logits(
    model: Any,
    dataset: ClassificationDataset,
    batch_size: int,
    dims: ParallelDims,
    device: torch.device,
    precision: str,
    shares: list[int] | None = None,
) -> torch.Tensor:
    """Logits of every example, ``[N, num_labels]`` in float64 on the CPU, identical on every rank.

    ``model`` is a classifier, or a ``ParallelModel`` of one; ``shares`` the ranks' shares of the
    batches (unequal GPUs). Each data-parallel rank fills the rows of its batches in a zero array and
    the arrays are summed over the data-parallel ranks: every row
    comes from exactly one, and adding zeros is exact. Under FSDP every forward pass is collective,
    so a rank with fewer batches runs its last one again (its result unused), to keep in step.
    """
    was_training = model.training
    model.eval()
    logits = torch.zeros(len(dataset), model.config.num_labels, dtype=torch.float64, device=device)
    batches = eval_batches(dataset.lengths, batch_size, dims.dp, dims.dp_rank, shares)
    if dims.fsdp:
        rounds = max(len(eval_batches(dataset.lengths, batch_size, dims.dp, r, shares)) for r in range(dims.dp))
        batches = batches + [None] * (rounds - len(batches))
    last = None
    for indices in batches:
        batch = {k: v.to(device, non_blocking=True) for k, v in dataset.batch(indices or last).items()}
        with autocast(precision, device):
            out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        if indices is not None:
            logits[indices] = out.double()
            last = indices
    model.train(was_training)
    return dims.dp_sum(logits).cpu()


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
    return {
        "loss": F.cross_entropy(logits, labels).item(),
        "accuracy": tp.sum().item() / len(labels),
        "f1": f1_value,
        "examples": len(labels),
        "confusion": confusion.tolist(),
    }


def check_evaluate(cfg: EvaluateConfig) -> tuple[Examples, list[str], Path]:
    """The labelled examples to evaluate on, the model's labels as the data names them (``as_data_labels``)
    and where the metrics go; UserError on any mistake."""
    model_dir, config = check_model_dir(cfg.model)
    if not config.id2label:
        raise UserError(
            f"{model_dir} is not a classifier: its config.json has no id2label "
            f"(fine-tune it first: bertgpu finetune --model {model_dir} ...)"
        )
    resolve_precision(cfg.precision, torch.device(launch.resolve_device(cfg.device)))
    examples = load_examples(cfg.data, cfg.text_column, cfg.pair_column or None, cfg.label_column, cfg.format)
    names = as_data_labels([config.id2label[i] for i in sorted(config.id2label)], examples)
    check_labels(examples, names, f"the model's labels ({model_dir / 'config.json'})")
    output = Path(cfg.output) if cfg.output else model_dir / "eval_results.json"
    if output.is_dir() or not os.access(output.parent, os.W_OK):
        raise UserError(f"cannot write the metrics to {output}; choose another --output")
    return examples, names, output


def run_evaluate(cfg: EvaluateConfig) -> None:
    """Check, then evaluate here or in local workers (each takes a share of the batches). A
    `bertgpu finetune` output directory stands for its final classifier, ``best/``."""
    refuse_clobbering({"--output": cfg.output}, {"--model": cfg.model, "--data": cfg.data})
    cfg = dataclasses.replace(cfg, device=launch.resolve_device(cfg.device), model=str(classifier_dir(cfg.model)))
    check_evaluate(cfg)
    run_workers(evaluate, cfg)


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    env = launch.init(cfg.device)
    dims = ParallelDims(env.world_size)  # every process a data-parallel rank holding the whole model
    dims.build_mesh(env.device.type)
    examples, names, output = check_evaluate(cfg)
    clf = Classifier.load(cfg.model, env.device, cfg.max_seq_length or None)
    dataset = ClassificationDataset(
        examples, clf.tokenizer, clf.max_seq_length, {name: i for i, name in enumerate(names)}
    )
    precision = resolve_precision(cfg.precision, env.device)
    metrics = compute_metrics(
        predict_logits(clf.model, dataset, cfg.batch_size, dims, env.device, precision), dataset.labels
    )
    result = {
        "model": str(cfg.model),
        "data": str(cfg.data),
        "labels": clf.labels,
        "f1_average": f"binary ({clf.labels[1]})" if len(clf.labels) == 2 else "macro",
        "max_seq_length": clf.max_seq_length,
        "skipped_rows": len(examples.skipped),
        **metrics,
    }
    if env.is_main:
        if examples.skipped_warning():
            print(f"bertgpu: warning: {examples.skipped_warning()}", file=sys.stderr, flush=True)
        print(
            f"{cfg.data}: {metrics['examples']} examples | loss {metrics['loss']:.4f} | "
            f"accuracy {metrics['accuracy']:.4f} | f1 {metrics['f1']:.4f} ({result['f1_average']})",
            flush=True,
        )
        atomic.write_json(output, result)
        print(f"metrics: {output}", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Prediction: one process (it is the model's inference, not a training job).

PREDICTION_COLUMNS = ("prediction", "probability")


def run_predict(cfg: PredictConfig) -> None:
    """One text (or pair) printed, or a whole file written. A `bertgpu finetune` output directory
    stands for its final classifier, ``best/``."""
    refuse_clobbering({"--output": cfg.output}, {"--model": cfg.model, "--input": cfg.input})
    cfg = dataclasses.replace(cfg, model=str(classifier_dir(cfg.model)))
    device = launch.resolve_device(cfg.device)
    if not cfg.input:
        if not all(text.strip() for text in cfg.texts):
            raise UserError(
                "an empty text: there is nothing to classify (a file's empty rows are skipped the same way)"
            )
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

    inputs = [
        (field(r, cfg.text_column), field(r, cfg.pair_column) if cfg.pair_column else None) for _, r in table.rows
    ]
    usable = [i for i, (a, b) in enumerate(inputs) if a.strip() and (b is None or b.strip())]
    predictions: dict[int, tuple[str, float]] = {}
    chunk = cfg.batch_size * 16
    with tqdm(total=len(usable), unit="example", disable=not console_is_tty(), file=sys.stderr) as bar:
        for start in range(0, len(usable), chunk):
            rows = usable[start : start + chunk]
            probs = clf.predict_proba(
                [inputs[i] if inputs[i][1] is not None else inputs[i][0] for i in rows], batch_size=cfg.batch_size
            )
            for i, p in zip(rows, probs):
                k = int(p.argmax())
                predictions[i] = (clf.labels[k], round(float(p[k]), 6))
            bar.update(len(rows))
    skipped = [table.rows[i][0] for i in range(len(inputs)) if i not in predictions]
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        print(
            f"bertgpu: warning: {table.path}: {len(skipped)} row(s) with an empty text left without prediction "
            f"(lines {shown})",
            file=sys.stderr,
            flush=True,
        )
    atomic.write_bytes(Path(cfg.output), _render(table, predictions, out_format, cfg.output.lower().endswith(".gz")))
    print(f"{len(predictions)} predictions -> {cfg.output}")


def _render(table: Table, predictions: dict[int, tuple[str, float]], fmt: str, compress: bool) -> bytes:
    """The input's rows plus the prediction columns, as CSV, TSV or JSONL."""
    buffer = io.StringIO()
    if fmt == "jsonl":
        for i, (_, record) in enumerate(table.rows):
            label, score = predictions.get(i, ("", ""))
            buffer.write(
                json.dumps({**record, PREDICTION_COLUMNS[0]: label, PREDICTION_COLUMNS[1]: score}, ensure_ascii=False)
                + "\n"
            )
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
