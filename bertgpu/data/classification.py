"""Labelled text for sequence classification: CSV, TSV or JSONL files -> examples -> padded batches.

Real files are messy, so reading is strict about what makes a file unusable and lenient about single
rows: a missing column, an unknown file type, an empty file or bytes that are not UTF-8 end with one
line naming the file (and line); a row with an empty text or label is skipped, counted and reported
with its line number, never silently dropped and never a crash.

Labels are names (strings), so ``positive``/``negative`` and ``0``/``1`` files work alike; the label
map sorts them (numerically when every label is an integer) so that the same labels always get the
same ids. Batches are padded to their longest example (dynamic padding), not to ``max_length``, and
training batches can be grouped by length (``train_batches(..., lengths=...)``) so that they need
little padding.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertgpu.data.encoding import decode_text
from bertgpu.data.sharing import owners, share
from bertgpu.data.tokenizer import Tokenizer
from bertgpu.errors import UserError

FORMATS = ("csv", "tsv", "jsonl")
_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_SHOWN_LINES = 5  # line numbers quoted in a warning about skipped rows
_INTEGER = re.compile(r"[+-]?\d+")
# What a ".csv" may be separated by (spreadsheets save ';' where ',' is the decimal comma), and their names.
DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "vertical bar"}
_SNIFF_LINES = 50  # lines read to tell the delimiter


def detect_format(path: str | Path, fmt: str | None = None) -> str:
    """``fmt`` when given, else the format named by the file's extension (``.gz`` looked through)."""
    if fmt:
        if fmt not in FORMATS:
            raise UserError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
        return fmt
    if Path(path).is_dir():
        raise UserError(f"{path} is a directory: give one labelled file (.csv, .tsv or .jsonl, .gz allowed)")
    name = Path(path).name.lower().removesuffix(".gz")
    ext = Path(name).suffix
    if ext not in _EXTENSIONS:
        raise UserError(
            f"{path}: cannot tell the file type from its extension {ext or '(none)'!r}; "
            f"name it .csv, .tsv or .jsonl, or pass --format csv|tsv|jsonl"
        )
    return _EXTENSIONS[ext]


@dataclass
class Table:
    """A file's records as read: the columns (CSV header, or JSON keys in order of first use) and rows."""

    path: Path
    format: str
    columns: list[str]
    rows: list[tuple[int, dict[str, Any]]]  # (line number where the record starts, record)
    note: str | None = None  # how the file was read, when it is not what its name says (a detected delimiter)


def read_table(path: str | Path, fmt: str | None = None, text: str | None = None, delimiter: str = "") -> Table:
    """Read a CSV (with header), TSV (with header) or JSONL (one object per line) file (``text``: its
    content, already read, e.g. from standard input; ``delimiter``: --delimiter, else a CSV's is detected)."""
    path = Path(path)
    fmt = detect_format(path, fmt)
    text = read_text(path) if text is None else text
    if not text.strip():
        raise UserError(f"{path} is empty")
    table = _read_jsonl(path, text) if fmt == "jsonl" else _read_delimited(path, text, fmt, delimiter)
    if not table.rows:
        raise UserError(f"{path} has a header but no rows" if fmt != "jsonl" else f"{path} holds no JSON objects")
    return table


def read_lines(path: str | Path, text: str | None = None) -> Table:
    """Plain text, one text per line, as a table of one column, ``text`` (``text``: the content, already
    read, e.g. from standard input). A blank line is a row with an empty text, so that what is written
    row by row stays line by line with the input."""
    path = Path(path)
    text = read_text(path) if text is None else text
    rows = [(number, {"text": line}) for number, line in enumerate(text.splitlines(), start=1)]
    if not any(record["text"].strip() for _, record in rows):
        raise UserError(f"{path} holds no text")
    return Table(path, "lines", ["text"], rows)


