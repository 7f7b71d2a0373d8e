"""Paragraphs into sentences (``prepare --split-sentences auto``).

Two rules, applied in this order to each paragraph:

- **Chinese and Japanese**: a sentence ends after a run of 。！？ (or the half-width ｡, or ASCII ! and ?
  right after a CJK character) and the closing quotes and brackets that follow it (” ’ 」 』 ） 】 〕 〉 》
  " ' and )). These marks end a sentence wherever they stand, so no library is needed.
- **Latin-script text** (any text that puts a space after a full stop, ! or ?): Wikimedia's
  ``sentencex`` (Rust), with its English rules: abbreviations (Dr., U.S., e.g.), initials and
  numbers do not end a sentence, and it does not split inside quotes or parentheses. A piece without
  a full stop, ! or ? followed by a space is not handed to it: nothing there ends a sentence, and
  CJK text keeps its full-width decimal point (１１０．８) whole. BENCHMARKS.md compares it with other
  splitters on speed and on real sentences checked by eye.

Two repairs on top: a "sentence" that is only a list marker ("2." split off "2. Run the tests.") is
joined to the sentence after it, and one that is only closing quotes or brackets to the sentence
before it. The result depends on the paragraph alone, so prepared shards are the same for any
number of workers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from bertgpu.errors import require

MODES = ("auto", "lines", "none")
LANGUAGE = "en"  # sentencex's rules for Latin-script text (its abbreviation lists are per language)

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"  # kana, CJK ideographs, half-width kana
_CLOSERS = "”’」』）】〕〉》\"')"
_CJK_END = re.compile(rf"(?:[。！？｡]+|(?<=[{_CJK}])[!?]+)[{_CLOSERS}]*")
_CJK_ANY = re.compile(rf"[{_CJK}。！？｡]")  # without any of these, _CJK_END cannot match: one fast scan instead
_LATIN_CANDIDATE = re.compile(r"[.!?…][\"'”’)\]]*\s")
_LIST_MARKER = re.compile(r"\(?(?:\d{1,3}|[A-Za-z]|[ivxlcIVXLC]{2,6})[.)]")
_CLOSERS_ONLY = re.compile(rf"[{_CLOSERS}\]」』]+")
_SHORTEST_SENTENCE = 8  # a list marker or a run of closers is no longer than this

_segment: Callable[[str, str], list[str]] | None = None  # sentencex.segment, imported once per process


def splitter_name() -> str:
    """The library and version that ``auto`` uses for Latin-script text (recorded in meta.json)."""
    try:
        return f"sentencex {version('sentencex')} ({LANGUAGE})"
    except PackageNotFoundError:
        return "sentencex (not installed)"


def check_available() -> None:
    """Raise a UserError saying what to install if ``auto`` cannot split Latin-script text here."""
    _splitter()


def _splitter() -> Callable[[str, str], list[str]]:
    global _segment
    if _segment is None:
        _segment = require(
            "sentencex",
            "--split-sentences auto needs the sentencex package (pip install "
            "sentencex); or keep paragraphs whole with --split-sentences none",
        ).segment
    return _segment


def split_paragraph(paragraph: str) -> list[str]:
    """The sentences of one paragraph (a line of text), stripped, empty ones dropped."""
    sentences: list[str] = []
    for piece in _split_cjk(paragraph) if _CJK_ANY.search(paragraph) else (paragraph,):
        if _LATIN_CANDIDATE.search(piece):
            sentences.extend(_splitter()(LANGUAGE, piece))
        else:
            sentences.append(piece)
    sentences = [s for s in map(str.strip, sentences) if s]
    if any(len(s) <= _SHORTEST_SENTENCE for s in sentences):
        sentences = _repair(sentences)
    return sentences


def split_paragraphs(paragraphs: list[str]) -> list[str]:
    """The sentences of a document's paragraphs, in order."""
    return [s for p in paragraphs for s in split_paragraph(p)]


def _split_cjk(text: str) -> list[str]:
    pieces, start = [], 0
    for match in _CJK_END.finditer(text):
        pieces.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _repair(sentences: list[str]) -> list[str]:
    """Join a list marker to the sentence after it, and closing quotes or brackets to the sentence before."""
    out: list[str] = []
    marker = None
    for s in sentences:
        if marker is not None:
            s = f"{marker} {s}"
            marker = None
        if _LIST_MARKER.fullmatch(s):
            marker = s
        elif out and _CLOSERS_ONLY.fullmatch(s):
            out[-1] += s
        else:
            out.append(s)
    if marker is not None:
        out.append(marker)
    return out
