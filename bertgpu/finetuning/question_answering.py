"""Extractive question answering (SQuAD): the answer to a question is a span of its context.

Data: SQuAD v1.1 and v2.0 JSON (``data`` -> ``paragraphs`` -> ``context`` and ``qas``: ``id``, ``question``,
``answers`` [{``text``, ``answer_start``}], ``is_impossible``), or JSON Lines of ``{id, context, question, answers:
{"text": [...], "answer_start": [...]}}`` (transformers' datasets layout; empty lists: unanswerable). A file without
answers is read for ``predict``. Every answer must be at its ``answer_start``: a misplaced one is an error naming
the file and line, as is an empty question or context.

Rows: ``[CLS] question [SEP] context window [SEP]`` (token types 0, then 1). The question keeps at most
``MAX_QUESTION_TOKENS`` tokens (BERT's run_squad.py ``max_query_length``); a long context is read in overlapping
windows as transformers' run_qa.py reads it: ``Options.doc_stride`` is the number of context tokens two
consecutive windows share (the tokenizers library's ``stride``), not the step between their starts (the original
BERT's meaning), so that a flag value means what it means to transformers' users. A window's training labels are
the answer's first and last tokens in the row, or 0 ([CLS]) for both when the answer is not wholly inside it (or
there is none). The loss is transformers' ``BertForQuestionAnswering`` loss, (CE(start) + CE(end)) / 2 per row,
with the padding positions masked out of the softmax so that a row's loss does not depend on its batch.

Answers: per question over all its windows, the ``n_best`` best start and end tokens of the context, spans with
end >= start and at most ``max_answer_length`` tokens, scored by start + end logit; the null score is the [CLS]
start + end logit, the least over the windows (as run_qa.py); on v2.0 data the answer is "" when null score - best
span score > ``null_threshold``. A span is cut from the original context by its tokens' character offsets, so it
keeps the text's case, accents and spacing. Exact match and F1 are the official SQuAD v1.1 and v2.0 evaluation
scripts' (``squad_scores``), between 0 and 1.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from json.decoder import scanstring
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertgpu.data.classification import read_text
from bertgpu.errors import UserError
from bertgpu.finetuning.base import Options

MAX_QUESTION_TOKENS = 64  # BERT's run_squad.py max_query_length: a longer question is cut to its first 64 tokens
SHOWN_BEST = 5  # candidate answers kept in a prediction's n_best
_SHOWN_LINES = 5  # line numbers quoted in a warning
_JSONL = (".jsonl", ".ndjson")


# ---------------------------------------------------------------------------------------------------------------
# Reading


@dataclass
class QAExamples:
    """Questions with their contexts and answers, as read from one file. ``answers`` is None for a file without
    answers (what ``predict`` reads); an unanswerable question has an empty list."""

    path: Path
    ids: list[str]
    questions: list[str]
    contexts: list[str]  # each question's context (one string object for the questions of a paragraph)
    answers: list[list[tuple[str, int]]] | None  # (text, character start in the context) per gold answer
    lines: list[int]  # the line of each question (of its "question" key in a SQuAD JSON file)
    v2: bool  # SQuAD v2.0: unanswerable questions (or the file's "version" says v2)
    note: str | None = None
    notes: list[str] = field(default_factory=list)  # warnings(), one line each

    def __len__(self) -> int:
        return len(self.questions)

    @property
    def labelled(self) -> bool:
        return self.answers is not None

    def warnings(self) -> list[str]:
        return list(self.notes)

    def subset(self, indices: Sequence[int]) -> QAExamples:
        pick = lambda values: [values[i] for i in indices]  # noqa: E731
        answers = None if self.answers is None else pick(self.answers)
        return QAExamples(
            self.path, pick(self.ids), pick(self.questions), pick(self.contexts), answers, pick(self.lines), self.v2
        )


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _is_jsonl(path: Path, text: str, options: Options) -> bool:
    """JSON Lines by --format or the file's extension; else by content: a first line that is a whole JSON object
    without SQuAD's "data" is a line of JSON Lines (a pretty-printed SQuAD file's first line is "{")."""
    if options.format == "jsonl":
        return True
    if options.format not in (None, "", "json"):
        raise UserError(f"{path}: question answering reads SQuAD JSON or JSON Lines, not --format {options.format}")
    suffix = Path(path.name.lower().removesuffix(".gz")).suffix
    if suffix in _JSONL or suffix == ".json":
        return suffix in _JSONL
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and "data" not in record


class _KeyLines:
    """The line of each ``"key": "value"`` of a JSON text, found in document order (json.loads keeps no
    positions): the next occurrence of the key, from the last one found, whose string value is the one asked for."""

    def __init__(self, text: str, key: str, newlines: list[int]):
        self.text, self.newlines, self.next = text, newlines, 0
        self.hits = [(m.start(), m.end()) for m in re.finditer(rf'"{key}"\s*:\s*', text)]

    def line_of(self, position: int) -> int:
        return bisect.bisect_left(self.newlines, position) + 1

    def find(self, value: Any) -> int | None:
        if not isinstance(value, str):
            return None
        for k in range(self.next, len(self.hits)):
            start, end = self.hits[k]
            if self.text.startswith('"', end):
                try:
                    found, _ = scanstring(self.text, end + 1)
                except ValueError:
                    continue
                if found == value:
                    self.next = k + 1
                    return self.line_of(start)
        return None

    def here(self) -> int:
        """The line of the next occurrence not yet matched (a best guess for a value that is not a string)."""
        return self.line_of(self.hits[self.next][0]) if self.next < len(self.hits) else 1


class _Builder:
    """Collects the questions of a file, checking each as it comes."""

    def __init__(self, path: Path, jsonl: bool):
        self.path, self.jsonl = path, jsonl
        self.ids: list[str] = []
        self.questions: list[str] = []
        self.contexts: list[str] = []
        self.answers: list[list[tuple[str, int]] | None] = []
        self.lines: list[int] = []
        self.seen: dict[str, int] = {}

    def add(self, line: int, qid: Any, question: Any, context: str, answers: list[tuple[Any, Any]] | None) -> None:
        where = f"{self.path}:{line}"
        if qid is None:  # JSON Lines: the line; SQuAD JSON (where many questions may share a line): the number
            qid = str(line) if self.jsonl else str(len(self.ids) + 1)
        if isinstance(qid, bool) or not isinstance(qid, (str, int)):
            raise UserError(f"{where}: the question's id is a JSON {type(qid).__name__}, not a text")
        qid = str(qid)
        if qid in self.seen:
            raise UserError(f"{where}: question id {qid!r} is already used on line {self.seen[qid]} (ids must differ)")
        if not isinstance(question, str) or not question.strip():
            raise UserError(
                f"{where}: question {qid!r} is empty" + ("" if isinstance(question, str) else " or not a text")
            )
        checked = None
        if answers is not None:
            checked = []
            for text, start in answers:
                if not isinstance(text, str) or not text.strip():
                    raise UserError(f"{where}: question {qid!r} has an empty answer text")
                if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                    raise UserError(f"{where}: question {qid!r}: answer_start {start!r} is not a character offset")
                there = context[start : start + len(text)]
                if there != text:
                    found = context.find(text)
                    hint = f"; the text first appears at {found}" if found >= 0 else "; the context never has it"
                    said = f"reads {_short(there)}" if start < len(context) else f"has only {len(context)} characters"
                    raise UserError(
                        f"{where}: question {qid!r}: answer {_short(text)} is not at its answer_start {start} "
                        f"(the context there {said}{hint})"
                    )
                checked.append((text, start))
        self.seen[qid] = line
        self.ids.append(qid)
        self.questions.append(question)
        self.contexts.append(context)
        self.answers.append(checked)
        self.lines.append(line)

    def examples(self, version_v2: bool, note: str | None) -> QAExamples:
        if not self.questions:
            raise UserError(f"{self.path} holds no questions")
        labelled = [a is not None for a in self.answers]
        if any(labelled) and not all(labelled):
            i = labelled.index(not labelled[0])
            has = ("has answers", "has none") if labelled[i] else ("has no answers", "has")
            raise UserError(
                f"{self.path}:{self.lines[i]}: question {self.ids[i]!r} {has[0]} but question {self.ids[0]!r} "
                f"(line {self.lines[0]}) {has[1]}: give every question its answers (an empty list: unanswerable), "
                "or none (a file to predict on)"
            )
        answers = self.answers if all(labelled) else None
        unanswerable = sum(not a for a in answers) if answers is not None else 0
        notes = []
        if unanswerable and note == "v1.1":
            notes.append(
                f"{self.path}: its version says v1.1 but {unanswerable} question(s) have no answer: read as v2.0"
            )
        v2 = bool(unanswerable) or version_v2
        return QAExamples(self.path, self.ids, self.questions, self.contexts, answers, self.lines, v2, notes=notes)


def _not_squad(path: Path, found: Any) -> UserError:
    what = (
        f"an object with keys {', '.join(map(repr, list(found)[:6]))}"
        if isinstance(found, dict)
        else f"a JSON {type(found).__name__}"
    )
    return UserError(
        f'{path}: not SQuAD JSON (an object with a "data" list of articles, each with "paragraphs" of "context" '
        f'and "qas"): found {what}'
    )


def _read_squad_json(path: Path, text: str) -> QAExamples:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); SQuAD JSON is one JSON object") from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise _not_squad(path, document)
    newlines = [m.start() for m in re.finditer("\n", text)]
    question_lines, context_lines = _KeyLines(text, "question", newlines), _KeyLines(text, "context", newlines)
    version = str(document.get("version", ""))
    out = _Builder(path, jsonl=False)
    for article in document["data"]:
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise _not_squad(path, article if isinstance(article, dict) else [article]) from None
        for paragraph in article["paragraphs"]:
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            line = context_lines.find(context) or context_lines.here()
            if not isinstance(context, str) or not context.strip():
                raise UserError(f"{path}:{line}: a paragraph with an empty context (or none)")
            qas = paragraph.get("qas")
            if not isinstance(qas, list):
                raise UserError(f'{path}:{line}: a paragraph without a "qas" list of questions')
            for qa in qas:
                if not isinstance(qa, dict):
                    raise UserError(f"{path}:{question_lines.here()}: a question that is a JSON {type(qa).__name__}")
                qline = question_lines.find(qa.get("question")) or question_lines.here()
                answers = None
                if "answers" in qa or "is_impossible" in qa:
                    listed = qa.get("answers") or []
                    if not isinstance(listed, list) or not all(isinstance(a, dict) for a in listed):
                        raise UserError(f'{path}:{qline}: "answers" is not a list of {{"text", "answer_start"}}')
                    if qa.get("is_impossible") and listed:
                        raise UserError(
                            f"{path}:{qline}: question {qa.get('id')!r} is_impossible but has {len(listed)} answer(s)"
                        )
                    answers = [(a.get("text"), a.get("answer_start")) for a in listed]
                out.add(qline, qa.get("id"), qa.get("question"), context, answers)
    return out.examples(version.startswith("v2"), "v1.1" if version.startswith("v1") else None)


def _jsonl_answers(path: Path, line: int, value: Any) -> list[tuple[Any, Any]]:
    if isinstance(value, dict):
        texts, starts = value.get("text"), value.get("answer_start")
        if isinstance(texts, list) and isinstance(starts, list) and len(texts) == len(starts):
            return list(zip(texts, starts))
    elif isinstance(value, list) and all(isinstance(a, dict) for a in value):
        return [(a.get("text"), a.get("answer_start")) for a in value]
    raise UserError(
        f'{path}:{line}: "answers" should be {{"text": [...], "answer_start": [...]}} (lists of one length; '
        "empty: unanswerable)"
    )


def _read_jsonl(path: Path, text: str) -> QAExamples:
    out = _Builder(path, jsonl=True)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path}:{number}: not valid JSON ({e.msg}); JSON Lines needs one object per line"
            ) from None
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number}: a JSON {type(record).__name__}, not an object of context and question")
        for key in ("context", "question"):
            if key not in record:
                raise UserError(f'{path}:{number}: no "{key}" (each line needs context, question and answers)')
        context = record["context"]
        if not isinstance(context, str) or not context.strip():
            raise UserError(
                f"{path}:{number}: an empty context" + ("" if isinstance(context, str) else " or not a text")
            )
        answers = _jsonl_answers(path, number, record["answers"]) if "answers" in record else None
        out.add(number, record.get("id"), record["question"], context, answers)
    return out.examples(False, None)


def read(path: str | Path, options: Options = Options()) -> QAExamples:
    """The questions of a SQuAD JSON or JSON Lines file, checked (see the module's docstring)."""
    path = Path(path)
    text = read_text(path, "one SQuAD JSON or JSON Lines file")
    if not text.strip():
        raise UserError(f"{path} is empty")
    return _read_jsonl(path, text) if _is_jsonl(path, text, options) else _read_squad_json(path, text)


def detect(path: str | Path, options: Options = Options()) -> str | None:
    """Why ``path`` is question-answering data by its structure alone (reading checks the rest), else None."""
    path = Path(path)
    try:
        text = read_text(path, "one SQuAD JSON or JSON Lines file")
        jsonl = _is_jsonl(path, text, options)
    except UserError:
        return None
    if jsonl:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            return None
        if isinstance(record, dict) and {"context", "question", "answers"} <= record.keys():
            return "JSON Lines with context, question and answers"
        return None
    if not text.lstrip().startswith("{"):
        return None
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        return None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list) or not data or not all(isinstance(a, dict) and "paragraphs" in a for a in data):
        return None
    qas = [
        qa
        for article in data
        for paragraph in article["paragraphs"] or ()
        if isinstance(paragraph, dict)
        for qa in paragraph.get("qas") or ()
        if isinstance(qa, dict)
    ]
    unanswerable = any(qa.get("is_impossible") or qa.get("answers") == [] for qa in qas)
    if unanswerable or str(document.get("version", "")).startswith("v2"):
        return "SQuAD JSON (v2.0: unanswerable questions)"
    return "SQuAD JSON (v1.1)"