def read_text(path: Path, directory: str = "a data file") -> str:
    """A data file's text (.gz decompressed, UTF-8 checked), or one line saying why it cannot be read
    (``directory``: what to give instead of a directory)."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.name.lower().endswith(".gz") else path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a directory, not {directory}") from None
    except (OSError, EOFError) as e:  # unreadable, or a damaged .gz
        raise UserError(f"{path} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    return decode_text(data, path)


def parse_delimiter(value: str) -> str:
    """--delimiter as typed: one character, ``tab`` or ``\\t`` for a tab; '' (detect) stays ''."""
    value = {"tab": "\t", "\\t": "\t"}.get(value.lower(), value)
    if len(value) > 1 or value in ('"', "\n", "\r"):
        raise UserError(f"--delimiter {value!r}: give one character (, ; | or tab)")
    return value


def _splits_evenly(sample: str, delimiter: str) -> bool:
    """Whether ``delimiter`` splits the header into fields and the lines below into as many (a few fewer
    tolerated, as reading does; never more)."""
    try:
        records = [
            r for r in csv.reader(io.StringIO(sample, newline=""), delimiter=delimiter) if any(map(str.strip, r))
        ]
    except csv.Error:
        return False
    if not records or len(records[0]) < 2:
        return False
    body = records[1:-1] or records[1:]  # the sample's last record may be cut short
    return all(len(r) <= len(records[0]) for r in body) and 2 * sum(len(r) == len(records[0]) for r in body) >= len(
        body
    )


def _detect_delimiter(path: Path, text: str) -> tuple[str, str | None]:
    """A CSV's delimiter: the comma when it splits the first lines evenly, else the one other of ``DELIMITERS``
    that does (with a note saying so); when none does, the comma (reading then says what is wrong)."""
    sample = "".join(text.splitlines(keepends=True)[:_SNIFF_LINES])
    if _splits_evenly(sample, ","):
        return ",", None
    found = [d for d in DELIMITERS if d != "," and _splits_evenly(sample, d)]
    if len(found) > 1:
        names = " and ".join(f"{DELIMITERS[d]}s ({d!r})" for d in found)
        raise UserError(f"{path}: not separated by commas; {names} both split its lines evenly: give --delimiter")
    if found:
        d = found[0]
        flag = "tab" if d == "\t" else repr(d)
        return d, f"{path}: its fields are separated by {DELIMITERS[d]}s, not commas: read so (--delimiter {flag})"
    return ",", None


def _read_delimited(path: Path, text: str, fmt: str, delimiter: str = "") -> Table:
    note = None
    delimiter = parse_delimiter(delimiter)
    if not delimiter:
        delimiter, note = ("\t", None) if fmt == "tsv" else _detect_delimiter(path, text)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader)
        duplicates = sorted({c for c in header if header.count(c) > 1})
        if duplicates:
            raise UserError(f"{path}:1: the header names column(s) {', '.join(map(repr, duplicates))} more than once")
        rows = []
        end = reader.line_num  # a quoted field may span lines: a record starts after the previous one ends
        for record in reader:
            start, end = end + 1, reader.line_num
            if not any(field.strip() for field in record):
                continue  # blank line
            if len(record) > len(header):
                raise UserError(
                    f"{path}:{start}: {len(record)} fields, but the header has {len(header)} "
                    f"(an unquoted {DELIMITERS.get(delimiter, repr(delimiter))} inside a text?)"
                )
            rows.append((start, dict(zip(header, record))))  # missing trailing fields read as empty
        if rows and rows[-1][0] < end and len(record) < len(header) and "\n" in record[-1]:
            # A quote never closed swallows the rest of the file into one field, which reads as a row with an
            # empty label: say where it opened, not "no usable rows" or "skipped 1 row".
            raise UserError(
                f"{path}:{rows[-1][0]}: a quote opened in this row is never closed, so the rest of the file "
                f'(lines {rows[-1][0]}-{end}) reads as one text; close it, or double a quote inside a text ("")'
            )
    except csv.Error as e:
        raise UserError(f"{path}:{reader.line_num}: not valid {fmt.upper()} ({e})") from None
    return Table(path, fmt, header, rows, note)


def _read_jsonl(path: Path, text: str) -> Table:
    columns: dict[str, None] = {}  # an ordered set
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not valid JSON ({e.msg}); JSONL needs one object per line") from None
        if not isinstance(record, dict):
            raise UserError(
                f"{path}:{number}: a JSON {type(record).__name__}, not an object; JSONL needs one object per line"
            )
        columns.update(dict.fromkeys(record))
        rows.append((number, record))
    return Table(path, "jsonl", list(columns), rows)


def _cell(table: Table, line: int, column: str, value: Any) -> str:
    """A field as text: JSON numbers and booleans as JSON writes them, a missing value as ''."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return json.dumps(value)
    raise UserError(f"{table.path}:{line}: column {column!r} holds a JSON {type(value).__name__}, not a text or label")


