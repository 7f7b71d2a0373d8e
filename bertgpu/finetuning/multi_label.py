"""Multi-label classification: any number of labels per text or pair (tags, topics). The label column holds the
names, separated by ``--label-separator`` (``|`` by default) or as a JSON list; the head has one output per label,
each a sigmoid read against ``--threshold`` (0.5, or chosen on the evaluation set with ``--threshold auto``); the
loss is binary cross-entropy (transformers' ``multi_label_classification``). Metrics as scikit-learn counts them:
micro and macro F1 (macro over the labels, an undefined F1 counted as 0), subset accuracy (every label of the
example right), per-label precision, recall and F1.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertgpu.data.classification import Examples
from bertgpu.errors import UserError
from bertgpu.finetuning.base import Options
from bertgpu.finetuning.classification import SequenceTask

JOINED = "\x1f"  # the ASCII unit separator: between a row's names once read (no label name holds it)


def names_of(label: str, separator: str, path: Any, line: int) -> list[str]:
    """A row's label names: a JSON list, or the text split at ``separator``; an empty name is an error."""
    text = label.strip()
    if text.startswith("["):
        try:
            names = json.loads(text)
        except ValueError:
            raise UserError(f"{path}:{line}: label {text!r} starts like a JSON list but is not one") from None
        if not isinstance(names, list) or not all(isinstance(n, (str, int)) for n in names):
            raise UserError(f"{path}:{line}: label {text!r}: a JSON list of label names expected")
        names = [str(n).strip() for n in names]
    else:
        names = [n.strip() for n in text.split(separator)]
    if not names or any(not n for n in names):
        raise UserError(
            f"{path}:{line}: an empty label name in {label!r} (names separated by {separator!r}, --label-separator)"
        )
    return names


def scores(predicted: np.ndarray, gold: np.ndarray, names: list[str]) -> dict[str, Any]:
    """Micro and macro F1, subset accuracy and each label's precision, recall and F1 of 0/1 arrays [N, labels]."""
    tp = (predicted & gold).sum(0)
    fp = (predicted & ~gold).sum(0)
    fn = (~predicted & gold).sum(0)

    def f1(t: float, p: float, n: float) -> float:
        return 2 * t / (2 * t + p + n) if 2 * t + p + n else 0.0

    per_label = {
        name: {
            "precision": float(tp[k] / (tp[k] + fp[k])) if tp[k] + fp[k] else None,
            "recall": float(tp[k] / (tp[k] + fn[k])) if tp[k] + fn[k] else None,
            "f1": f1(tp[k], fp[k], fn[k]),
            "support": int(gold[:, k].sum()),
            "predicted": int(predicted[:, k].sum()),
        }
        for k, name in enumerate(names)
    }
    return {
        "micro_f1": f1(tp.sum(), fp.sum(), fn.sum()),
        "macro_f1": float(np.mean([c["f1"] for c in per_label.values()])),
        "subset_accuracy": float((predicted == gold).all(1).mean()),
        "per_label": per_label,
    }


