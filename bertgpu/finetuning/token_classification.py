"""Token classification (NER, POS, any tag per word): CoNLL or JSONL files -> windows of word pieces -> a tag per word.

The data: a CoNLL-style file (a token and its tag per line, the tag in the last column, a blank line between
sentences, ``-DOCSTART-`` lines skipped) or JSON Lines with ``tokens`` and ``tags`` lists (transformers' datasets
convention, tags as names). A file of tokens alone (one column, or records without ``tags``) can be tagged by
``predict``. Tags are BIO/IOB2 (``B-PER``, ``I-PER``, ``O``; E- and S- read as seqeval reads them) or plain tags
(``NN``, ``VB``: each word its own entity, as ``conlleval -r`` reads them). An I-X that begins an entity (after O
or another type) is read as B-X, as conlleval reads it, and counted in a warning: an IOB1 file becomes IOB2.

A word is labelled on its first word piece; its other pieces, [CLS] and [SEP] are IGNORE_INDEX. A word the
tokenizer drops whole (a control character, a zero-width space) is read as [UNK], so that every word has a piece
and a prediction. A sentence longer than --max-seq-length becomes several rows (windows cut between words,
consecutive ones starting half a window apart, so they share about half their pieces); each word is labelled and
predicted in one of them, the one where it has the most context on both sides, so the loss and the metrics count
every word exactly once and nothing is truncated.

The metrics are conlleval's (and seqeval's default mode): an entity is right only with its exact span and type,
counted per type and micro-averaged, plus word accuracy.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertgpu.data.classification import read_text
from bertgpu.errors import UserError
from bertgpu.finetuning.base import IGNORE_INDEX, Options

CONLL = "a CoNLL file: token and tag per line"
JSONL = "JSON Lines with tokens and tags lists"
_CONLL_EXTENSIONS = (".conll", ".bio", ".iob", ".iob2", ".bioes", ".iobes")
_JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
_PREFIXED = re.compile(r"[BIES]-\S+")
_TAG_LIKE = re.compile(r"O|[BIESLU]-\S+")  # what detect takes for a tag column (BIO, IOBES, BILOU)
_SHOWN = 5  # line numbers quoted in a warning
FEW_ENTITIES = 5  # an entity type this rare cannot be learned or evaluated: most often a typo
_SNIFF_LINES = 20
_SHOWN_TAGS = 20  # tags named in an error


# predict TEXT's words: a CJK character, a run of word characters, or one other non-space character
_WORDS = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+|[^\w\s]")


def _cjk(char: str) -> bool:
    """A character written without spaces between words: CJK ideographs (BERT's ranges) and kana."""
    c = ord(char)
    return (
        0x4E00 <= c <= 0x9FFF
        or 0x3400 <= c <= 0x4DBF
        or 0x20000 <= c <= 0x2FA1F
        or 0xF900 <= c <= 0xFAFF
        or 0x3040 <= c <= 0x30FF
    )


# ---------------------------------------------------------------------------------------------
# Entities, as conlleval and seqeval count them.


def _parts(tag: str) -> tuple[str, str]:
    """(scheme letter, type) of a tag: ``O`` -> (O, ''), ``B-PER`` -> (B, PER); a plain tag is a one-word entity."""
    if tag == "O":
        return "O", ""
    if _PREFIXED.fullmatch(tag):
        return tag[0], tag[2:]
    return "S", tag


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one sentence's tags: (type, start word, end word exclusive), by the rules of conlleval's
    (and seqeval's default mode's) ``endOfChunk``/``startOfChunk``: an I-X after O or another type begins one."""
    found: list[tuple[str, int, int]] = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):
        letter, kind = _parts(tag)
        end = prev_tag in "ES" or (prev_tag in "BI" and letter in "BSO") or (prev_tag != "O" and prev_type != kind)
        if end:
            found.append((prev_type, begin, i))
        start = (
            letter in "BS"
            or (prev_tag in "ES" and letter in "EI")
            or (prev_tag == "O" and letter in "EI")
            or (letter != "O" and prev_type != kind)
        )
        if start:
            begin = i
        prev_tag, prev_type = letter, kind
    return found


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0  # seqeval's zero_division: 0


def _prf(right: int, predicted: int, gold: int) -> dict[str, float]:
    precision, recall = _ratio(right, predicted), _ratio(right, gold)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def score(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Entity-level precision, recall and F1, micro-averaged and per type (with ``support``: gold entities, and
    ``predicted``), of tagged sentences: an entity is right only with its exact span and type."""
    gold_set = {(s, *e) for s, tags in enumerate(gold) for e in entities(tags)}
    pred_set = {(s, *e) for s, tags in enumerate(predicted) for e in entities(tags)}
    right = gold_set & pred_set
    per_type = {}
    for kind in sorted({e[1] for e in gold_set | pred_set}):
        counts = [sum(e[1] == kind for e in group) for group in (right, pred_set, gold_set)]
        per_type[kind] = {**_prf(*counts), "support": counts[2], "predicted": counts[1]}
    return {**_prf(len(right), len(pred_set), len(gold_set)), "per_type": per_type}


# ---------------------------------------------------------------------------------------------
# Reading.


@dataclass
class Sentences:
    """The sentences of one file: words, tags (None for a file of tokens alone), and where each came from."""

    path: Path
    format: str  # "conll" or "jsonl"
    words: list[list[str]]
    tags: list[list[str]] | None
    lines: list[int]  # the line each sentence starts on (a JSONL record's line)
    repaired: list[list[int]]  # per sentence, the words whose I- tag was read as B-
    records: list[dict] | None = None  # JSONL: each sentence's record as read (render writes it back)
    delimiter: str = " "  # CoNLL: between token and tag (a tab when the file's lines had tabs)
    note: str | None = None
    keys: tuple[str, str] = ("tokens", "tags")  # JSONL: the fields of the words and the tags
    scheme: str = "bio"  # "bio" (B-/I- prefixes), or "plain": every tag without one

    def __len__(self) -> int:
        return len(self.words)

    def subset(self, indices: Sequence[int]) -> Sentences:
        pick = lambda values: None if values is None else [values[i] for i in indices]  # noqa: E731
        return replace(
            self,
            words=pick(self.words),
            tags=pick(self.tags),
            lines=pick(self.lines),
            repaired=pick(self.repaired),
            records=pick(self.records),
        )

    def word_line(self, sentence: int, word: int) -> int:
        """The line a word is on (a CoNLL sentence's words are on consecutive lines; JSONL: its record's)."""
        return self.lines[sentence] + (word if self.format == "conll" else 0)

    def where(self, sentence: int, word: int) -> str:
        line = f"{self.path}:{self.word_line(sentence, word)}"
        return line if self.format == "conll" else f"{line}: token {word + 1} ({self.words[sentence][word]!r})"

    def warnings(self) -> list[str]:
        """One line each: I- tags read as B-."""
        lines = [self.word_line(s, w) for s, words in enumerate(self.repaired) for w in words]
        if not lines:
            return []
        distinct = list(dict.fromkeys(lines))  # a JSONL record's words share its line
        shown = ", ".join(map(str, distinct[:_SHOWN])) + (", ..." if len(distinct) > _SHOWN else "")
        begun = sum(1 for tags in self.tags or () for e in entities(tags))
        iob1 = " (an IOB1 file: read as IOB2)" if 2 * len(lines) > begun else ""
        return [
            f"{self.path}: {len(lines):,} I- tags that begin an entity (after O or another type), read as B- as "
            f"conlleval does{iob1} (line{'s' * (len(distinct) > 1)} {shown})"
        ]


def _fields(line: str) -> list[str]:
    """A CoNLL line's columns: split at tabs when it has any (a token may then hold spaces), else at whitespace."""
    if "\t" in line:
        fields = [f.strip() for f in line.split("\t")]
        while fields and not fields[-1]:
            fields.pop()
        return fields
    return line.split()


def _is_docstart(fields: list[str]) -> bool:
    return bool(fields) and fields[0] == "-DOCSTART-"


def _read_conll(path: Path, text: str) -> Sentences:
    words: list[list[str]] = []
    tags: list[list[str]] = []
    lines: list[int] = []
    current: list[list[str]] | None = None
    untagged: int | None = None  # the first line of a token without a tag
    tagged = widest = tabs = 0
    for number, line in enumerate(text.splitlines(), start=1):
        fields = _fields(line)
        if not fields or _is_docstart(fields):
            current = None
            continue
        if current is None:
            current = [[], []]
            words.append(current[0])
            tags.append(current[1])
            lines.append(number)
        current[0].append(fields[0])
        current[1].append(fields[-1] if len(fields) > 1 else "")
        widest = max(widest, len(fields))
        tabs += "\t" in line
        if len(fields) > 1:
            tagged += 1
        elif untagged is None:
            untagged = number
    if not words:
        raise UserError(f"{path} holds no tokens" if text.strip() else f"{path} is empty")
    if tagged and untagged is not None:
        token = text.splitlines()[untagged - 1].strip()
        raise UserError(
            f"{path}:{untagged}: the token {token!r} has no tag; each line needs a token and its tag, separated "
            "by whitespace (the tag in the last column), and a blank line between sentences"
        )
    note = f"{path}: {widest} columns: the token read from the first, the tag from the last" if widest > 2 else None
    return Sentences(
        path, "conll", words, tags if tagged else None, lines, [], delimiter="\t" if tabs else " ", note=note
    )


def _keys(options: Options) -> tuple[str, str]:
    """A JSONL record's fields of words and tags: tokens and tags, or --text-column and --label-column when they
    are not a table's defaults (text and label)."""
    words_key = options.text_column if options.text_column not in ("", "text") else "tokens"
    tags_key = options.label_column if options.label_column not in ("", "label") else "tags"
    return words_key, tags_key


def _read_jsonl(path: Path, text: str, options: Options) -> Sentences:
    words_key, tags_key = _keys(options)
    words, tags, lines, records = [], [], [], []
    without: int | None = None  # the first record without tags
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not valid JSON ({e.msg}); JSONL needs one object per line") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number}: a JSON {type(record).__name__}, not an object with {words_key!r}")
        tokens = record.get(words_key)
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            what = "no" if tokens is None else "a JSON value that is not a list of strings in"
            raise UserError(
                f"{path}:{number}: {what} {words_key!r} (the words, a list of strings); its keys: "
                f"{', '.join(map(repr, record)) or 'none'}"
            )
        labels = record.get(tags_key)
        if labels is None:
            without = number if without is None else without
        elif not isinstance(labels, list) or not all(isinstance(t, str) for t in labels):
            numbers = isinstance(labels, list) and all(isinstance(t, int) for t in labels)
            hint = " (ids of a dataset's ClassLabel? give the tag names)" if numbers else ""
            raise UserError(f"{path}:{number}: {tags_key!r} is not a list of tag names (strings){hint}")
        elif len(labels) != len(tokens):
            raise UserError(
                f"{path}:{number}: {len(tokens)} {words_key} but {len(labels)} {tags_key}: one tag per token"
            )
        elif any(not t.strip() for t in labels):
            raise UserError(f"{path}:{number}: an empty tag in {tags_key!r}")
        words.append(tokens)
        tags.append([t.strip() for t in labels or ()])
        lines.append(number)
        records.append(record)
    if not records:
        raise UserError(f"{path} holds no JSON objects" if text.strip() else f"{path} is empty")
    tagged = len(records) - (sum(1 for r in records if r.get(tags_key) is None))
    if tagged and without is not None:
        raise UserError(f"{path}:{without}: no {tags_key!r}, while other records have them: give every record its tags")
    return Sentences(
        path, "jsonl", words, tags if tagged else None, lines, [], records=records, keys=(words_key, tags_key)
    )