# The column names of GLUE's files and of the Hugging Face datasets of the tasks BERT is judged on (SST-2, CoLA,
# MRPC, QQP, STS-B, MNLI, QNLI, RTE), read where the flags' defaults (text, label) are not columns of a table: the
# first text column (and its pair) of this list the table has, then its first label column of the next.
KNOWN_TEXTS = (
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("premise", "hypothesis"),
    ("question", "sentence"),
    ("#1 String", "#2 String"),
    ("sentence", ""),
)
KNOWN_LABELS = ("score", "gold_label", "is_duplicate", "labels", "Quality")


def known_columns(path: str | Path, text: str, pair: str, label: str, fmt: str | None = None, delimiter: str = ""):
    """(text, pair, label, note): the columns to read from the table at ``path``, ``text`` / ``pair`` / ``label``
    (the flags) unless ``text`` is the default "text" (``label`` the default "label") and the table has no such
    column but has one of GLUE's names (``KNOWN_TEXTS``, ``KNOWN_LABELS``); ``note`` says what was chosen, or is
    None. A file that is not a table (CoNLL, SQuAD JSON) is left to its task's reader."""
    try:
        columns = read_table(path, fmt, delimiter=delimiter).columns
    except UserError:
        return text, pair, label, None
    chosen = []
    if text == "text" and "text" not in columns and not pair:
        found = next(((a, b) for a, b in KNOWN_TEXTS if a in columns and (not b or b in columns)), None)
        if found:
            text, pair = found
            chosen += [f"text {text!r}"] + [f"pair {pair!r}"] * bool(pair)
    if label == "label" and "label" not in columns and chosen:
        found_label = next((name for name in KNOWN_LABELS if name in columns), None)
        if found_label:
            label = found_label
            chosen.append(f"label {label!r}")
    if not chosen:
        return text, pair, label, None
    flags = "--text-column, --pair-column and --label-column choose others"
    return text, pair, label, f"{path}: columns {', '.join(chosen)} (GLUE's names; {flags})"


def require_columns(table: Table, **columns: str | None) -> None:
    """Each named column (flag name -> column) must exist; the error lists the columns found."""
    for flag, column in columns.items():
        if column and column not in table.columns:
            found = ", ".join(map(repr, table.columns)) or "none"
            inside = [d for d in DELIMITERS if len(table.columns) == 1 and d in table.columns[0]]
            hint = f" (fields separated by {DELIMITERS[inside[0]]}s? give --delimiter)" if inside else ""
            if not hint and table.format != "jsonl" and any(_NUMBER.fullmatch(c.strip()) for c in table.columns):
                hint = " (its first row looks like data: the file needs a header row naming its columns)"
            raise UserError(
                f"{table.path} has no column {column!r} (--{flag.replace('_', '-')}); columns found: {found}{hint}"
            )