class MultiLabel(SequenceTask):
    name = "multi-label"
    problem_type = "multi_label_classification"
    main_metric = "micro_f1"
    metrics = ("micro_f1", "macro_f1", "subset_accuracy")

    def detect(self, path: Any, options: Options) -> str | None:
        """Labels that hold the separator in a quarter of the rows or more, or JSON lists."""
        labels = self.label_cells(path, options)
        if labels is None:
            return None
        try:  # every row's names must read, as when the file is read for good (else: not told from the data)
            several = sum(len(names_of(v, options.label_separator, path, 0)) > 1 for v in labels)
        except UserError:
            return None
        if several and several >= len(labels) / 4:
            how = f"{options.label_separator!r} or a JSON list"
            return f"{several:,} of its {len(labels):,} labels name several ({how})"
        return None

    def read(self, path: Any, options: Options, labelled: bool = True) -> Examples:
        """The table's examples, each label cell read as its names once (a bad one is an error at its line) and
        kept joined by ``JOINED``, whatever the file's separator."""
        examples = super().read(path, options, labelled)
        if examples.labels is not None:
            examples.labels = [
                JOINED.join(names_of(v, options.label_separator, examples.path, n))
                for v, n in zip(examples.labels, examples.lines)
            ]
        return examples

    @staticmethod
    def _rows(examples: Examples) -> list[list[str]]:
        return [v.split(JOINED) for v in examples.labels]

    def label_names(self, train: Examples) -> list[str]:
        names = sorted({n for row in self._rows(train) for n in row})
        if len(names) < 2:
            raise UserError(f"{train.path}: one label name only ({names[0]!r}): nothing to choose between")
        return names

    def check_eval(self, examples: Examples, names: list[str], source: str) -> None:
        known = set(names)
        for row, line in zip(self._rows(examples), examples.lines):
            unknown = [n for n in row if n not in known]
            if unknown:
                raise UserError(f"{examples.path}:{line}: label {unknown[0]!r} never appears in {source}")

    def describe(self, train: Examples, names: list[str]) -> tuple[str, list[str]]:
        rows = self._rows(train)
        counts = Counter(n for row in rows for n in row)
        line = f"{train.path}: {len(names)} labels, {sum(map(len, rows)) / len(rows):.2f} per example: " + ", ".join(
            f"{n} {counts[n]:,}" for n in names
        )
        rare = [n for n in names if counts[n] < 5]
        warnings = [f"{train.path}: label(s) {', '.join(map(repr, rare))} on fewer than 5 examples"] if rare else []
        return line, warnings

    def targets(self, examples: Examples, label2id: dict[str, int], options: Options) -> torch.Tensor:
        hot = torch.zeros(len(examples), len(label2id))
        for i, row in enumerate(self._rows(examples)):
            hot[i, [label2id[n] for n in row]] = 1
        return hot

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # summed over the labels, averaged over none: per example, as the other sequence tasks' (units = examples)
        return F.binary_cross_entropy_with_logits(logits.float(), batch["labels"].float(), reduction="sum")

    def train_sums(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        right = ((logits > 0) == (batch["labels"] > 0.5)).all(-1).sum()
        return {"loss": self.loss(logits, batch), "correct": right, "units": self.units(batch)}

    def evaluate(self, outputs: torch.Tensor, encoded: Any, examples: Examples, names: list[str]) -> dict[str, Any]:
        """The metrics at --threshold; with ``auto``, at the threshold best on these examples (reported as
        ``threshold``, and the one predict uses for a model fine-tuned so)."""
        threshold = encoded.options.threshold
        probs = torch.sigmoid(outputs).numpy()
        gold = encoded.labels.numpy() > 0.5
        loss = F.binary_cross_entropy_with_logits(outputs, encoded.labels.double(), reduction="sum").item()
        chosen = choose_threshold(probs, gold, names) if threshold == "auto" else float(threshold)
        return {
            "loss": loss / max(len(gold), 1),
            **scores(probs >= chosen, gold, names),
            "threshold": chosen,
            "examples": len(gold),
        }

    def eval_line(self, metrics: dict[str, Any]) -> str:
        return (
            f"loss {metrics['loss']:.4f} | micro_f1 {metrics['micro_f1']:.4f} | macro_f1 {metrics['macro_f1']:.4f} | "
            f"subset_accuracy {metrics['subset_accuracy']:.4f} | threshold {metrics['threshold']:g}"
        )

    def predict(
        self, outputs: torch.Tensor, encoded: Any, examples: Examples, names: list[str], options: Options
    ) -> list[dict[str, Any]]:
        probs = torch.sigmoid(outputs.float())
        threshold = 0.5 if options.threshold == "auto" else float(options.threshold)
        return [
            {
                "labels": [names[k] for k in range(len(names)) if p[k] >= threshold],
                "scores": {names[k]: round(float(p[k]), 6) for k in range(len(names)) if p[k] >= threshold},
            }
            for p in probs
        ]

    def show(self, prediction: dict[str, Any]) -> str:
        return "|".join(prediction["labels"]) + "\t" + " ".join(f"{s:.4f}" for s in prediction["scores"].values())


def choose_threshold(probs: np.ndarray, gold: np.ndarray, names: list[str]) -> float:
    """The one threshold (of 0.05, 0.10, ..., 0.95) with the best micro F1 on these examples; ties: nearest 0.5."""
    grid = [round(0.05 * k, 2) for k in range(1, 20)]
    return max(grid, key=lambda t: (scores(probs >= t, gold, names)["micro_f1"], -abs(t - 0.5)))


TASK = MultiLabel()
