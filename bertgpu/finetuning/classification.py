"""Sentence and sentence-pair classification: a label per text (or pair), one of several (the classifier bertgpu
has always fine-tuned). Its data are tables (CSV, TSV, JSON Lines: ``data.classification``), its head one output per
label read from the pooled sequence, its loss cross-entropy, its metrics accuracy and F1 (``tasks.sharded_eval``).

``SequenceTask`` is what the sequence-level tasks share (regression and multi-label derive from it): a table's text,
pair text and label columns, encoded as ``[CLS] a [SEP] (b [SEP])``, one row per example.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertgpu.data.classification import (
    ClassificationDataset,
    Examples,
    check_labels,
    describe_labels,
    label_names,
    load_examples,
    split_examples,
)
from bertgpu.errors import UserError
from bertgpu.finetuning.base import Options


class SequenceTask:
    """What every task with one output vector per example shares: the reading of a table and the encoding."""

    head = "sequence"
    unit = "example"

    def detect(self, path: Path, options: Options) -> str | None:
        return None

    def read(self, path: Path, options: Options, labelled: bool = True) -> Examples:
        """The table's examples (``labelled`` False: no label column is read, as predict reads its input)."""
        return load_examples(
            path,
            options.text_column,
            options.pair_column or None,
            options.label_column if labelled else None,
            options.format,
            options.delimiter,
        )

    def from_texts(self, texts: list[str], options: Options) -> Examples:
        """Each text on its own; with a pair column (a pair model), the two texts as one pair."""
        if options.pair_column:
            if len(texts) != 2:
                raise UserError(f"a sentence-pair model: give a text and its pair text, not {len(texts)} texts")
            return Examples(Path("(command line)"), [texts[0]], [texts[1]], None, [1], [])
        return Examples(Path("(command line)"), list(texts), None, None, list(range(1, len(texts) + 1)), [])

    def render(self, examples: Examples, predictions: list[dict[str, Any]], fmt: str | None = None) -> bytes:
        """JSON Lines: each example's text (and pair text) and its prediction."""
        pairs = examples.pairs or [None] * len(examples)
        rows = [
            {"text": t, **({"pair": p} if p is not None else {}), **prediction}
            for t, p, prediction in zip(examples.texts, pairs, predictions)
        ]
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")

    def label_cells(self, path: Path, options: Options) -> list[str] | None:
        """The label column of the table at ``path`` as read (None: not a table this task reads), for ``detect``:
        read once per file for every sequence task's detection (``_label_cells``)."""
        try:
            stat = Path(path).stat()
        except OSError:
            return None
        columns = (options.text_column, options.pair_column, options.label_column, options.format, options.delimiter)
        return _label_cells(str(path), (stat.st_mtime_ns, stat.st_size), columns)

    def split(self, examples: Examples, fraction: float, seed: int) -> tuple[Examples, Examples]:
        return split_examples(examples, fraction, seed)

    def targets(self, examples: Examples, label2id: dict[str, int], options: Options) -> torch.Tensor:
        """The labels of ``examples`` as the loss reads them."""
        raise NotImplementedError

    def encode(self, examples: Examples, tokenizer: Any, label2id: dict[str, int], options: Options) -> Any:
        rows = ClassificationDataset(examples, tokenizer, options.max_seq_length)
        rows.options = options  # what evaluate reads beyond the outputs (multi-label's --threshold)
        if examples.labels is not None and label2id:
            rows.labels = self.targets(examples, label2id, options)
        return rows

    def output_shape(self, encoded: Any, num_labels: int) -> tuple[int, ...]:
        return (num_labels,)

    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor(len(batch["input_ids"]), device=batch["input_ids"].device)

    def mean_units(self, encoded: Any) -> float:
        return 1.0


@functools.lru_cache(maxsize=4)
def _label_cells(path: str, stamp: tuple[int, int], columns: tuple) -> list[str] | None:
    """A table's label cells, cached by its path, modification time and size and the columns asked for: regression's
    and multi-label's detection look at the same file before any of them reads it for good."""
    text, pair, label, fmt, delimiter = columns
    try:
        return load_examples(path, text, pair or None, label, fmt, delimiter).labels
    except UserError:
        return None