@dataclass
class Examples:
    """Texts (and pair texts and labels) of one file, with the line each came from."""

    path: Path
    texts: list[str]
    pairs: list[str] | None
    labels: list[str] | None
    lines: list[int]
    skipped: list[int]  # lines of rows dropped for an empty text, pair or label
    note: str | None = None  # how the file was read (Table.note)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: Sequence[int]) -> Examples:
        pick = lambda values: None if values is None else [values[i] for i in indices]  # noqa: E731
        return Examples(self.path, pick(self.texts), pick(self.pairs), pick(self.labels), pick(self.lines), [])

    def warnings(self) -> list[str]:
        """Its file's warnings, one line each (as every fine-tuning task's examples give them)."""
        return [w for w in (self.skipped_warning(),) if w]

    def skipped_warning(self) -> str | None:
        """One line about the rows skipped, with the first few line numbers; None when there are none."""
        if not self.skipped:
            return None
        shown = ", ".join(map(str, self.skipped[:_SHOWN_LINES])) + (", ..." if len(self.skipped) > _SHOWN_LINES else "")
        fields = ["text"] + ["pair text"] * (self.pairs is not None) + ["label"] * (self.labels is not None)
        what = " or ".join(fields) if len(fields) < 3 else f"{fields[0]}, {fields[1]} or {fields[2]}"
        return f"{self.path}: skipped {len(self.skipped)} row(s) with an empty {what} (lines {shown})"


def load_examples(
    path: str | Path,
    text_column: str,
    pair_column: str | None = None,
    label_column: str | None = None,
    fmt: str | None = None,
    delimiter: str = "",
) -> Examples:
    """Read the examples of a data file; rows with an empty text, pair or label are skipped and counted."""
    table = read_table(path, fmt, delimiter=delimiter)
    require_columns(table, text_column=text_column, pair_column=pair_column, label_column=label_column)
    texts, pairs, labels, lines, skipped = [], [], [], [], []
    for line, record in table.rows:
        text = _cell(table, line, text_column, record.get(text_column))
        pair = _cell(table, line, pair_column, record.get(pair_column)) if pair_column else None
        label = _cell(table, line, label_column, record.get(label_column)).strip() if label_column else None
        if not text.strip() or (pair is not None and not pair.strip()) or label == "":
            skipped.append(line)
            continue
        texts.append(text)
        pairs.append(pair)
        labels.append(label)
        lines.append(line)
    if not texts:
        raise UserError(
            f"{table.path}: no usable rows: all {len(table.rows)} have an empty text"
            f"{', pair text' if pair_column else ''}{' or label' if label_column else ''}"
        )
    return Examples(
        table.path, texts, pairs if pair_column else None, labels if label_column else None, lines, skipped, table.note
    )


def label_names(examples: Examples) -> list[str]:
    """The label map of training data: label names by id, sorted (numerically if all are integers).

    Stable: the same set of labels always gets the same ids, whatever the row order. A classifier
    needs two classes at least, so one-class data is an error, not a model that always says yes.
    """
    names = set(examples.labels or ())
    if len(names) < 2:
        raise UserError(
            f"{examples.path}: every example has the label {next(iter(names), '')!r}; "
            f"a classifier needs examples of at least two classes"
        )
    if all(_INTEGER.fullmatch(n) for n in names):
        return sorted(names, key=lambda n: (int(n), n))
    return sorted(names)


# A label this rare cannot be learned or evaluated; it is most often a typo of another label.
FEW_EXAMPLES = 5


def describe_labels(examples: Examples, names: Sequence[str]) -> tuple[str, list[str]]:
    """The per-label counts of training data as one line, and warnings: labels with fewer than
    ``FEW_EXAMPLES`` examples, and labels that differ only in case, spaces or punctuation (typos that
    would silently become classes of their own, such as ``bash-manual`` and ``Bash_manual``)."""
    counts = Counter(examples.labels or ())
    line = f"{examples.path}: {len(names)} labels: " + ", ".join(f"{name} {counts[name]:,}" for name in names)
    warnings = []
    rare = [name for name in names if counts[name] < FEW_EXAMPLES]
    if rare:
        warnings.append(
            f"{examples.path}: label(s) {', '.join(repr(n) for n in rare)} have fewer than "
            f"{FEW_EXAMPLES} examples each ({', '.join(str(counts[n]) for n in rare)}): too few to learn or "
            "evaluate; a typo of another label?"
        )
    alike: dict[str, list[str]] = {}
    for name in names:
        alike.setdefault(re.sub(r"[\W_]+", "", name.casefold()), []).append(name)
    for group in alike.values():
        if len(group) > 1:
            warnings.append(
                f"{examples.path}: labels {', '.join(repr(n) for n in group)} differ only in case, spaces "
                f"or punctuation and are {len(group)} separate classes; fix the labels if they mean one"
            )
    return line, warnings