def _check_tags(sentences: Sentences) -> None:
    """Tell the scheme (BIO or plain), refuse a file mixing both, and read each I- that begins an entity as B-."""
    if sentences.tags is None:
        sentences.repaired = [[] for _ in sentences.words]
        return
    first: dict[bool, tuple[int, int, str]] = {}
    for s, tags in enumerate(sentences.tags):
        for w, tag in enumerate(tags):
            if tag in ("B-", "I-", "E-", "S-"):
                raise UserError(f"{sentences.where(s, w)}: tag {tag!r} has no entity type after its prefix")
            if tag != "O":
                first.setdefault(bool(_PREFIXED.fullmatch(tag)), (s, w, tag))
    if len(first) == 2:
        s, w, tag = first[False]
        other = first[True]
        raise UserError(
            f"{sentences.where(s, w)}: tag {tag!r} has no B-/I- prefix, but others have one "
            f"({sentences.where(*other[:2])}: {other[2]!r}): prefix every entity tag (BIO), or none (plain tags)"
        )
    sentences.scheme = "plain" if False in first else "bio"
    repaired = []
    for tags in sentences.tags:
        fixed = []
        if sentences.scheme == "bio":
            for w, tag in enumerate(tags):
                if tag.startswith("I-") and (w == 0 or tags[w - 1][2:] != tag[2:] or tags[w - 1][0] not in "BI"):
                    tags[w] = "B-" + tag[2:]
                    fixed.append(w)
        repaired.append(fixed)
    sentences.repaired = repaired