class Classification(SequenceTask):
    name = "classification"
    problem_type = None  # transformers infers single-label classification from integer labels
    main_metric = "accuracy"
    metrics = ("accuracy", "f1")

    def label_names(self, train: Examples) -> list[str]:
        return label_names(train)

    def check_eval(self, examples: Examples, names: list[str], source: str) -> None:
        check_labels(examples, names, source)

    def describe(self, train: Examples, names: list[str]) -> tuple[str, list[str]]:
        return describe_labels(train, names)

    def targets(self, examples: Examples, label2id: dict[str, int], options: Options) -> torch.Tensor:
        return torch.tensor([label2id[label] for label in examples.labels])

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(logits.float(), batch["labels"], reduction="sum")

    def train_sums(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            "loss": self.loss(logits, batch),
            "correct": (logits.argmax(-1) == batch["labels"]).sum(),
            "units": self.units(batch),
        }

    def evaluate(self, outputs: torch.Tensor, encoded: Any, examples: Examples, names: list[str]) -> dict[str, Any]:
        return compute_metrics(outputs, encoded.labels, names)

    def eval_line(self, metrics: dict[str, Any]) -> str:
        return f"loss {metrics['loss']:.4f} | accuracy {metrics['accuracy']:.4f} | f1 {metrics['f1']:.4f}"

    def predict(
        self, outputs: torch.Tensor, encoded: Any, examples: Examples, names: list[str], options: Options
    ) -> list[dict[str, Any]]:
        probs = torch.softmax(outputs.float(), dim=-1)
        best = probs.argmax(-1).tolist()
        return [{"label": names[k], "score": round(float(p[k]), 6)} for k, p in zip(best, probs)]

    def show(self, prediction: dict[str, Any]) -> str:
        return f"{prediction['label']}\t{prediction['score']:.4f}"


def compute_metrics(logits: torch.Tensor, labels: torch.Tensor, names: list[str] | None = None) -> dict[str, Any]:
    """Mean loss, accuracy, F1, each label's precision, recall, F1 and support, and the confusion matrix
    (rows: true label, columns: predicted); ``names``: the labels by id (default: the ids as text).

    ``f1`` is the F1 of label id 1 with two classes, else the macro average over the labels whose F1 is
    defined, those in the labels or the predictions (scikit-learn's f1_score); ``f1_labels`` names them.
    A label the data lacks but the model predicts has F1 0 and pulls that average down, so the macro
    averages over the labels in the data and over all the model's labels (an undefined F1 counted as 0,
    scikit-learn's ``labels=all, zero_division=0``) are given too. An undefined precision (a label never
    predicted), recall (a label absent from the data) or F1 (both) is None."""
    num_labels = logits.size(1)
    names = [str(i) for i in range(num_labels)] if names is None else list(names)
    labels = labels.cpu()
    predictions = logits.argmax(-1)
    confusion = torch.zeros(num_labels, num_labels, dtype=torch.long)
    confusion.index_put_((labels, predictions), torch.ones_like(labels), accumulate=True)
    tp, support, predicted = confusion.diag().tolist(), confusion.sum(1).tolist(), confusion.sum(0).tolist()
    per_class = {}
    for k, name in enumerate(names):
        errors = support[k] + predicted[k] - 2 * tp[k]  # false negatives + false positives
        per_class[name] = {
            "precision": tp[k] / predicted[k] if predicted[k] else None,
            "recall": tp[k] / support[k] if support[k] else None,
            "f1": 2 * tp[k] / (2 * tp[k] + errors) if 2 * tp[k] + errors else None,
            "support": support[k],
            "predicted": predicted[k],
        }
    f1 = [per_class[name]["f1"] for name in names]
    defined = [name for name in names if per_class[name]["f1"] is not None]
    in_data = [name for name, count in zip(names, support) if count]
    f1_labels = [names[1]] if num_labels == 2 else defined
    return {
        "loss": F.cross_entropy(logits, labels).item(),
        "accuracy": sum(tp) / len(labels),
        "f1": _mean(per_class[name]["f1"] or 0.0 for name in f1_labels),
        "f1_labels": f1_labels,
        "macro_f1_data_labels": _mean(per_class[name]["f1"] for name in in_data),
        "macro_f1_all_labels": _mean(value or 0.0 for value in f1),
        "data_labels": in_data,
        "per_class": per_class,
        "examples": len(labels),
        "confusion": confusion.tolist(),
    }


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


TASK = Classification()