def as_data_labels(model_labels: Sequence[str], examples: Examples) -> list[str]:
    """The model's label names as the data spells them. transformers names classes it was given no
    names for LABEL_0, LABEL_1, ...; data labelled 0, 1, ... means those same classes, by number."""
    names = list(model_labels)
    data = set(examples.labels or ())
    placeholders = names == [f"LABEL_{i}" for i in range(len(names))]
    if placeholders and not data <= set(names) and all(_INTEGER.fullmatch(label) for label in data):
        return [str(i) for i in range(len(names))]
    return names


def check_labels(examples: Examples, known: Sequence[str], source: str) -> None:
    """Every label of ``examples`` must be one of ``known`` (the labels seen in ``source``)."""
    known_set = set(known)
    for label, line in zip(examples.labels or (), examples.lines):
        if label not in known_set:
            raise UserError(
                f"{examples.path}:{line}: label {label!r} never appears in {source} "
                f"(labels: {', '.join(map(repr, known))})"
            )


def split_examples(examples: Examples, fraction: float, seed: int) -> tuple[Examples, Examples]:
    """Hold out ``fraction`` of the examples, stratified by label and seeded: (train, eval).

    Every class keeps at least one training example, so a rare class is never moved out entirely.
    """
    if not 0 < fraction < 1:
        raise UserError(f"--eval-split must be between 0 and 1, got {fraction}")
    rng = random.Random(seed)
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(examples.labels or ()):
        by_label.setdefault(label, []).append(i)
    held_out = []
    for label in sorted(by_label):
        indices = by_label[label]
        rng.shuffle(indices)
        held_out += indices[: min(round(fraction * len(indices)), len(indices) - 1)]
    if not held_out:
        raise UserError(
            f"{examples.path}: --eval-split {fraction} of {len(examples)} examples holds out none; "
            f"raise it or pass --eval FILE"
        )
    eval_set = set(held_out)
    train = [i for i in range(len(examples)) if i not in eval_set]
    return examples.subset(train), examples.subset(sorted(held_out))


class ClassificationDataset(torch.utils.data.Dataset):
    """Examples encoded as ``[CLS] a [SEP] (b [SEP])``, truncated longest-first to ``max_length``."""

    def __init__(
        self, examples: Examples, tokenizer: Tokenizer, max_length: int, label2id: dict[str, int] | None = None
    ):
        pairs = examples.pairs or [None] * len(examples)
        encoded = [tokenizer.encode_pair(a, b, max_length) for a, b in zip(examples.texts, pairs)]
        self.input_ids = [np.asarray(e["input_ids"], dtype=np.int64) for e in encoded]
        self.token_type_ids = [np.asarray(e["token_type_ids"], dtype=np.int64) for e in encoded]
        self.lengths = np.array([len(ids) for ids in self.input_ids])
        self.labels = None
        if label2id is not None and examples.labels is not None:
            self.labels = torch.tensor([label2id[label] for label in examples.labels])
        self.pad_id = tokenizer.pad_id

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = {"input_ids": self.input_ids[i], "token_type_ids": self.token_type_ids[i]}
        if self.labels is not None:
            item["labels"] = self.labels[i]
        return item

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The examples at ``indices`` as tensors, padded to the longest of them."""
        return collate([self[i] for i in indices], self.pad_id)


def collate(items: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the longest item of the batch (dynamic padding): input ids, token types, attention mask."""
    width = max(len(item["input_ids"]) for item in items)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(items), width), dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        input_ids[row, :n] = torch.from_numpy(np.asarray(item["input_ids"]))
        token_type_ids[row, :n] = torch.from_numpy(np.asarray(item["token_type_ids"]))
        attention_mask[row, :n] = 1
    batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    if "labels" in items[0]:
        batch["labels"] = torch.stack([torch.as_tensor(item["labels"]) for item in items])
    return batch