def split(examples: QAExamples, fraction: float, seed: int) -> tuple[QAExamples, QAExamples]:
    """Hold out ``fraction`` of the contexts (with all their questions, so that no held-out context was trained
    on), seeded: (train, eval)."""
    if not 0 < fraction < 1:
        raise UserError(f"--eval-split must be between 0 and 1, got {fraction}")
    by_context: dict[str, list[int]] = {}
    for i, context in enumerate(examples.contexts):
        by_context.setdefault(context, []).append(i)
    groups = list(by_context.values())
    random.Random(seed).shuffle(groups)
    held = min(round(fraction * len(groups)), len(groups) - 1)
    if held < 1:
        raise UserError(
            f"{examples.path}: --eval-split {fraction} of {len(groups)} context(s) holds out none (questions of one "
            "context stay together); raise it or pass --eval FILE"
        )
    eval_indices = sorted(i for group in groups[:held] for i in group)
    taken = set(eval_indices)
    return examples.subset([i for i in range(len(examples)) if i not in taken]), examples.subset(eval_indices)


# ---------------------------------------------------------------------------------------------------------------
# Encoding


class QAEncoded:
    """The rows of a set of questions: each question's windows, in question order."""

    def __init__(self, pad_id: int, options: Options):
        self.pad_id = pad_id
        self.options = options  # evaluate() post-processes with the options encode() was given
        self.rows: list[np.ndarray] = []  # token ids, int32
        self.lengths = np.zeros(0, dtype=np.int64)
        self.example = np.zeros(0, dtype=np.int64)  # row -> question
        self.question_tokens = np.zeros(0, dtype=np.int64)  # row -> the question's tokens (the context follows +2)
        self.window = np.zeros(0, dtype=np.int64)  # row -> its first context token, as an index in the context
        self.window_tokens = np.zeros(0, dtype=np.int64)  # row -> its context tokens
        self.context_of = np.zeros(0, dtype=np.int64)  # question -> index into offsets
        self.offsets: list[np.ndarray] = []  # per distinct context: [tokens, 2] character (start, end) of each token
        self.labels: np.ndarray | None = None  # [rows, 2] (start, end) token of the answer in the row, 0 = [CLS]
        self.notes: list[str] = []

    def __len__(self) -> int:
        return len(self.rows)

    def warnings(self) -> list[str]:
        return list(self.notes)

    def rows_of(self, question: int) -> range:
        first = int(np.searchsorted(self.example, question, side="left"))
        return range(first, int(np.searchsorted(self.example, question, side="right")))

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The rows at ``indices``, padded to the longest of them; ``labels`` [B, 2] (start, end) when labelled."""
        longest = max(int(self.lengths[i]) for i in indices)
        ids = np.full((len(indices), longest), self.pad_id, dtype=np.int64)
        types = np.zeros((len(indices), longest), dtype=np.int64)
        mask = np.zeros((len(indices), longest), dtype=np.int64)
        for k, i in enumerate(indices):
            n = int(self.lengths[i])
            ids[k, :n] = self.rows[i]
            types[k, self.question_tokens[i] + 2 : n] = 1
            mask[k, :n] = 1
        batch = {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": torch.from_numpy(mask),
        }
        if self.labels is not None:
            batch["labels"] = torch.from_numpy(self.labels[list(indices)].astype(np.int64))
        return batch


def _windows(n: int, room: int, overlap: int) -> list[int]:
    """The first context token of each window of ``room`` tokens over ``n``, consecutive windows sharing
    ``overlap`` (tokenizers' overflowing tokens with ``stride``, as run_qa.py makes them)."""
    starts = [0]
    while starts[-1] + room < n:
        starts.append(starts[-1] + room - overlap)
    return starts


def _answer_tokens(offsets: np.ndarray, start: int, end: int) -> tuple[int, int] | None:
    """The first and last context tokens overlapping the characters [start, end), or None if none does."""
    first = int(np.searchsorted(offsets[:, 1], start, side="right"))  # the first token ending after start
    last = int(np.searchsorted(offsets[:, 0], end, side="left")) - 1  # the last token starting before end
    return (first, last) if first <= last else None


def encode(examples: QAExamples, tokenizer: Any, label2id: dict[str, int], options: Options) -> QAEncoded:
    """``[CLS] question [SEP] window [SEP]`` rows of every question (see the module's docstring)."""
    encoded = QAEncoded(tokenizer.pad_id, options)
    distinct: dict[str, int] = {}
    encoded.context_of = np.array([distinct.setdefault(c, len(distinct)) for c in examples.contexts], dtype=np.int64)
    context_ids, context_offsets = tokenizer.encode_batch_with_offsets(list(distinct))
    context_ids = [np.asarray(ids, dtype=np.int32) for ids in context_ids]
    encoded.offsets = [np.asarray(o, dtype=np.int64).reshape(-1, 2) for o in context_offsets]
    question_ids = tokenizer.encode_batch(examples.questions)
    cls, sep = np.array([tokenizer.cls_id], np.int32), np.array([tokenizer.sep_id], np.int32)
    max_length, stride = options.max_seq_length, options.doc_stride
    example, q_tokens, window, w_tokens, labels = [], [], [], [], []
    cut, narrowed = [], []
    for i, ids in enumerate(question_ids):
        if len(ids) > MAX_QUESTION_TOKENS:
            cut.append(examples.lines[i])
            ids = ids[:MAX_QUESTION_TOKENS]
        room = max_length - len(ids) - 3
        if room < 1:
            raise UserError(
                f"--max-seq-length {max_length} leaves no room for the context after the question at "
                f"{examples.path}:{examples.lines[i]} ({len(ids)} tokens)"
            )
        overlap = stride
        if stride > room // 2:  # tokenizers refuses a stride >= the window; more than half would multiply the rows
            overlap = room // 2
            narrowed.append(examples.lines[i])
        c = int(encoded.context_of[i])
        tokens, offsets = context_ids[c], encoded.offsets[c]
        span = None
        if examples.answers is not None and examples.answers[i]:
            text, start = examples.answers[i][0]  # trained on the first answer, as run_qa.py
            span = _answer_tokens(offsets, start, start + len(text))
        head = np.concatenate([cls, np.asarray(ids, dtype=np.int32), sep])
        for w in _windows(len(tokens), room, overlap):
            piece = tokens[w : w + room]
            encoded.rows.append(np.concatenate([head, piece, sep]))
            example.append(i)
            q_tokens.append(len(ids))
            window.append(w)
            w_tokens.append(len(piece))
            inside = span is not None and w <= span[0] and span[1] < w + len(piece)
            labels.append((span[0] - w + len(ids) + 2, span[1] - w + len(ids) + 2) if inside else (0, 0))
    encoded.lengths = np.array([len(r) for r in encoded.rows], dtype=np.int64)
    encoded.example, encoded.question_tokens = np.array(example, np.int64), np.array(q_tokens, np.int64)
    encoded.window, encoded.window_tokens = np.array(window, np.int64), np.array(w_tokens, np.int64)
    if examples.answers is not None:
        encoded.labels = np.array(labels, dtype=np.int64).reshape(-1, 2)
    if cut:
        encoded.notes.append(
            f"{examples.path}: {len(cut)} question(s) longer than {MAX_QUESTION_TOKENS} tokens cut to their first "
            f"{MAX_QUESTION_TOKENS} (BERT's max_query_length; lines {_lines(cut)})"
        )
    if narrowed:
        encoded.notes.append(
            f"{examples.path}: --doc-stride {stride} is more than half the context tokens a window holds after the "
            f"question (--max-seq-length {max_length}) for {len(narrowed)} question(s): their windows overlap by "
            f"half a window instead (lines {_lines(narrowed)}); raise --max-seq-length or lower --doc-stride"
        )
    return encoded


def _lines(lines: list[int]) -> str:
    return ", ".join(map(str, lines[:_SHOWN_LINES])) + (", ..." if len(lines) > _SHOWN_LINES else "")


# ---------------------------------------------------------------------------------------------------------------
# Loss


def _masked(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logits.float().masked_fill(~mask.bool()[..., None], torch.finfo(torch.float32).min)


def loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(CE(start logits, start) + CE(end logits, end)) / 2 per row, summed over the batch, in float32."""
    logits = _masked(logits, batch["attention_mask"])
    labels = batch["labels"]
    start = F.cross_entropy(logits[..., 0], labels[:, 0], reduction="none")
    end = F.cross_entropy(logits[..., 1], labels[:, 1], reduction="none")
    return ((start + end) / 2).sum()


def train_sums(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    masked = _masked(logits.detach(), batch["attention_mask"])
    labels = batch["labels"]
    right = (masked[..., 0].argmax(-1) == labels[:, 0]) & (masked[..., 1].argmax(-1) == labels[:, 1])
    return {"loss": loss(logits.detach(), batch), "correct": right.sum(), "units": units(batch)}


def units(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.tensor(batch["input_ids"].shape[0], device=batch["input_ids"].device)


def _rows_loss(outputs: np.ndarray, encoded: QAEncoded) -> float:
    """The loss of every row from the gathered outputs (zero past a row's length, masked out), averaged."""
    positions = np.arange(outputs.shape[1])
    masked = np.where((positions[None, :] < encoded.lengths[:, None])[..., None], outputs, -np.inf)
    peak = masked.max(axis=1)
    log_z = peak + np.log(np.exp(masked - peak[:, None, :]).sum(axis=1))  # [rows, 2]
    rows = np.arange(len(encoded))
    picked = np.stack([outputs[rows, encoded.labels[:, k], k] for k in range(2)], axis=1)
    return float(((log_z - picked).sum(axis=1) / 2).mean()) if len(encoded) else 0.0


# ---------------------------------------------------------------------------------------------------------------
# Answers


def answers(
    outputs: torch.Tensor | np.ndarray, encoded: QAEncoded, examples: QAExamples, options: Options
) -> list[dict]:
    """Each question's answer from the logits of its rows (``outputs`` [rows, longest, 2]): ``answer`` (text of the
    original context, "" for none), ``start`` (its first character, -1 for none), ``score`` (its probability among
    the candidates), ``null_diff`` (null score - best span score) and ``n_best`` [{text, start, score}] best first.
    Null answers compete on v2.0 data (``examples.v2``; ``options.extra["version_2_with_negative"]`` overrides)."""
    out = outputs.detach().cpu().numpy() if isinstance(outputs, torch.Tensor) else np.asarray(outputs)
    allow_null = bool(options.extra.get("version_2_with_negative", examples.v2))
    results = []
    for i in range(len(examples)):
        context = examples.contexts[i]
        offsets = encoded.offsets[int(encoded.context_of[i])]
        spans: dict[tuple[int, int], float] = {}  # (first, end character) -> best score over the windows
        null = math.inf
        for r in encoded.rows_of(i):
            first, n, w = int(encoded.question_tokens[r]) + 2, int(encoded.window_tokens[r]), int(encoded.window[r])
            null = min(null, float(out[r, 0, 0] + out[r, 0, 1]))
            if n == 0:
                continue
            starts, ends = out[r, first : first + n, 0], out[r, first : first + n, 1]
            k = min(options.n_best, n)
            best_starts = np.argsort(-starts, kind="stable")[:k]
            best_ends = np.argsort(-ends, kind="stable")[:k]
            s, e = np.meshgrid(best_starts, best_ends, indexing="ij")
            ok = (e >= s) & (e - s + 1 <= options.max_answer_length)
            for a, b in zip(s[ok], e[ok]):
                key = (int(offsets[w + a, 0]), int(offsets[w + b, 1]))
                score = float(starts[a] + ends[b])
                if score > spans.get(key, -math.inf):
                    spans[key] = score
        ranked = sorted(spans.items(), key=lambda kv: (-kv[1], kv[0]))[: options.n_best]
        candidates = [{"text": context[a:b], "start": a, "logit": score} for (a, b), score in ranked]
        if allow_null and math.isfinite(null):
            candidates.append({"text": "", "start": -1, "logit": null})
            candidates.sort(key=lambda c: -c["logit"])
        if candidates:
            logits = np.array([c["logit"] for c in candidates])
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            for c, p in zip(candidates, probs):
                c["score"] = float(p)
        best = next((c for c in candidates if c["start"] >= 0), None)
        diff = null - best["logit"] if best is not None and math.isfinite(null) else math.inf
        chosen = best
        if best is None or (allow_null and diff > options.null_threshold):
            chosen = next((c for c in candidates if c["start"] < 0), {"text": "", "start": -1, "score": 0.0})
        results.append(
            {
                "answer": chosen["text"],
                "start": chosen["start"],
                "score": chosen["score"],
                "null_diff": diff,
                "n_best": [{"text": c["text"], "start": c["start"], "score": c["score"]} for c in candidates],
            }
        )
    return results


# ---------------------------------------------------------------------------------------------------------------
# Metrics: the official SQuAD evaluation scripts' definitions (v1.1: evaluate-v1.1.py, v2.0: evaluate-v2.0.py)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (both scripts' normalize_answer)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def f1_v1(prediction: str, truth: str) -> float:
    """evaluate-v1.1.py's f1_score: 0 when nothing is shared (so also when either side normalises to nothing)."""
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_v2(truth: str, prediction: str) -> float:
    """evaluate-v2.0.py's compute_f1 (gold first, as there): when either is empty, 1 if both are, else 0."""
    gold = normalize_answer(truth).split() if truth else []
    pred = normalize_answer(prediction).split() if prediction else []
    if not gold or not pred:
        return float(gold == pred)
    same = sum((Counter(gold) & Counter(pred)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]], v2: bool) -> dict[str, float | int]:
    """``exact_match`` and ``f1`` of each question's predicted text against its gold texts (the max over them),
    averaged, as the official script of v1.1 or v2.0 computes them (its 0-100 figures divided by 100). v2.0: a
    question without gold answers is unanswerable (gold ""), and HasAns_/NoAns_ exact, f1 and total split them."""
    exact, f1, has = [], [], []
    for prediction, texts in zip(predictions, golds):
        if v2:
            kept = [t for t in texts if normalize_answer(t)] or [""]
            exact.append(max(float(normalize_answer(t) == normalize_answer(prediction)) for t in kept))
            f1.append(max(f1_v2(t, prediction) for t in kept))
        else:
            exact.append(max(float(normalize_answer(prediction) == normalize_answer(t)) for t in texts))
            f1.append(max(f1_v1(prediction, t) for t in texts))
        has.append(bool(texts))
    mean = lambda values: float(np.mean(values)) if values else 0.0  # noqa: E731
    scores: dict[str, float | int] = {"exact_match": mean(exact), "f1": mean(f1)}
    if v2:
        for name, want in (("HasAns", True), ("NoAns", False)):
            picked = [k for k, h in enumerate(has) if h == want]
            scores[f"{name}_total"] = len(picked)
            if picked:  # as the script, a group without questions has no figures
                scores[f"{name}_exact"] = mean([exact[k] for k in picked])
                scores[f"{name}_f1"] = mean([f1[k] for k in picked])
    return scores


# ---------------------------------------------------------------------------------------------------------------
# The task


def _one_line(text: str) -> str:
    return " ".join(text.split())


class QuestionAnswering:
    name = "question-answering"
    head = "span"
    problem_type = None
    main_metric = "f1"
    metrics = ("f1", "exact_match")
    unit = "example"

    def detect(self, path: Path, options: Options) -> str | None:
        return detect(path, options)

    def read(self, path: Path, options: Options, labelled: bool = True) -> QAExamples:
        return read(path, options)  # answers where the file has them, none needed

    def from_texts(self, texts: list[str], options: Options) -> QAExamples:
        """A question and its context."""
        if len(texts) != 2 or not all(t.strip() for t in texts):
            raise UserError(f"give a question and its context (two texts), not {len(texts)}; or --input FILE")
        return QAExamples(Path("(command line)"), ["1"], [texts[0]], [texts[1]], None, [1], False)

    def label_names(self, train: QAExamples) -> list[str]:
        """Two outputs per token: the start and the end score."""
        if not train.labelled:
            raise UserError(f"{train.path}: its questions have no answers; fine-tuning needs answered questions")
        if not any(train.answers or ()):
            raise UserError(f"{train.path}: every question is unanswerable: nothing to learn where answers are")
        return ["start", "end"]

    def check_eval(self, examples: QAExamples, names: list[str], source: str) -> None:
        if len(names) != 2:
            raise UserError(f"{source} has {len(names)} outputs per token, not a start and an end: not a QA model")
        if not examples.labelled:
            raise UserError(f"{examples.path}: its questions have no answers to evaluate against")

    def split(self, examples: QAExamples, fraction: float, seed: int) -> tuple[QAExamples, QAExamples]:
        return split(examples, fraction, seed)

    def describe(self, train: QAExamples, names: list[str]) -> tuple[str, list[str]]:
        unanswerable = sum(not a for a in train.answers or ())
        line = (
            f"{train.path}: {len(train):,} questions on {len(set(train.contexts)):,} contexts, "
            f"{unanswerable:,} unanswerable ({'SQuAD v2.0' if train.v2 else 'SQuAD v1.1'})"
        )
        several = sum(len(a) > 1 for a in train.answers or ())
        notes = []
        if several:
            notes.append(f"{train.path}: {several:,} questions have several answers: each is trained on its first")
        return line, notes

    def encode(self, examples: QAExamples, tokenizer: Any, label2id: dict[str, int], options: Options) -> QAEncoded:
        return encode(examples, tokenizer, label2id, options)

    def output_shape(self, encoded: QAEncoded, num_labels: int) -> tuple[int, ...]:
        return (int(encoded.lengths.max()) if len(encoded) else 0, 2)

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return loss(logits, batch)

    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return units(batch)

    def mean_units(self, encoded: QAEncoded) -> float:
        return 1.0

    def train_sums(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return train_sums(logits, batch)

    def evaluate(
        self, outputs: torch.Tensor, encoded: QAEncoded, examples: QAExamples, names: list[str]
    ) -> dict[str, Any]:
        """``loss`` (per row), ``exact_match`` and ``f1`` (per question, the official SQuAD scripts'), ``examples``
        (questions), and on v2.0 data the HasAns_/NoAns_ split."""
        self.check_eval(examples, names, "the model")
        out = outputs.detach().cpu().double().numpy() if isinstance(outputs, torch.Tensor) else np.asarray(outputs)
        found = answers(out, encoded, examples, encoded.options)
        golds = [[text for text, _ in a] for a in examples.answers or ()]
        metrics: dict[str, Any] = {"loss": _rows_loss(out, encoded)}
        metrics.update(squad_scores([f["answer"] for f in found], golds, examples.v2))
        metrics["examples"] = len(examples)
        return metrics

    def eval_line(self, metrics: dict[str, Any]) -> str:
        line = f"loss {metrics['loss']:.4f} | exact_match {metrics['exact_match']:.4f} | f1 {metrics['f1']:.4f}"
        if metrics.get("NoAns_total"):  # v2.0: how the answerable and the unanswerable questions fare apart
            line += f" | HasAns_f1 {metrics['HasAns_f1']:.4f} | NoAns_f1 {metrics['NoAns_f1']:.4f}"
        return line

    def predict(
        self, outputs: torch.Tensor, encoded: QAEncoded, examples: QAExamples, names: list[str], options: Options
    ) -> list[dict]:
        """Per question: ``id``, ``question``, ``answer`` ("" for none), ``start`` (its character in the context,
        -1 for none), ``score`` (probability among the candidates) and ``n_best`` (the best 5 of them)."""
        return [
            {
                "id": qid,
                "question": question,
                "answer": found["answer"],
                "start": found["start"],
                "score": found["score"],
                "n_best": found["n_best"][:SHOWN_BEST],
            }
            for qid, question, found in zip(
                examples.ids, examples.questions, answers(outputs, encoded, examples, options)
            )
        ]

    def show(self, prediction: dict) -> str:
        return f"{_one_line(prediction['answer'])}\t{prediction['score']:.4f}\t{_one_line(prediction['question'])}"

    def render(self, examples: QAExamples, predictions: list[dict], fmt: str | None = None) -> bytes:
        return render(examples, predictions, fmt)


def render(examples: QAExamples, predictions: Sequence[dict], fmt: str | None = None) -> bytes:
    """``predict --output``: SQuAD's predictions JSON {id: answer} (what the official evaluation scripts read), or
    with ``fmt`` "jsonl" one whole prediction per line."""
    if fmt in (None, "", "json"):
        return (json.dumps({p["id"]: p["answer"] for p in predictions}, ensure_ascii=False, indent=1) + "\n").encode()
    if fmt == "jsonl":
        return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions).encode()
    raise UserError(f"question answering writes its predictions as json (SQuAD's) or jsonl, not {fmt}")


TASK = QuestionAnswering()
