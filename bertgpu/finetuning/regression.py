"""Regression: a number per text or pair (as STS-B's similarity from 0 to 5). One output, mean squared error, and
the metrics GLUE reports for STS-B: Pearson and Spearman correlation (as scipy.stats counts them: Spearman is the
Pearson correlation of the ranks, ties given their mean rank), and the mean squared error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from bertgpu.data.classification import Examples
from bertgpu.errors import UserError
from bertgpu.finetuning.base import Options
from bertgpu.finetuning.classification import SequenceTask

NAME = "score"  # the one output's name (config.json's id2label)


def number(text: str, path: Any, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{path}:{line}: regression label {text!r} is not a number") from None
    if not math.isfinite(value):
        raise UserError(f"{path}:{line}: regression label {text!r} is not a finite number")
    return value


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank (scipy.stats.rankdata's "average")."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    counts = np.diff(np.r_[first, len(x)])
    mean_rank = first + (counts + 1) / 2
    out = np.empty(len(x))
    out[order] = mean_rank[group]
    return out


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """The correlation; 0 when either side is constant (scipy gives nan there: no linear relation to measure)."""
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float((x * x).sum()) * float((y * y).sum()))
    return float((x * y).sum()) / denominator if denominator else 0.0


class Regression(SequenceTask):
    name = "regression"
    problem_type = "regression"
    main_metric = "pearson"
    metrics = ("pearson", "spearman")

    def detect(self, path: Any, options: Options) -> str | None:
        """A label column of numbers, some not integers (integers alone are class names as often as scores)."""
        labels = self.label_cells(path, options)
        if labels is None:
            return None
        try:
            values = [float(label) for label in labels]
        except ValueError:
            return None
        if any(not v.is_integer() for v in values):
            return f"its label column {options.label_column!r} holds numbers, not all integers"
        return None

    def label_names(self, train: Examples) -> list[str]:
        for label, line in zip(train.labels, train.lines):
            number(label, train.path, line)
        return [NAME]

    def check_eval(self, examples: Examples, names: list[str], source: str) -> None:
        if len(names) != 1:
            raise UserError(f"{source} has {len(names)} outputs: not a regression model (it has one)")
        for label, line in zip(examples.labels or (), examples.lines):
            number(label, examples.path, line)

    def describe(self, train: Examples, names: list[str]) -> tuple[str, list[str]]:
        values = np.array([float(v) for v in train.labels])
        line = (
            f"{train.path}: {len(values):,} examples, labels from {values.min():g} to {values.max():g} "
            f"(mean {values.mean():.3g}, std {values.std():.3g})"
        )
        warnings = [f"{train.path}: every label is {values[0]:g}: nothing to learn"] if values.std() == 0 else []
        return line, warnings

    def targets(self, examples: Examples, label2id: dict[str, int], options: Options) -> torch.Tensor:
        return torch.tensor([number(v, examples.path, n) for v, n in zip(examples.labels, examples.lines)])

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return ((logits.float().squeeze(-1) - batch["labels"].float()) ** 2).sum()

    def train_sums(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        loss = self.loss(logits, batch)
        return {"loss": loss, "correct": torch.zeros_like(loss), "units": self.units(batch)}

    def evaluate(self, outputs: torch.Tensor, encoded: Any, examples: Examples, names: list[str]) -> dict[str, Any]:
        predicted = outputs[:, 0].double().numpy()
        gold = encoded.labels.double().numpy()
        mse = float(((predicted - gold) ** 2).mean())
        return {
            "loss": mse,
            "pearson": pearson(predicted, gold),
            "spearman": pearson(ranks(predicted), ranks(gold)),
            "mse": mse,
            "examples": len(gold),
        }

    def eval_line(self, metrics: dict[str, Any]) -> str:
        return f"mse {metrics['mse']:.4f} | pearson {metrics['pearson']:.4f} | spearman {metrics['spearman']:.4f}"

    def predict(
        self, outputs: torch.Tensor, encoded: Any, examples: Examples, names: list[str], options: Options
    ) -> list[dict[str, Any]]:
        return [{"value": round(float(v), 6)} for v in outputs[:, 0]]

    def show(self, prediction: dict[str, Any]) -> str:
        return f"{prediction['value']:.4f}"


TASK = Regression()
