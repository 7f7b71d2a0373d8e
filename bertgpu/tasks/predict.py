"""`bertgpu evaluate` and `bertgpu predict`; the sharded evaluation itself is ``sharded_eval``'s, which
fine-tuning runs after every epoch too."""

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
from tqdm import tqdm

from bertgpu import atomic
from bertgpu.config import EvaluateConfig, PredictConfig
from bertgpu.data.classification import (
    ClassificationDataset,
    Examples,
    Table,
    as_data_labels,
    check_labels,
    detect_format,
    load_examples,
    read_lines,
    read_table,
    require_columns,
)
from bertgpu.errors import UserError
from bertgpu.parallel import ParallelDims, launch
from bertgpu.paths import refuse_clobbering, refuse_existing
from bertgpu.tasks.checks import check_evaluate_flags, check_predict_flags
from bertgpu.tasks.classifier import COLUMNS, Classifier, classifier_dir, finetuned_columns, not_a_classifier
from bertgpu.tasks.model_dirs import check_model_dir
from bertgpu.tasks.prelaunch import run_local_workers
from bertgpu.tasks.sharded_eval import (
    compute_metrics,
    describe_f1,
    missing_labels_warning,
    per_class_table,
    predict_logits,
)
from bertgpu.training.precision import resolve_precision
from bertgpu.training.runlog import console_is_tty


def check_evaluate(cfg: EvaluateConfig) -> tuple[Examples, list[str], Path]:
    """The labelled examples to evaluate on, the model's labels as the data names them (``as_data_labels``)
    and where the metrics go; UserError on any mistake."""
    model_dir, config = check_model_dir(cfg.model)
    if not config.id2label:
        raise not_a_classifier(model_dir)
    resolve_precision(cfg.precision, torch.device(launch.resolve_device(cfg.device)))
    examples = load_examples(
        cfg.data, cfg.text_column, cfg.pair_column or None, cfg.label_column, cfg.format, cfg.delimiter
    )
    names = as_data_labels([config.id2label[i] for i in sorted(config.id2label)], examples)
    check_labels(examples, names, f"the model's labels ({model_dir / 'config.json'})")
    output = Path(cfg.output) if cfg.output else model_dir / "eval_results.json"
    if output.is_dir() or not os.access(output.parent, os.W_OK):
        raise UserError(f"cannot write the metrics to {output}; choose another --output")
    return examples, names, output


