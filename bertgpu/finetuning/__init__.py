"""The fine-tuning tasks, one module each (``base.FinetuneTask`` says what a task is): ``TASKS`` by --task name."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from bertgpu.errors import UserError

# --task name -> its module (imported when first asked: the command line lists the names without torch)
MODULES = {
    "classification": "classification",
    "token-classification": "token_classification",
    "question-answering": "question_answering",
    "regression": "regression",
    "multi-label": "multi_label",
}
NAMES = tuple(MODULES)
DEFAULT = "classification"
# Tried in this order when --task is not given: the first that says the data is unambiguously its own.
DETECT_ORDER = ("token-classification", "question-answering", "multi-label", "regression")


def get(name: str) -> Any:
    """The task called ``name`` (its module's ``TASK``)."""
    if name not in MODULES:
        raise UserError(f"--task {name}: no such task (tasks: {', '.join(NAMES)})")
    return importlib.import_module(f"bertgpu.finetuning.{MODULES[name]}").TASK


def detect(path: str | Path, options: Any) -> tuple[Any, str]:
    """The task of the data at ``path`` when --task is not given, and why: the first task whose data it
    unambiguously is (a CoNLL file, SQuAD JSON, several labels per row, numeric non-integer labels), else
    classification."""
    for name in DETECT_ORDER:
        task = get(name)
        why = task.detect(Path(path), options)
        if why:
            return task, f"{path}: {why}; --task sets another"
    return get(DEFAULT), "the default; --task sets another"