def _looks_like_conll(text: str) -> bool:
    """The first sentence lines hold 2+ columns, as many each, the last always a tag (O, B-X, I-X...)."""
    rows = []
    for line in text.splitlines():
        fields = _fields(line)
        if fields and not _is_docstart(fields):
            rows.append(fields)
            if len(rows) == _SNIFF_LINES:
                break
    return (
        bool(rows)
        and len(rows[0]) >= 2
        and all(len(r) == len(rows[0]) for r in rows)
        and all(_TAG_LIKE.fullmatch(r[-1]) for r in rows)
    )


def _sniff(path: Path) -> str:
    """The start of a file (decompressed), for detect."""
    try:
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rb") as f:
            head = f.read(1 << 16)
    except (OSError, EOFError):
        return ""
    return head.decode("utf-8-sig", errors="replace")


def _format(path: Path, options: Options) -> str:
    fmt = (options.format or "").lower()
    if fmt in ("conll", "jsonl"):
        return fmt
    if fmt:
        raise UserError(f"--format {fmt}: token classification reads conll (token and tag per line) or jsonl")
    if path.name.lower().removesuffix(".gz").endswith(_JSONL_EXTENSIONS):
        return "jsonl"
    first = next((line.strip() for line in _sniff(path).splitlines() if line.strip()), "")
    return "jsonl" if first.startswith("{") and first.endswith("}") else "conll"  # not a token "{" and its tag


