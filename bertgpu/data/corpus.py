"""Raw text in the original BERT sample format: one sentence per line, a blank line between documents.

A new file also starts a new document. Inputs may be files, directories (read recursively) or globs;
``.gz`` files are decompressed on the fly. Reading streams, so memory does not grow with the corpus.
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import UserError

_SNIFF_BYTES = 8192  # a NUL byte in this many leading bytes marks a file as binary
# A line longer than this is almost surely not one sentence (a file without newlines, a data dump).
MAX_LINE_CHARS = 100_000
# A document is cut after this many characters (a long novel is ~1M). Without the cut, a corpus with no
# blank lines would be one document: held whole in memory and tokenized by one worker.
MAX_DOCUMENT_CHARS = 1_000_000


def resolve_inputs(patterns: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files, directories (recursively, hidden entries skipped) and globs into a sorted file list.

    Each pattern must match something, so that a typo is an error rather than a silently smaller corpus.
    A file named twice is read once.
    """
    files: list[Path] = []
    for pattern in patterns:
        text = os.path.expanduser(str(pattern))
        path = Path(text)
        if path.is_file():
            matched = [path]
        elif path.is_dir():
            matched = _files_below(path)
            if not matched:
                raise UserError(f"{text}: directory contains no files")
        else:
            matched = []
            for hit in sorted(glob.glob(text, recursive=True)):
                hit_path = Path(hit)
                matched.extend(_files_below(hit_path) if hit_path.is_dir() else [hit_path])
            if not matched:
                raise UserError(f"{text}: no such file or directory, and no file matches it as a glob")
        files.extend(matched)
    if not files:
        raise UserError("no input files given")
    return list(dict.fromkeys(files))


def _files_below(directory: Path) -> list[Path]:
    """Regular files under ``directory``, recursively and sorted, skipping hidden files and folders."""
    found = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(Path(root, n) for n in names if not n.startswith(".") and Path(root, n).is_file())
    return sorted(found)


class CorpusReader:
    """Streams documents (or lines) from corpus files and counts what it read.

    Undecodable bytes are replaced rather than fatal, since one bad byte should not stop a large job;
    they are counted in ``bad_lines`` with the first place in ``first_bad`` (``file:line``) so the
    caller can warn once at the end (``warnings``); ``strict=True`` makes them a UserError.
    ``bytes_read`` against ``total_bytes`` drives a progress bar; for ``.gz`` files both count
    compressed bytes.
    """

    def __init__(self, paths: Iterable[Path], strict: bool = False):
        self.paths = [Path(p) for p in paths]
        self.strict = strict
        self.total_bytes = sum(p.stat().st_size for p in self.paths)
        self.documents_read = 0
        self.lines_read = 0
        self.bad_lines = 0
        self.first_bad: str | None = None
        self.long_lines = 0
        self.first_long: str | None = None
        self.line_number = 0  # of the line last read, in its file
        self.cut_documents = 0
        self.first_cut: str | None = None
        self._done_bytes = 0
        self._raw: BinaryIO | None = None

    @property
    def bytes_read(self) -> int:
        """Bytes of input consumed so far (compressed bytes for ``.gz`` files)."""
        raw = self._raw
        return self._done_bytes + (raw.tell() if raw is not None and not raw.closed else 0)

    @property
    def warnings(self) -> list[str]:
        """One-line warnings about what was read: replaced non-UTF-8 bytes, suspiciously long lines."""
        out = []
        if self.bad_lines:
            out.append(f"{self.bad_lines:,} line(s) were not valid UTF-8 and had bytes replaced by U+FFFD "
                       f"(first at {self.first_bad})")
        if self.long_lines:
            out.append(f"{self.long_lines:,} line(s) are longer than {MAX_LINE_CHARS:,} characters (first at "
                       f"{self.first_long}); the format is one sentence per line, and pretraining uses only the "
                       "first tokens of a sentence that long")
        if self.cut_documents:
            out.append(f"{self.cut_documents:,} document(s) ran past {MAX_DOCUMENT_CHARS:,} characters without a "
                       f"blank line and were cut into documents of that size (first cut at {self.first_cut}); "
                       "the format puts a blank line between documents")
        return out

    def documents(self) -> Iterator[list[str]]:
        """Yield each document as its list of stripped, non-empty lines (cut every ``MAX_DOCUMENT_CHARS``)."""
        for path in self.paths:
            document: list[str] = []
            chars = 0
            cut = False  # has the document being read been cut already?
            for line in self._file_lines(path):
                if not line:
                    cut = False
                    if not document:
                        continue
                else:
                    document.append(line)
                    chars += len(line)
                    if chars < MAX_DOCUMENT_CHARS:
                        continue
                    if not cut:
                        self.cut_documents += 1
                        if self.first_cut is None:
                            self.first_cut = f"{path}:{self.line_number}"
                    cut = True
                self.documents_read += 1
                yield document
                document, chars = [], 0
            if document:
                self.documents_read += 1
                yield document

    def lines(self) -> Iterator[str]:
        """Yield every non-empty stripped line, ignoring document boundaries (for vocabulary training)."""
        for path in self.paths:
            yield from filter(None, self._file_lines(path))

    def _file_lines(self, path: Path) -> Iterator[str]:
        """Stripped lines of one file, blank ones included (they separate documents)."""
        try:
            with open(path, "rb") as raw:
                stream: BinaryIO = gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw  # type: ignore
                if b"\0" in stream.read(_SNIFF_BYTES):
                    raise UserError(f"{path}: is a binary file (NUL bytes), not UTF-8 text with one sentence per line")
                stream.seek(0)
                self._raw = raw
                for number, data in enumerate(stream, start=1):
                    try:
                        line = data.decode("utf-8")
                    except UnicodeDecodeError as e:
                        if self.strict:
                            raise UserError(
                                f"{path}:{number}: not valid UTF-8 (byte 0x{data[e.start]:02x} at column {e.start + 1})"
                            ) from None
                        line = data.decode("utf-8", errors="replace")
                        self.bad_lines += 1
                        if self.first_bad is None:
                            self.first_bad = f"{path}:{number}"
                    if len(line) > MAX_LINE_CHARS:
                        if self.strict:
                            raise UserError(f"{path}:{number}: a line of {len(line):,} characters; the format is one "
                                            "sentence per line (drop --strict to keep it with a warning)")
                        self.long_lines += 1
                        if self.first_long is None:
                            self.first_long = f"{path}:{number}"
                    self.lines_read += 1
                    self.line_number = number
                    yield line.strip()
        except (OSError, EOFError, zlib.error) as e:  # unreadable, or a corrupt or truncated .gz
            raise UserError(f"{path}: cannot be read: {e}") from None
        finally:
            self._raw = None
        self._done_bytes += path.stat().st_size
