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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bertgpu import atomic
from bertgpu.config import EvaluateConfig, PredictConfig
from bertgpu.data.classification import (
    Table,
    as_data_labels,
    detect_format,
    known_columns,
    read_lines,
    read_table,
    require_columns,
)
from bertgpu.data.tokenizer import Tokenizer
from bertgpu.errors import UserError
from bertgpu.finetuning.base import Options
from bertgpu.parallel import ParallelDims, launch
from bertgpu.paths import refuse_clobbering, refuse_existing
from bertgpu.tasks.checks import check_evaluate_flags, check_predict_flags
from bertgpu.tasks.classifier import (
    COLUMNS,
    Classifier,
    classifier_dir,
    finetuned_columns,
    load_finetuned,
    model_length,
    model_lowercase,
    model_vocab,
    not_a_classifier,
    saved_threshold,
    task_of,
)
from bertgpu.tasks.model_dirs import check_model_dir
from bertgpu.tasks.prelaunch import run_local_workers
from bertgpu.tasks.sharded_eval import (
    describe_f1,
    missing_labels_warning,
    per_class_table,
    predict_logits,
)
from bertgpu.training.precision import resolve_precision
from bertgpu.training.runlog import console_is_tty


@dataclass
class Evaluation:
    """What ``check_evaluate`` found: the model's task, the labelled examples, the model's labels as the data names
    them (``as_data_labels``), the task's settings and where the metrics go."""

    task: Any
    examples: Any
    names: list[str]
    options: Options
    output: Path


def check_evaluate(cfg: EvaluateConfig) -> Evaluation:
    """Everything ``evaluate`` needs, checked: UserError on any mistake."""
    model_dir, config = check_model_dir(cfg.model)
    task = task_of(model_dir, config, cfg.task_options.task)
    if task.head == "sequence" and not config.id2label:
        raise not_a_classifier(model_dir)
    resolve_precision(cfg.precision, torch.device(launch.resolve_device(cfg.device)))
    options = task_settings(cfg, model_dir, config)
    examples = task.read(Path(cfg.data), options)
    names = [config.id2label[i] for i in sorted(config.id2label)]
    if task.name == "classification":  # transformers' LABEL_0, LABEL_1 ... are the data's 0, 1 ...
        names = as_data_labels(names, examples)
    task.check_eval(examples, names, f"the model's labels ({model_dir / 'config.json'})")
    output = Path(cfg.output) if cfg.output else model_dir / "eval_results.json"
    if output.is_dir() or not os.access(output.parent, os.W_OK):
        raise UserError(f"cannot write the metrics to {output}; choose another --output")
    return Evaluation(task, examples, names, options, output)


