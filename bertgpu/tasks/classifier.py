"""A fine-tuned classifier as a Python object::

    from bertgpu import Classifier
    clf = Classifier.load("run/best")
    clf("我觉得不错!")                      # {'label': 'positive', 'score': 0.97}
    clf("A man is eating.", "He eats.")     # a sentence pair
    clf(["text 1", ("text a", "text b")])   # a batch: a list of results
    clf.predict_proba(["text 1", "text 2"]) # [N, num_labels] probabilities, columns in clf.labels order

Any BERT sequence-classification directory works: ours (``bertgpu finetune``'s ``best/``) or one
written by transformers, as long as it holds ``model.safetensors``, ``vocab.txt`` and a
``config.json`` with ``id2label``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertgpu.checkpoints import checkpoint, hf_dir
from bertgpu.data.classification import collate
from bertgpu.data.tokenizer import Tokenizer, vocab_is_cased
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.interface import EncoderModel

# One text, a (text, pair text) tuple, or a batch of either.
Inputs = str | Sequence[str | tuple[str, str]]


def model_lowercase(model_dir: str | os.PathLike) -> bool:
    """Whether a model directory's tokenizer lower-cases: ``do_lower_case`` in tokenizer_config.json
    (what transformers reads), else judged from the vocab (uncased vocabs hold no capitals)."""
    model_dir = Path(model_dir)
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if isinstance(config.get("do_lower_case"), bool):
        return config["do_lower_case"]
    return not vocab_is_cased(model_vocab(model_dir))


def model_vocab(model_dir: str | os.PathLike) -> Path:
    """The directory's vocab.txt; a model without one cannot tokenize."""
    vocab = Path(model_dir) / "vocab.txt"
    if not vocab.is_file():
        raise UserError(f"{model_dir} has no vocab.txt: a BERT directory needs its WordPiece vocab")
    return vocab


def classifier_dir(path: str | os.PathLike) -> Path:
    """The classifier directory a user means: ``path`` itself, or, for the output directory of a
    `bertgpu finetune` run (the ``--out`` they just named), its final classifier ``best/``. Any other
    directory without a config.json is an error saying what kind of directory it is."""
    path = Path(path)
    if path.is_dir() and not (path / "config.json").is_file():
        if (path / "best" / "config.json").is_file():
            return path / "best"
        raise not_a_classifier(path)
    return path


def _saved_task(directory: Path) -> str | None:
    """Which command wrote a checkpoint (its bertgpu.json): ``pretrain``, ``finetune`` or None (not ours)."""
    run = checkpoint.read_run_record(directory)
    if run is None:
        return None
    # fine-tuning's epochs record their task; pretraining's checkpoints (and fine-tuning's resumable ones) do not
    return run.get("task") or (
        "finetune" if "train" in run["config"] else "pretrain" if "data" in run["config"] else None
    )