# ---------------------------------------------------------------------------------------------
# Which examples each process takes.


MEGABATCH = 50  # global batches per length-sorted megabatch, as transformers' LengthGroupedSampler


def train_batches(
    num_examples: int,
    batch_size: int | Sequence[int],
    world: int,
    rank: int,
    seed: int,
    epoch: int,
    lengths: Sequence[int] | np.ndarray | None = None,
) -> list[tuple[list[int], int]]:
    """This rank's share of every global batch of one epoch: ``[(indices, global batch size), ...]``.

    ``batch_size`` is the examples each of the ``world`` data-parallel ranks takes from a global batch:
    one number for all, or one per rank (unequal GPUs). The epoch's order is a permutation seeded by
    (seed, epoch), cut into global batches of their sum; rank r takes its share, spread over the batch
    (``sharing``: with equal sizes every world-th example, as DistributedSampler does), so N
    processes × b see the same global batches as one process × N·b. The last, smaller global batch is
    kept unless it cannot give every rank an example.

    With ``lengths`` (the examples' token counts) the global batches are grouped by length, as
    transformers' ``group_by_length``: the permutation is cut into megabatches of
    ``min(MEGABATCH, num_examples // (4 × global batch))`` global batches (at least 1), each is
    sorted by length, longest first, and the whole is cut into global batches, whose order is then
    shuffled, the batch with the longest example first (running out of memory shows at step 1).
    A batch is padded to its longest example, so similar lengths leave little padding. Everything
    is drawn from (seed, epoch) alone: the same batches for any number of processes, every example
    once per epoch, and a different grouping every epoch.
    """
    sizes = [batch_size] * world if isinstance(batch_size, int) else list(batch_size)
    if len(sizes) != world:
        raise ValueError(f"{len(sizes)} batch sizes for {world} ranks")
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(num_examples)
    size = sum(sizes)
    if lengths is None:
        global_batches = [order[start : start + size] for start in range(0, num_examples, size)]
    else:
        global_batches = _group_by_length(order, np.asarray(lengths), size, rng)
    return [
        (share(global_batch, sizes, rank).tolist(), len(global_batch))
        for global_batch in global_batches
        if len(global_batch) >= world
    ]


def _group_by_length(order: np.ndarray, lengths: np.ndarray, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``order`` cut into global batches of ``size`` examples of similar length, in a shuffled order."""
    if len(lengths) != len(order):
        raise ValueError(f"{len(lengths)} lengths for {len(order)} examples")
    if not len(order):
        return []
    megabatch = max(1, min(MEGABATCH, len(order) // (4 * size))) * size
    grouped = np.concatenate(
        [
            chunk[np.argsort(-lengths[chunk], kind="stable")]  # ties keep the random order
            for chunk in (order[s : s + megabatch] for s in range(0, len(order), megabatch))
        ]
    )
    batches = [grouped[start : start + size] for start in range(0, len(grouped), size)]
    batches = [batches[i] for i in rng.permutation(len(batches))]
    longest = int(np.argmax([lengths[b].max() for b in batches]))  # the first batch holding a longest example
    batches[0], batches[longest] = batches[longest], batches[0]
    return batches


def eval_batches(
    lengths: Sequence[int], batch_size: int, world: int, rank: int, shares: Sequence[int] | None = None
) -> list[list[int]]:
    """This rank's evaluation batches: every example exactly once over all ranks, none repeated.

    Examples are sorted by length (little padding) and cut into batches of ``batch_size``; the
    batches go to the ranks in turn, in proportion to ``shares`` (the ranks' training batch sizes,
    for unequal GPUs; default: equal), so rank r of n equal ones takes batches r, r + n, ... Every
    batch is the same whatever the number of processes, so each example's logits, and hence the
    metrics, do not depend on it.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    pattern = owners(shares if shares is not None else [1] * world)
    return [batch for j, batch in enumerate(batches) if pattern[j % len(pattern)] == rank]