def task_settings(cfg: EvaluateConfig | PredictConfig, model_dir: Path, config: Any) -> Options:
    """The task's settings: the flags, the length the model was fine-tuned with (or --max-seq-length), and a
    multi-label model's own threshold unless --threshold is given."""
    options = Options.from_flags(cfg, model_length(model_dir, config, cfg.max_seq_length))
    if not cfg.task_options.threshold:
        options = dataclasses.replace(options, threshold=saved_threshold(model_dir) or 0.5)
    return options


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
    checked = check_evaluate(cfg)
    task, examples, names, options = checked.task, checked.examples, checked.names, checked.options
    model_dir = Path(cfg.model)
    model = load_finetuned(model_dir, task, env.device)
    tokenizer = Tokenizer(model_vocab(model_dir), lowercase=model_lowercase(model_dir))
    encoded = task.encode(examples, tokenizer, {name: i for i, name in enumerate(names)}, options)
    precision = resolve_precision(cfg.precision, env.device)
    shape = task.output_shape(encoded, len(names))
    outputs = predict_logits(model, encoded, cfg.batch_size, dims, env.device, precision, shape=shape)
    metrics = task.evaluate(outputs, encoded, examples, names)
    classes = "per_class" in metrics  # a classifier's: its F1's average and the labels the data lacks
    result = {
        "model": str(cfg.model),
        "data": str(cfg.data),
        "task": task.name,
        "labels": names,
        **({"f1_average": describe_f1(metrics, names)} if classes else {}),
        "max_seq_length": options.max_seq_length,
        "skipped_rows": len(getattr(examples, "skipped", ())),
        **metrics,
    }
    output = checked.output
    if env.is_main:
        warnings = [examples.note, *examples.warnings()]
        warnings += [missing_labels_warning(metrics, str(cfg.data))] if classes else []
        for warning in warnings:
            if warning:
                print(f"bertgpu: warning: {warning}", file=sys.stderr, flush=True)
        if cfg.json:
            print(json.dumps(result, ensure_ascii=False), flush=True)
        else:
            average = f" ({result['f1_average']})" if classes else ""
            kinds = ("per_class", "per_type", "per_label")  # by label, entity type or label of several
            table = next(({"per_class": metrics[k]} for k in kinds if k in metrics), None)
            print(
                f"{cfg.data}: {metrics['examples']} examples | {task.eval_line(metrics)}{average}",
                *(per_class_table(table) if table else ()),
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
    saved = finetuned_columns(model_dir)
    columns = {"text_column": cfg.text_column, "pair_column": cfg.pair_column}
    if isinstance(cfg, EvaluateConfig):
        columns["label_column"] = cfg.label_column
    cfg = dataclasses.replace(cfg, **{name: value or (saved or COLUMNS)[name] for name, value in columns.items()})
    table = cfg.data if isinstance(cfg, EvaluateConfig) else cfg.input
    if saved is None and table and table != "-":  # a model fine-tuned elsewhere: GLUE's names where "text" is none
        text, pair, label, note = known_columns(
            table, cfg.text_column, cfg.pair_column, getattr(cfg, "label_column", "label"), cfg.format, cfg.delimiter
        )
        if note:
            print(f"bertgpu: {note}", flush=True)
            found = {"text_column": text, "pair_column": pair, "label_column": label}
            cfg = dataclasses.replace(cfg, **{name: found[name] for name in columns})  # predict has no label column
    return cfg


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
    model_dir, config = check_model_dir(cfg.model)
    task = task_of(model_dir, config, cfg.task_options.task)
    if task.name != "classification":  # the classifier's own path below keeps its table output and pair checks
        predict_task(with_columns(cfg, model_dir), task, model_dir, config)
        return
    if not cfg.input:
        inputs = _inputs_of_texts(cfg, model_dir)
        clf = Classifier.load(cfg.model, device, cfg.max_seq_length or None)
        probs = clf.predict_proba([a if b is None else (a, b) for a, b in inputs], batch_size=cfg.batch_size)
        for (text, _), p in zip(inputs, probs):
            k = int(p.argmax())
            print(f"{clf.labels[k]}\t{float(p[k]):.4f}" + (f"\t{text}" if len(inputs) > 1 else ""))
        return
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


def predict_task(cfg: PredictConfig, task: Any, model_dir: Path, config: Any) -> None:
    """Any task's predictions (``finetuning``): of the texts given (a sentence each to tag, a question and its
    context, a text each to score), printed a line each; or of every example of --input, printed or written to
    --output in the task's format (a tagged CoNLL or JSONL file, SQuAD's predictions JSON, JSON Lines)."""
    device = torch.device(launch.resolve_device(cfg.device))
    options = task_settings(cfg, model_dir, config)
    if cfg.input:
        if cfg.input == "-":
            raise UserError(f"--input -: a {task.name} model reads a file (standard input is for classifiers)")
        examples = task.read(Path(cfg.input), options, labelled=False)  # predict's input needs no labels
    else:
        examples = task.from_texts(cfg.texts, options)
    names = [config.id2label[i] for i in sorted(config.id2label)]
    model = load_finetuned(model_dir, task, device)
    tokenizer = Tokenizer(model_vocab(model_dir), lowercase=model_lowercase(model_dir))
    encoded = task.encode(examples, tokenizer, {}, options)  # no labels read: predict needs none
    shape = task.output_shape(encoded, len(names))
    precision = "fp32"  # predict has no --precision: a model's inference as it was saved
    outputs = predict_logits(model, encoded, cfg.batch_size, ParallelDims(1), device, precision, shape=shape)
    predictions = task.predict(outputs, encoded, examples, names, options)
    if cfg.output:
        atomic.write_bytes(Path(cfg.output), task.render(examples, predictions))
        print(f"{len(predictions)} predictions -> {cfg.output}")
        return
    for prediction in predictions:
        print(task.show(prediction))


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
