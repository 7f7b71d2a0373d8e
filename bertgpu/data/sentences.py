"""Paragraphs into sentences (``prepare --split-sentences auto``).

Two rules, applied in this order to each paragraph:

- **Chinese and Japanese**: a sentence ends after a run of 。！？ (or the half-width ｡, or ASCII ! and ?
  right after a CJK character) and the closing quotes and brackets that follow it (” ’ 」 』 ） 】 〕 〉 》
  " ' and )). These marks end a sentence wherever they stand, so no library is needed.
- **Latin-script text** (and any other text that puts spaces between sentences): the Punkt algorithm as
  ``nupunkt`` implements it, with its bundled English model: abbreviations (e.g., Dr., U.S., cf.),
  initials, numbers and ellipses do not end a sentence; quotes and parentheses after a full stop stay
  with its sentence. BENCHMARKS.md compares it with other splitters on speed and on real sentences.
  A piece without a full stop, ! or ? followed by a space is not handed to it: it cannot be split.

One repair on top: a "sentence" that is only a list marker ("2." split off "2. Run the tests.") is
joined to the sentence after it. The result depends on the paragraph alone (never on what was split
before it), so prepared shards are the same for any number of workers.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

from ..errors import UserError

MODES = ("auto", "lines", "none")

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"  # kana, CJK ideographs, half-width kana
_CLOSERS = "”’」』）】〕〉》\"')"
_CJK_END = re.compile(rf"(?:[。！？｡]+|(?<=[{_CJK}])[!?]+)[{_CLOSERS}]*")
# Punkt splits only where a full stop, ! or ? (maybe with closing quotes or brackets) meets a space.
_LATIN_CANDIDATE = re.compile(r"[.!?…][\"'”’)\]]*\s")
_LIST_MARKER = re.compile(r"\(?(?:\d{1,3}|[A-Za-z]|[ivxlcIVXLC]{2,6})[.)]")

_punkt = None  # nupunkt's sentence tokenizer, loaded once per process


def splitter_name() -> str:
    """The library and version that ``auto`` uses for Latin-script text (recorded in meta.json)."""
    try:
        return f"nupunkt {version('nupunkt')}"
    except PackageNotFoundError:
        return "nupunkt (not installed)"


def check_available() -> None:
    """Raise a UserError saying what to install if ``auto`` cannot split Latin-script text here."""
    _tokenizer()


def _tokenizer():
    global _punkt
    if _punkt is None:
        try:
            import nupunkt
        except ImportError:
            raise UserError(
                "--split-sentences auto needs the nupunkt package, which needs Python 3.11 or later "
                "(pip install nupunkt); or keep paragraphs whole with --split-sentences none"
            ) from None
        _punkt = nupunkt.load("default")
    return _punkt


def split_paragraph(paragraph: str) -> list[str]:
    """The sentences of one paragraph (a line of text), stripped, empty ones dropped."""
    sentences: list[str] = []
    for piece in _split_cjk(paragraph):
        if _LATIN_CANDIDATE.search(piece):
            sentences.extend(s.strip() for s in _tokenizer().tokenize(piece))
        else:
            sentences.append(piece.strip())
    return _join_list_markers([s for s in sentences if s])


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


def _join_list_markers(sentences: list[str]) -> list[str]:
    out: list[str] = []
    marker = None
    for s in sentences:
        if marker is not None:
            s = f"{marker} {s}"
            marker = None
        if _LIST_MARKER.fullmatch(s):
            marker = s
            continue
        out.append(s)
    if marker is not None:
        out.append(marker)
    return out
