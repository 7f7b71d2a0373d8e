"""What a fine-tuning task is: the parts `finetune`, `evaluate` and `predict` ask of it, one module per task.

A task (``FinetuneTask``) reads and checks its data, encodes an example into the model's inputs and the labels its
loss reads, names the head it fine-tunes (the transformers class it saves as: ``head``, and ``problem_type`` for a
sequence head), computes its loss and training sums, its metrics from the evaluation set's outputs, and shows
``predict``'s output. The loops know nothing else of it: adding a task is one module here (and its tests), listed in
``finetuning/__init__.py``'s ``TASKS``.

What the loops hand a task and get back:
- ``Examples``: whatever a task's reader returns; it has ``path``, ``__len__``, ``lines`` (the line each example came
  from), ``note`` and ``warnings()`` (one line each), and ``subset(indices)``.
- ``Encoded``: the examples as model inputs (``encode``): ``batch(indices)`` gives ``input_ids``, ``token_type_ids``
  and ``attention_mask`` padded to the longest of them, with ``labels`` when the examples have them (and any keys
  of the task's own); ``lengths`` is each row's tokens (batches of similar length pad little). A row is what the
  model reads: an example, or a window of a long one (token classification, question answering).
- outputs: the model's logits of every row of an ``Encoded``, in row order, as one float64 tensor of
  ``output_shape(encoded, num_labels)`` per row (zero past a row's length), gathered from every data-parallel rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

# The heads a task fine-tunes, as each architecture names its classes (``Architecture.head_classes``):
# one output per sequence (BertForSequenceClassification), per token (BertForTokenClassification), or a start and an
# end score per token (BertForQuestionAnswering).
HEADS = ("sequence", "token", "span")

IGNORE_INDEX = -100  # a token label the loss and the metrics skip (transformers' convention)


@dataclass(frozen=True)
class Options:
    """What the command line says about the data and the task beyond the files (finetune's, evaluate's and
    predict's flags): the columns of a table, and each task's own settings."""

    text_column: str = "text"
    pair_column: str = ""
    label_column: str = "label"
    format: str | None = None
    delimiter: str = ""
    max_seq_length: int = 128
    doc_stride: int = 128  # question answering: tokens shared by consecutive windows of a long context
    max_answer_length: int = 30  # question answering: the longest answer span, in tokens
    n_best: int = 20  # question answering: the candidate spans kept per question
    null_threshold: float = 0.0  # question answering v2: answer "" when null score - best span score > this
    label_separator: str = "|"  # multi-label: between the label names of one row
    threshold: float | str = 0.5  # multi-label: a label is predicted at this probability or more ("auto": the best)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_flags(cls, cfg: Any, max_seq_length: int) -> Options:
        """The settings a command's flags give (finetune's, evaluate's or predict's config)."""
        t = cfg.task_options
        return cls(
            text_column=cfg.text_column or "text",
            pair_column=cfg.pair_column,
            label_column=getattr(cfg, "label_column", "") or "label",
            format=cfg.format,
            delimiter=cfg.delimiter,
            max_seq_length=max_seq_length,
            doc_stride=t.doc_stride,
            max_answer_length=t.max_answer_length,
            n_best=t.n_best,
            null_threshold=t.null_threshold,
            label_separator=t.label_separator,
            threshold=t.threshold if t.threshold == "auto" else float(t.threshold or 0.5),
        )


class Encoded(Protocol):
    lengths: Any  # numpy int array, tokens per row

    def __len__(self) -> int: ...

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]: ...


class FinetuneTask(Protocol):
    name: str  # --task: classification, token-classification, question-answering, regression, multi-label
    head: str  # one of HEADS: the model class it fine-tunes
    problem_type: str | None  # config.json's problem_type (sequence heads): transformers picks its loss by it
    main_metric: str  # the best checkpoint is the one highest by this (eval_<main_metric>)
    metrics: tuple[str, ...]  # what --metric may choose (each higher-is-better), main_metric first
    unit: str  # what the loss averages over in a global batch: "example" or "token" (the labelled ones)

    def detect(self, path: Path, options: Options) -> str | None:
        """Why ``path`` is unambiguously this task's data ("a CoNLL file: token and tag per line"), else None."""

    def read(self, path: Path, options: Options, labelled: bool = True) -> Any:
        """The file's examples, checked: a UserError naming the file and line for each bad input. ``labelled``
        False (predict's input): no label is read, none needed (a tagged file or an answered question may still
        have its own)."""

    def from_texts(self, texts: list[str], options: Options) -> Any:
        """The examples of ``predict TEXT...``: a text each (or one pair), a sentence each, a question and its
        context."""

    def label_names(self, train: Any) -> list[str]:
        """The model's labels by id, from the training examples (regression: one output, a placeholder name)."""

    def check_eval(self, examples: Any, names: list[str], source: str) -> None:
        """``examples`` (evaluation data) fit a model of labels ``names`` (from ``source``): a UserError if not."""

    def split(self, examples: Any, fraction: float, seed: int) -> tuple[Any, Any]:
        """Hold out ``fraction`` of the examples, seeded: (train, eval)."""

    def describe(self, train: Any, names: list[str]) -> tuple[str, list[str]]:
        """One line about the training data (its labels and how many), and warnings."""

    def encode(self, examples: Any, tokenizer: Any, label2id: dict[str, int], options: Options) -> Encoded:
        """The model's rows of ``examples``."""

    def output_shape(self, encoded: Encoded, num_labels: int) -> tuple[int, ...]:
        """One row's outputs: (num_labels,) for a sequence head, (longest row, num_labels) for a token head..."""

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss summed over the batch's units (examples, or labelled tokens), in float32."""

    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """How many units the batch's loss sums over (the training log's denominator)."""

    def mean_units(self, encoded: Encoded) -> float:
        """The training rows' mean units per row (1 for a task of examples). A global batch's summed loss is divided
        by its examples times this, not by its own count: every unit then weighs the same over an epoch however the
        batches are grouped (divided by its own count, a batch of short sentences weighs each token several times
        more, and length-grouped batches cost 2.5 points of entity F1 on People's Daily NER), and no rank waits for
        another's count."""

    def train_sums(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The training log's sums of a batch: ``loss`` (summed), ``correct`` and ``units`` (the log shows
        loss / units and correct / units as its accuracy)."""

    def evaluate(self, outputs: torch.Tensor, encoded: Encoded, examples: Any, names: list[str]) -> dict[str, Any]:
        """The metrics of the whole evaluation set: ``loss`` and ``examples`` always, ``main_metric`` and every
        name of ``metrics``, each as the field's standard scorer counts it, plus whatever detail the task keeps."""

    def eval_line(self, metrics: dict[str, Any]) -> str:
        """The metrics as one log line ("loss 0.31 | f1 0.87 | precision ... ")."""

    def predict(
        self, outputs: torch.Tensor, encoded: Encoded, examples: Any, names: list[str], options: Options
    ) -> list[Any]:
        """One prediction per example (put together from its rows), JSON-serialisable."""

    def show(self, prediction: Any) -> str:
        """A prediction as ``predict`` prints it (one line, tab-separated fields)."""

    def render(self, examples: Any, predictions: list[Any], fmt: str | None = None) -> bytes:
        """``predict --output``'s file: the input with its predictions (a tagged CoNLL or JSONL file, SQuAD's
        predictions JSON, JSON Lines)."""