def run_evaluate(cfg: EvaluateConfig) -> None:
    """Check, then evaluate here or in local workers (each takes a share of the batches). A
    `bertgpu finetune` output directory stands for its final classifier, ``best/``."""
    cfg = check_evaluate_flags(cfg)
    refuse_clobbering({"--output": cfg.output}, {"--model": cfg.model, "--data": cfg.data})
    refuse_existing("--output", cfg.output, cfg.overwrite)  # the default, eval_results.json, is replaced
    cfg = dataclasses.replace(cfg, device=launch.resolve_device(cfg.device), model=str(classifier_dir(cfg.model)))
    cfg = with_columns(cfg, cfg.model)
    check_evaluate(cfg)
    run_local_workers(evaluate, cfg, cfg.nproc, cfg.device)


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
        predict_logits(clf.model, dataset, cfg.batch_size, dims, env.device, precision), dataset.labels, clf.labels
    )
    result = {
        "model": str(cfg.model),
        "data": str(cfg.data),
        "labels": clf.labels,
        "f1_average": describe_f1(metrics, clf.labels),
        "max_seq_length": clf.max_seq_length,
        "skipped_rows": len(examples.skipped),
        **metrics,
    }
    if env.is_main:
        for warning in (examples.note, examples.skipped_warning(), missing_labels_warning(metrics, str(cfg.data))):
            if warning:
                print(f"bertgpu: warning: {warning}", file=sys.stderr, flush=True)
        if cfg.json:
            print(json.dumps(result, ensure_ascii=False), flush=True)
        else:
            print(
                f"{cfg.data}: {metrics['examples']} examples | loss {metrics['loss']:.4f} | "
                f"accuracy {metrics['accuracy']:.4f} | f1 {metrics['f1']:.4f} ({result['f1_average']})",
                *per_class_table(metrics),
                sep="\n",
                flush=True,
            )
        atomic.write_json(output, result)
        print(f"metrics: {output}", file=sys.stderr if cfg.json else sys.stdout, flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Prediction: one process (it is the model's inference, not a training job).

PREDICTION_COLUMNS = ("prediction", "probability")


def with_columns(cfg: EvaluateConfig | PredictConfig, model_dir: str | os.PathLike) -> Any:
    """``cfg`` (evaluate's or predict's) with each column flag left out taken from the classifier's fine-tuning
    run (its bertgpu.json), else the default (text, label, no pair column). Predict reads no labels."""
    saved = finetuned_columns(model_dir) or COLUMNS
    columns = {"text_column": cfg.text_column, "pair_column": cfg.pair_column}
    if isinstance(cfg, EvaluateConfig):
        columns["label_column"] = cfg.label_column
    return dataclasses.replace(cfg, **{name: value or saved[name] for name, value in columns.items()})


def _pair_column(model_dir: Path) -> str | None:
    """The pair column a classifier was fine-tuned with ("" for single texts; None: not known)."""
    columns = finetuned_columns(model_dir)
    return None if columns is None else columns["pair_column"]


def _inputs_of_texts(cfg: PredictConfig, model_dir: Path) -> list[tuple[str, str | None]]:
    """The positional texts as the classifier takes them: each on its own, or one text and its pair text."""
    texts = cfg.texts
    if not all(text.strip() for text in texts):
        raise UserError("an empty text: there is nothing to classify (a file's empty rows are skipped the same way)")
    pair = _pair_column(model_dir)
    if pair:
        if len(texts) != 2:
            raise UserError(
                f"{cfg.model} classifies sentence pairs (fine-tuned with --pair-column {pair}): give a text and its "
                f"pair text, or --input FILE with both columns for many pairs; got {len(texts)} texts"
            )
        return [(texts[0], texts[1])]
    if pair is None and len(texts) == 2:
        raise UserError(
            f"{cfg.model} was not fine-tuned by bertgpu, so whether it takes single texts or pairs is not known: "
            "give one text at a time, or --input FILE with --text-column (and --pair-column for pairs)"
        )
    return [(text, None) for text in texts]


def run_predict(cfg: PredictConfig) -> None:
    """Texts (or a pair) printed, or every row of a file (``-``: standard input) printed or written. A
    `bertgpu finetune` output directory stands for its final classifier, ``best/``."""
    cfg = check_predict_flags(cfg)
    refuse_clobbering({"--output": cfg.output}, {"--model": cfg.model, "--input": cfg.input})
    refuse_existing("--output", cfg.output, cfg.overwrite)
    cfg = dataclasses.replace(cfg, model=str(classifier_dir(cfg.model)))
    device = launch.resolve_device(cfg.device)
    if not cfg.input:
        model_dir, _ = check_model_dir(cfg.model)
        inputs = _inputs_of_texts(cfg, model_dir)
        clf = Classifier.load(cfg.model, device, cfg.max_seq_length or None)
        probs = clf.predict_proba([a if b is None else (a, b) for a, b in inputs], batch_size=cfg.batch_size)
        for (text, _), p in zip(inputs, probs):
            k = int(p.argmax())
            print(f"{clf.labels[k]}\t{float(p[k]):.4f}" + (f"\t{text}" if len(inputs) > 1 else ""))
        return
    model_dir, _ = check_model_dir(cfg.model)
    cfg = with_columns(cfg, model_dir)
    table = _read_input(cfg)
    if table.format == "lines":
        if _pair_column(model_dir):
            raise UserError(
                f"{cfg.model} classifies sentence pairs: give --input a CSV, TSV or JSONL file with both columns "
                "(plain text is one text per line)"
            )
        cfg = dataclasses.replace(cfg, text_column="text", pair_column="")
    require_columns(table, text_column=cfg.text_column, pair_column=cfg.pair_column or None)
    if cfg.output:
        out_format = detect_format(cfg.output) if Path(cfg.output).suffix else table.format
        if out_format == "lines":
            out_format = "tsv"
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
        what = (
            "blank line(s) given an empty prediction, to keep the output line by line with the input"
            if table.format == "lines"
            else "row(s) with an empty text left without prediction"
        )
        print(f"bertgpu: warning: {table.path}: {len(skipped)} {what} (lines {shown})", file=sys.stderr, flush=True)
    if not cfg.output:  # a line per row: label, probability and text, tab-separated (empty for a skipped row)
        for i, (text, _) in enumerate(inputs):
            label, score = predictions.get(i, ("", None))
            print(f"{label}\t{'' if score is None else f'{score:.4f}'}\t{' '.join(text.split())}")
        return
    atomic.write_bytes(Path(cfg.output), _render(table, predictions, out_format, cfg.output.lower().endswith(".gz")))
    print(f"{len(predictions)} predictions -> {cfg.output}")


def _read_input(cfg: PredictConfig) -> Table:
    """--input as a table: CSV, TSV or JSONL, or plain text of one text per line (a .txt file, or standard
    input, ``-``, unless --format names a table format)."""
    if cfg.input == "-":
        text = sys.stdin.read()
        table = read_table("-", cfg.format, text, cfg.delimiter) if cfg.format else read_lines("(standard input)", text)
    elif not cfg.format and Path(cfg.input).name.lower().removesuffix(".gz").endswith(".txt"):
        table = read_lines(cfg.input)
    else:
        table = read_table(cfg.input, cfg.format, delimiter=cfg.delimiter)
    if table.note:
        print(f"bertgpu: warning: {table.note}", file=sys.stderr, flush=True)
    return table


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