def not_a_classifier(path: Path) -> UserError:
    """The error for a --model that holds no classifier, naming what kind of directory it is (a pretraining run
    or checkpoint, a fine-tuning run without best/ yet, another BERT, an empty directory) and what to do."""
    first = f"fine-tune it first: bertgpu finetune --model {path} --train TRAIN.csv --out CLF/"
    if path.is_dir() and not any(path.iterdir()):
        return UserError(
            f"{path} is an empty directory, not a classifier (a `bertgpu finetune` run's --out or its best/)"
        )
    if not (path / "config.json").is_file():
        newest = checkpoint.latest_checkpoint(path)
        if newest is not None and _saved_task(newest) == "pretrain":
            return UserError(
                f"{path} is a `bertgpu pretrain` run: its checkpoints are masked-LM models with no classifier; {first}"
            )
        if (path / "checkpoints").is_dir():
            return UserError(
                f"{path} is a `bertgpu finetune` run without a classifier yet: best/ appears after its "
                f"first epoch's evaluation (resume it with --resume)"
            )
        return UserError(f"{path} has no config.json: not a classifier (a `bertgpu finetune` run's --out or its best/)")
    if _saved_task(path) == "pretrain":
        return UserError(f"{path} is a `bertgpu pretrain` checkpoint: a masked-LM model with no classifier; {first}")
    try:
        architectures_ = json.loads((path / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        architectures_ = []
    what = f"a {architectures_[0]}" if architectures_ and isinstance(architectures_[0], str) else "a model"
    return UserError(f"{path} is {what} with no classifier (its config.json has no id2label); {first}")


def finetuned_config(model_dir: str | os.PathLike) -> dict | None:
    """The config of the `bertgpu finetune` run that wrote a classifier (its bertgpu.json); None for others."""
    run = checkpoint.read_run_record(model_dir)
    if run is None or run.get("task") != "finetune":
        return None
    return run["config"]


def finetuned_max_length(model_dir: str | os.PathLike) -> int | None:
    """The --max-seq-length the classifier was fine-tuned with (its bertgpu.json), if it was fine-tuned by us."""
    try:
        return int((finetuned_config(model_dir) or {})["max_seq_length"])
    except (KeyError, TypeError, ValueError):
        return None


def model_length(path: Path, config: Any, asked: int | None) -> int:
    """The tokens per example a fine-tuned model at ``path`` reads: ``asked`` (--max-seq-length), else the length it
    was fine-tuned with, else its positions; more than its positions is an error."""
    length = asked or finetuned_max_length(path) or config.max_position_embeddings
    if length > config.max_position_embeddings:
        raise UserError(
            f"--max-seq-length {length} is beyond the model's {config.max_position_embeddings} "
            f"positions (max_position_embeddings in {path / 'config.json'})"
        )
    return length


# The column flags of fine-tuning, evaluation and prediction, with their defaults.
COLUMNS = {"text_column": "text", "pair_column": "", "label_column": "label"}


def finetuned_columns(model_dir: str | os.PathLike) -> dict[str, str] | None:
    """The --text-column, --pair-column and --label-column a classifier was fine-tuned with (its bertgpu.json);
    None when it was not fine-tuned by `bertgpu finetune` (then whether it takes pairs is unknown)."""
    run = finetuned_config(model_dir)
    if run is None:
        return None
    return {name: str(run.get(name) or default) for name, default in COLUMNS.items()}


class Classifier:
    """A sequence classifier with its tokenizer: text in, label name and probability out."""

    def __init__(self, model: EncoderModel, tokenizer: Tokenizer, max_seq_length: int, device: torch.device):
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.device = device
        self.labels = [model.config.id2label[i] for i in range(model.config.num_labels)]

    @classmethod
    def load(
        cls, path: str | os.PathLike, device: str | torch.device | None = None, max_seq_length: int | None = None
    ) -> Classifier:
        """Load a classifier directory (or a `bertgpu finetune` output directory: its ``best/``).
        ``max_seq_length`` defaults to the length it was fine-tuned with, else the model's positions (512 for BERT)."""
        path = classifier_dir(path)
        config = architectures.load_config(path)
        if not config.id2label:
            raise not_a_classifier(path)
        tokenizer = Tokenizer(model_vocab(path), lowercase=model_lowercase(path))
        model = architectures.classification_model(config)
        missing, _ = hf_dir.load_weights(model, path)
        if any(name.startswith("classifier.") for name in missing):
            raise UserError(
                f"{path / hf_dir.WEIGHTS_NAME} has no classifier weights "
                f"(fine-tune it first: bertgpu finetune --model {path} ...)"
            )
        length = model_length(path, config, max_seq_length)
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        return cls(model, tokenizer, length, device)

    @torch.inference_mode()
    def predict_proba(self, inputs: Inputs, pair: str | None = None, batch_size: int = 32) -> np.ndarray:
        """Class probabilities, ``[N, num_labels]`` (one row for a single text), columns in ``labels`` order."""
        items, _ = _as_pairs(inputs, pair)
        encoded = [self.tokenizer.encode_pair(a, b, self.max_seq_length) for a, b in items]
        probs = np.zeros((len(items), len(self.labels)), dtype=np.float32)
        order = sorted(range(len(items)), key=lambda i: len(encoded[i]["input_ids"]))  # batches of similar length
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = collate([encoded[i] for i in rows], self.tokenizer.pad_id)
            batch = {k: v.to(self.device) for k, v in batch.items()}
            logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
            probs[rows] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
        return probs

    def __call__(self, inputs: Inputs, pair: str | None = None, batch_size: int = 32) -> dict | list[dict]:
        """``{"label": name, "score": probability}`` for one text (or pair), a list of them for a batch."""
        _, single = _as_pairs(inputs, pair)
        probs = self.predict_proba(inputs, pair, batch_size)
        best = probs.argmax(axis=1)
        results = [{"label": self.labels[k], "score": float(p[k])} for k, p in zip(best, probs)]
        return results[0] if single else results


def _as_pairs(inputs: Inputs, pair: str | None) -> tuple[list[tuple[str, str | None]], bool]:
    """Normalise the accepted inputs to ``[(text, pair text or None), ...]`` and whether it was one input."""
    if isinstance(inputs, str):
        if pair is not None and not isinstance(pair, str):
            raise TypeError(f"pair must be a str, got {type(pair).__name__}")
        return [(inputs, pair)], True
    if pair is not None:
        raise TypeError("pair= goes with a single text; for a batch, pass (text, pair text) tuples")
    items: list[tuple[str, str | None]] = []
    for x in inputs:
        if isinstance(x, str):
            items.append((x, None))
        elif isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, str) for t in x):
            items.append((x[0], x[1]))
        else:
            raise TypeError(f"each input must be a text or a (text, pair text) tuple, got {x!r}")
    return items, False