# ---------------------------------------------------------------------------------------------
# Model inputs.


def windows(counts: Sequence[int], room: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    """A sentence of words of ``counts`` pieces (each at most ``room``) cut into windows of at most ``room``
    pieces, between words: ``[(first word, end word), ...]``, consecutive windows starting half a window apart;
    and, for each word, the window it is read from: the one where it has the most pieces of context on its
    poorer side (the first of equals)."""
    n = len(counts)
    cum = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    if cum[-1] <= room:
        return [(0, n)], np.zeros(n, dtype=np.int64)
    stride = max(1, room // 2)
    spans, start = [], 0
    while True:
        end = max(int(np.searchsorted(cum, cum[start] + room, side="right")) - 1, start + 1)
        spans.append((start, end))
        if end >= n:
            break
        following = int(np.searchsorted(cum, cum[start] + stride, side="left"))
        start = min(max(following, start + 1), end)  # never past the window's end: no word is skipped
    owner = np.full(n, -1, dtype=np.int64)
    best = np.full(n, -1, dtype=np.int64)
    for k, (a, b) in enumerate(spans):
        w = np.arange(a, b)
        context = np.minimum(cum[w] - cum[a], cum[b] - cum[w + 1])
        better = context > best[w]
        owner[w[better]], best[w[better]] = k, context[better]
    return spans, owner


@dataclass
class TokenRows:
    """Sentences as rows of ``[CLS] pieces [SEP]``, and where each word is read: row ``word_row[i]``, position
    ``word_pos[i]`` for word ``word_index[i]`` of sentence ``word_sentence[i]`` (every word exactly once)."""

    input_ids: list[np.ndarray]
    labels: list[np.ndarray] | None
    row_sentence: np.ndarray
    word_row: np.ndarray
    word_pos: np.ndarray
    word_sentence: np.ndarray
    word_index: np.ndarray
    pad_id: int
    lengths: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.lengths = np.array([len(ids) for ids in self.input_ids], dtype=np.int64)

    @functools.cached_property
    def mean_units(self) -> float:
        """The rows' mean labelled tokens (the training loss's divisor per row)."""
        if not self.labels:
            return 1.0
        return max(1.0, sum(int((row != IGNORE_INDEX).sum()) for row in self.labels) / len(self.labels))

    def __len__(self) -> int:
        return len(self.input_ids)

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The rows at ``indices``, padded to the longest of them (labels with IGNORE_INDEX)."""
        width = int(max(self.lengths[i] for i in indices))
        input_ids = torch.full((len(indices), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(indices), width), dtype=torch.long)
        labels = torch.full((len(indices), width), IGNORE_INDEX, dtype=torch.long)
        for row, i in enumerate(indices):
            n = len(self.input_ids[i])
            input_ids[row, :n] = torch.from_numpy(self.input_ids[i])
            attention_mask[row, :n] = 1
            if self.labels is not None:
                labels[row, :n] = torch.from_numpy(self.labels[i])
        batch = {
            "input_ids": input_ids,
            "token_type_ids": torch.zeros_like(input_ids),
            "attention_mask": attention_mask,
        }
        if self.labels is not None:
            batch["labels"] = labels
        return batch

    def word_logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """Each word's logits, [words, num_labels], in (sentence, word) order: the rows put back per word."""
        order = np.lexsort((self.word_index, self.word_sentence))
        rows, positions = (torch.from_numpy(a[order]).to(outputs.device) for a in (self.word_row, self.word_pos))
        return outputs[rows, positions].cpu()


def _encode(sentences: Sentences, tokenizer: Any, label2id: dict[str, int] | None, max_length: int) -> TokenRows:
    room = max_length - 2
    if room < 1:
        raise UserError(f"--max-seq-length {max_length} is too short: a row needs [CLS], a word piece and [SEP]")
    # Each distinct word's pieces, encoded once: a word alone goes through the same normalizer, pre-tokenizer and
    # WordPiece as in a pre-tokenized sentence (transformers' is_split_into_words), and a corpus repeats its words
    # (4,000 People's Daily sentences: 160k characters, 3k distinct; 1.5 s pre-tokenized, 0.1 s so).
    # A word the tokenizer drops whole is [UNK]; one of more pieces than a row holds keeps as many as fit (its first
    # piece is the one labelled and read).
    distinct = list(dict.fromkeys(w for words in sentences.words for w in words))
    pieces_of = {
        w: np.array(p[:room] or [tokenizer.unk_id], dtype=np.int64)
        for w, p in zip(distinct, tokenizer.encode_batch(distinct) if distinct else [])
    }
    cls, sep = np.array([tokenizer.cls_id]), np.array([tokenizer.sep_id])
    input_ids: list[np.ndarray] = []
    labels: list[np.ndarray] | None = [] if label2id is not None else None
    row_sentence: list[int] = []
    word_row, word_pos, word_sentence, word_index = [], [], [], []
    for s, words in enumerate(sentences.words):
        gold = None if labels is None else np.array([label2id[t] for t in sentences.tags[s]], dtype=np.int64)
        pieces = [pieces_of[w] for w in words]
        counts = np.array([len(p) for p in pieces], dtype=np.int64)
        spans, owner = windows(counts, room)
        for k, (a, b) in enumerate(spans):
            own = np.flatnonzero(owner[a:b] == k) + a
            positions = np.concatenate([[0], np.cumsum(counts[a:b])])[own - a] + 1
            ids = np.concatenate([cls, *pieces[a:b], sep])
            word_row.append(np.full(len(own), len(input_ids), dtype=np.int64))
            word_pos.append(positions)
            word_sentence.append(np.full(len(own), s, dtype=np.int64))
            word_index.append(own)
            row_sentence.append(s)
            input_ids.append(ids)
            if labels is not None:
                row = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
                row[positions] = gold[own]
                labels.append(row)

    def flat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    return TokenRows(
        input_ids,
        labels,
        np.array(row_sentence, dtype=np.int64),
        flat(word_row),
        flat(word_pos),
        flat(word_sentence),
        flat(word_index),
        tokenizer.pad_id,
    )


def _join(words: Sequence[str], sentence: Sequence[str]) -> str:
    """An entity's text: its words joined without spaces in a sentence tagged per character of CJK text (as
    People's Daily NER is), else with spaces."""
    chars = all(len(w) == 1 for w in sentence) and any(_cjk(w) for w in sentence)
    return ("" if chars else " ").join(words)


# ---------------------------------------------------------------------------------------------
# The task.


class TokenClassification:
    name = "token-classification"
    head = "token"
    problem_type = None
    main_metric = "f1"
    metrics = ("f1", "precision", "recall", "accuracy")
    unit = "token"

    def detect(self, path: Path, options: Options) -> str | None:
        path = Path(path)
        name = path.name.lower().removesuffix(".gz")
        if name.endswith(_CONLL_EXTENSIONS):
            return CONLL
        head = _sniff(path)
        first = next((line for line in head.splitlines() if line.strip()), "")
        if first.lstrip().startswith("{"):
            try:
                record = json.loads(first)
            except json.JSONDecodeError:
                return None
            ok = isinstance(record, dict) and all(isinstance(record.get(k), list) for k in _keys(options))
            return JSONL if ok else None
        return CONLL if _looks_like_conll(head) else None

    def read(self, path: Path, options: Options, labelled: bool = True) -> Sentences:  # tags where the file has them
        path = Path(path)
        fmt = _format(path, options)
        text = read_text(path)
        sentences = _read_jsonl(path, text, options) if fmt == "jsonl" else _read_conll(path, text)
        _check_tags(sentences)
        return sentences

    def from_texts(self, texts: list[str], options: Options) -> Sentences:
        """Each text a sentence, cut into words as BERT's basic tokenizer cuts text: at spaces and punctuation,
        and every CJK character a word of its own."""
        words = [_WORDS.findall(text) for text in texts]
        if not all(words):
            raise UserError("an empty text: there is nothing to tag")
        lines = list(range(1, len(texts) + 1))
        return Sentences(Path("(command line)"), "conll", words, None, lines, [[] for _ in texts])

    def render(self, examples: Sentences, predictions: Sequence[dict[str, Any]], fmt: str | None = None) -> bytes:
        return render(examples, predictions, fmt)

    def label_names(self, train: Sentences) -> list[str]:
        """The training data's tags, sorted, O first."""
        if train.tags is None:
            raise UserError(f"{train.path} has no tags: training needs a tag for every token")
        names = {tag for tags in train.tags for tag in tags}
        if len(names) < 2:
            raise UserError(
                f"{train.path}: every token has the tag {next(iter(names), '')!r}; a tagger needs at least two tags"
            )
        return sorted(names, key=lambda tag: (tag != "O", tag))

    def check_eval(self, examples: Sentences, names: list[str], source: str) -> None:
        if examples.tags is None:
            raise UserError(f"{examples.path} has no tags: evaluation needs a tag for every token")
        shown = ", ".join(names[:_SHOWN_TAGS]) + (", ..." if len(names) > _SHOWN_TAGS else "")
        _check_known(examples, set(names), f"{source} (tags: {shown})")

    def split(self, examples: Sentences, fraction: float, seed: int) -> tuple[Sentences, Sentences]:
        if not 0 < fraction < 1:
            raise UserError(f"--eval-split must be between 0 and 1, got {fraction}")
        held = round(fraction * len(examples))
        if not 0 < held < len(examples):
            raise UserError(
                f"{examples.path}: --eval-split {fraction} of {len(examples)} sentences holds out "
                f"{'none' if not held else 'all'}; change it or pass --eval FILE"
            )
        order = list(range(len(examples)))
        random.Random(seed).shuffle(order)
        return examples.subset(sorted(order[held:])), examples.subset(sorted(order[:held]))

    def describe(self, train: Sentences, names: list[str]) -> tuple[str, list[str]]:
        """The sentences, words and entities per type (words per tag for plain tags); warnings: rare types, and
        tags that differ only in case or punctuation. The file's own warnings are ``train.warnings()``."""
        counts = Counter(e[0] for tags in train.tags or () for e in entities(tags))
        words = sum(map(len, train.words))
        what = "words per tag" if train.scheme == "plain" else "entities"
        shown = ", ".join(f"{kind} {n:,}" for kind, n in sorted(counts.items()))
        line = f"{train.path}: {len(train):,} sentences, {words:,} words, {len(names)} tags; {what}: {shown or 'none'}"
        warnings = []
        rare = sorted(kind for kind, n in counts.items() if n < FEW_ENTITIES)
        if rare:
            warnings.append(
                f"{train.path}: {', '.join(f'{k!r} ({counts[k]})' for k in rare)}: fewer than {FEW_ENTITIES} "
                f"{'words' if train.scheme == 'plain' else 'entities'} each, too few to learn or evaluate; a typo?"
            )
        alike: dict[str, list[str]] = {}
        for name in names:
            alike.setdefault(re.sub(r"[\W_]+", "", name.casefold()), []).append(name)
        warnings += [
            f"{train.path}: tags {', '.join(map(repr, group))} differ only in case or punctuation and are "
            f"{len(group)} tags; fix the data if they mean one"
            for group in alike.values()
            if len(group) > 1
        ]
        return line, warnings

    def encode(self, examples: Sentences, tokenizer: Any, label2id: dict[str, int], options: Options) -> TokenRows:
        labelled = examples.tags is not None and bool(label2id)
        if labelled:
            _check_known(examples, set(label2id), "the model's tags")
        return _encode(examples, tokenizer, label2id if labelled else None, options.max_seq_length)

    def output_shape(self, encoded: TokenRows, num_labels: int) -> tuple[int, ...]:
        return (int(encoded.lengths.max(initial=0)), num_labels)

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        labels = batch["labels"]
        return torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )

    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return (batch["labels"] != IGNORE_INDEX).sum()

    def mean_units(self, encoded: TokenRows) -> float:
        return encoded.mean_units

    def train_sums(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        labels = batch["labels"]
        labelled = labels != IGNORE_INDEX
        return {
            "loss": self.loss(logits.detach(), batch),
            "correct": ((logits.detach().argmax(-1) == labels) & labelled).sum(),
            "units": labelled.sum(),
        }

    def evaluate(
        self, outputs: torch.Tensor, encoded: TokenRows, examples: Sentences, names: list[str]
    ) -> dict[str, Any]:
        if examples.tags is None:
            raise UserError(f"{examples.path} has no tags: evaluation needs a tag for every token")
        _check_known(examples, set(names), "the model's tags")
        logits = encoded.word_logits(outputs).double()
        predicted = _per_sentence(examples, logits.argmax(-1).numpy(), names)
        label2id = {name: i for i, name in enumerate(names)}
        gold_ids = torch.tensor([label2id[t] for tags in examples.tags for t in tags], dtype=torch.long)
        loss = torch.nn.functional.cross_entropy(logits, gold_ids, reduction="sum").item() if len(gold_ids) else 0.0
        words = len(gold_ids)
        right = sum(p == g for pred, gold in zip(predicted, examples.tags) for p, g in zip(pred, gold))
        scores = score(examples.tags, predicted)
        return {
            "loss": loss / words if words else 0.0,
            "f1": scores["f1"],
            "precision": scores["precision"],
            "recall": scores["recall"],
            "accuracy": right / words if words else 0.0,
            "examples": len(examples),
            "per_type": scores["per_type"],
        }

    def eval_line(self, metrics: dict[str, Any]) -> str:
        return " | ".join(f"{key} {metrics[key]:.4f}" for key in ("loss", *self.metrics))

    def predict(
        self, outputs: torch.Tensor, encoded: TokenRows, examples: Sentences, names: list[str], options: Options
    ) -> list[dict[str, Any]]:
        """Per sentence: its words, the tags predicted (as the model gives them), and the entities they make
        (``start``, ``end``: word indices, end exclusive)."""
        predicted = _per_sentence(examples, encoded.word_logits(outputs).argmax(-1).numpy(), names)
        results = []
        for words, tags in zip(examples.words, predicted):
            found = [
                {"text": _join(words[a:b], words), "type": kind, "start": a, "end": b} for kind, a, b in entities(tags)
            ]
            results.append({"tokens": list(words), "tags": tags, "entities": found})
        return results

    def show(self, prediction: dict[str, Any]) -> str:
        return "\t".join(f"{e['type']}:{e['text']}" for e in prediction["entities"]) or "(no entities)"


def _check_known(examples: Sentences, known: set[str], source: str) -> None:
    for s, tags in enumerate(examples.tags or ()):
        for w, tag in enumerate(tags):
            if tag not in known:
                raise UserError(f"{examples.where(s, w)}: tag {tag!r} never appears in {source}")


def _per_sentence(examples: Sentences, ids: np.ndarray, names: list[str]) -> list[list[str]]:
    """Flat per-word label ids, in (sentence, word) order, as tag names per sentence."""
    sizes = [len(words) for words in examples.words]
    if len(ids) != sum(sizes):
        raise ValueError(f"{len(ids)} word predictions for {sum(sizes)} words: outputs of other examples?")
    tags = [names[i] for i in ids.tolist()]
    ends = np.cumsum([0, *sizes])
    return [tags[a:b] for a, b in zip(ends[:-1], ends[1:])]


def render(examples: Sentences, predictions: Sequence[dict[str, Any]], fmt: str | None = None) -> bytes:
    """The predicted tags written in the input's format (or ``fmt``): CoNLL, a token and its predicted tag per
    line and a blank line after each sentence; JSONL, each input record with ``predicted_tags`` added."""
    fmt = fmt or examples.format
    if fmt == "conll":
        sep = examples.delimiter
        return "".join(
            "".join(f"{w}{sep}{t}\n" for w, t in zip(p["tokens"], p["tags"])) + "\n" for p in predictions
        ).encode("utf-8")
    if fmt == "jsonl":
        words_key, tags_key = examples.keys
        lines = []
        for i, p in enumerate(predictions):
            if examples.records is not None:
                record = dict(examples.records[i])
            else:
                record = {words_key: p["tokens"], **({tags_key: examples.tags[i]} if examples.tags else {})}
            lines.append(json.dumps({**record, "predicted_tags": p["tags"]}, ensure_ascii=False) + "\n")
        return "".join(lines).encode("utf-8")
    raise ValueError(f"unknown format {fmt!r}: conll or jsonl")


TASK = TokenClassification()