# ---------------------------------------------------------------------------------------------
# Any fine-tuned model: which task it was fine-tuned for, and the model itself.


def head_of(path: Path, config: Any) -> str | None:
    """The head ("sequence", "token", "span") a directory's config.json names, None when it names no head class."""
    saved = architectures.saved_class(path)
    heads = {name: head for head, name in architectures.of(config).head_classes.items()}
    return heads.get(saved or "")


def task_of(path: Path, config: Any, given: str = "") -> Any:
    """The fine-tuning task of the model at ``path`` (``finetuning``'s task object): the one its `bertgpu finetune`
    run recorded, else the one its head and ``problem_type`` say (a transformers checkpoint). ``given`` (--task) must
    agree with it: a model fine-tuned for one task cannot be evaluated or used as another's."""
    from bertgpu import finetuning

    run = finetuned_config(path) or {}
    name = (run.get("task_options") or {}).get("task") or ""
    if not name:
        head = head_of(path, config) or "sequence"
        problem = config.problem_type
        name = {"token": "token-classification", "span": "question-answering"}.get(head) or {
            "regression": "regression",
            "multi_label_classification": "multi-label",
        }.get(problem or "", "classification")
    if given and given != name:
        raise UserError(f"--task {given}: {path} was fine-tuned for {name} (its config says so); leave --task out")
    return finetuning.get(name)


def load_finetuned(path: Path, task: Any, device: torch.device) -> EncoderModel:
    """The fine-tuned model at ``path`` with ``task``'s head, its weights loaded, in eval mode on ``device``."""
    config = architectures.load_config(path)
    model = architectures.head_model(config, task.head)
    missing, _ = hf_dir.load_weights(model, path)
    if any(name.startswith(model.head_modules) for name in missing):
        raise UserError(
            f"{path / hf_dir.WEIGHTS_NAME} has no {task.name} head "
            f"(fine-tune it first: bertgpu finetune --model {path} ...)"
        )
    return model.eval().to(device)


def saved_threshold(path: Path) -> float | None:
    """The multi-label threshold a fine-tuned model's best evaluation chose or used (metrics.json beside it)."""
    for candidate in (path / "metrics.json", path.parent.parent / "metrics.json"):
        try:
            record = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        value = record.get("eval_threshold", (record.get("best") or {}).get("eval_threshold"))
        if isinstance(value, (int, float)):
            return float(value)
    return None
