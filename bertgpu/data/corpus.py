"""Raw text in: plain text in the original BERT sample format, and JSON Lines or Parquet records.

The format of a file comes from its name:

- **JSON Lines** (``.jsonl``, ``.ndjson``, ``.json``): one JSON object per line, one document per
  record, its text in a string field (``text_field``, default ``text``).
- **Parquet** (``.parquet``, needs pyarrow): one document per row, its text in a string column; read
  one row group at a time.
- **Plain text** (any other name): the original BERT sample format, one sentence per line and a
  blank line between documents; a new file also starts a new document.

Inside a record, a newline separates paragraphs (a blank line or a single newline alike). Each line
of a document (a plain-text line, a record's paragraph) is kept as one sentence or split into
sentences, as ``split_sentences`` says (``auto``, ``lines`` or ``none``; see ``sentences``). Unless
told otherwise, plain text keeps its lines (``lines``) and records are split (``auto``). Splitting
itself happens where the text is tokenized (``shards``), in parallel: this module only marks the
documents to split.

Inputs may be files, directories (read recursively) or globs, formats mixed; ``.gz`` and ``.zst``
(zstandard) files are decompressed on the fly. Reading streams, so memory does not grow with the
corpus. Damaged input is counted, not fatal (an error with ``strict``): bytes that are not UTF-8,
over-long lines, and records that are not JSON, not an object, or lack a string text field.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from bertgpu.data import encoding
from bertgpu.data.sentences import MODES
from bertgpu.errors import UserError, require

_SNIFF_BYTES = 8192  # a NUL byte in this many leading bytes marks a file as binary
# A line longer than this is almost surely not one sentence (a file without newlines, a data dump).
MAX_LINE_CHARS = 100_000
# A document is cut after this many characters (a long novel is ~1M). Without the cut, a corpus with no
# blank lines would be one document: held whole in memory and tokenized by one worker.
MAX_DOCUMENT_CHARS = 1_000_000
PARQUET_BATCH_ROWS = 1024  # rows converted to Python strings at a time (pyarrow reads a row group at a time)

FORMATS = ("text", "jsonl", "parquet")
_RECORD_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
# What a record can be skipped for, and how a warning describes it ({field} is the text field).
SKIP_REASONS = {
    "invalid_json": "line(s) that are not valid JSON",
    "not_an_object": "line(s) of JSON that is not an object",
    "no_text_field": "record(s) without a {field!r} field, or with a null one",
    "text_not_a_string": "record(s) whose {field!r} is not a string",
}


class Document(NamedTuple):
    """A document: its lines, each one sentence, or each a paragraph to split into sentences (``split``)."""

    lines: list[str]
    split: bool = False


def input_format(path: Path) -> tuple[str, str | None]:
    """(format, compression) of a corpus file, told by its name: ``text``/``jsonl``/``parquet``, and
    ``gzip``/``zstd``/None."""
    name = path.name.lower()
    compression = None
    for suffix, kind in _COMPRESSIONS.items():
        if name.endswith(suffix):
            name, compression = name[: -len(suffix)], kind
            break
    fmt = _RECORD_SUFFIXES.get(os.path.splitext(name)[1], "text")
    if fmt == "parquet" and compression:
        raise UserError(
            f"{path}: a compressed Parquet file; Parquet compresses inside the file, so give the .parquet file itself"
        )
    return fmt, compression


def _require(module: str, path: Path, what: str, extra: str) -> Any:
    """Import an optional dependency, or say in one line what to install."""
    return require(
        module, f"{path}: reading {what} needs the {module.split('.')[0]} package: pip install 'bertgpu[{extra}]'"
    )


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


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number", dict: "object"}.get(
        type(value), "null"
    )


class ReadTally:
    """What a read of a corpus counted: documents, lines and records read, and the damage met on the way.

    Damaged input is skipped or repaired rather than fatal, since one bad line should not stop a large
    job: undecodable bytes are replaced (``bad_lines``, first place in ``first_bad`` as ``file:line``),
    over-long lines kept (``long_lines``), bad records skipped (``skipped``, ``first_skipped``, per
    reason of ``SKIP_REASONS``); the caller warns once at the end (``warnings``); ``strict=True`` makes
    each of them a UserError. Kept apart from the reading itself (``CorpusReader``) so that the reading
    code says what happened and this class alone decides whether it is counted or fatal, and how it is told.
    """

    def __init__(self, strict: bool, text_field: str):
        self.strict = strict
        self.text_field = text_field
        self.documents_read = 0
        self.lines_read = 0
        self.records_read = 0
        self.bad_lines = 0
        self.first_bad: str | None = None
        self.first_bad_hint = ""  # the encoding the first bad line looks like, and how to convert
        self.long_lines = 0
        self.first_long: str | None = None
        self.line_number = 0  # of the line last read, in its file
        self.cut_documents = 0  # plain-text documents cut for running past MAX_DOCUMENT_CHARS
        self.first_cut: str | None = None
        self.cut_records = 0  # records cut likewise
        self.first_cut_record: str | None = None
        self.skipped = dict.fromkeys(SKIP_REASONS, 0)
        self.first_skipped: dict[str, str] = {}

    @property
    def warnings(self) -> list[str]:
        """One-line warnings about what was read: replaced bytes, long lines, cut documents, skipped records."""
        out = []
        if self.bad_lines:
            out.append(
                f"{self.bad_lines:,} line(s) were not valid UTF-8 and had bytes replaced by U+FFFD "
                f"(first at {self.first_bad}; {self.first_bad_hint})"
            )
        if self.long_lines:
            out.append(
                f"{self.long_lines:,} line(s) are longer than {MAX_LINE_CHARS:,} characters (first at "
                f"{self.first_long}), each kept as one sentence, one sentence per line; pretraining uses only "
                "the first tokens of a sentence that long (--split-sentences auto splits lines into sentences)"
            )
        if self.cut_documents:
            out.append(
                f"{self.cut_documents:,} document(s) ran past {MAX_DOCUMENT_CHARS:,} characters without a "
                f"blank line and were cut into documents of that size (first cut at {self.first_cut}); "
                "the format puts a blank line between documents"
            )
        if self.cut_records:
            out.append(
                f"{self.cut_records:,} record(s) ran past {MAX_DOCUMENT_CHARS:,} characters and were cut "
                f"into documents of that size, at paragraph ends (first at {self.first_cut_record})"
            )
        for reason, count in self.skipped.items():
            if count:
                what = SKIP_REASONS[reason].format(field=self.text_field)
                out.append(f"skipped {count:,} {what} (first: {self.first_skipped[reason]})")
        return out

    def _bad_bytes(self, path: Path, number: int, data: bytes, error: UnicodeDecodeError) -> None:
        if self.strict:
            raise UserError(
                f"{path}:{number}: not valid UTF-8 (byte 0x{data[error.start]:02x} at column "
                f"{error.start + 1}); {encoding.not_utf8(data, error.start, path)}"
            ) from None
        self.bad_lines += 1
        if self.first_bad is None:
            self.first_bad = f"{path}:{number}"
            self.first_bad_hint = encoding.not_utf8(data, error.start, path)

    def _long_line(self, place: str, length: int, what: str) -> None:
        if self.strict:
            raise UserError(
                f"{place}: a {what} of {length:,} characters, kept as one sentence (--split-sentences "
                "auto splits it into sentences; without --strict it is kept with a warning)"
            )
        self.long_lines += 1
        if self.first_long is None:
            self.first_long = place

    def _skip(self, reason: str, place: str, detail: str) -> None:
        if self.strict:
            raise UserError(f"{place}: {detail} (without --strict such records are skipped with a warning)")
        self.skipped[reason] += 1
        self.first_skipped.setdefault(reason, f"{place}: {detail}")


@contextmanager
def _open(path: Path, compression: str | None) -> Iterator[tuple[BinaryIO, Callable[[], int]]]:
    """The file's decompressed bytes, and a function that tells the compressed position read so far."""
    with open(path, "rb") as raw:
        if compression == "gzip":
            stream: BinaryIO = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
        elif compression == "zstd":
            import zstandard

            stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True))
        else:
            stream = raw
        yield stream, raw.tell


def _refuse_non_utf8(path: Path, head: bytes, what: str) -> None:
    """A UserError for a file whose first bytes show it is UTF-16/32 or binary, not UTF-8 ``what``."""
    wide = encoding.wide_bom(head)
    name = wide[1] if wide else encoding.wide_without_bom(head) if b"\0" in head else None
    if name:  # read line by line as bytes, UTF-16 and UTF-32 would be split inside characters
        raise UserError(
            f"{path}: {name} text{'' if wide else ' without a byte-order mark'}, not UTF-8; "
            f"{encoding.convert_hint(path, name)}"
        )
    if b"\0" in head:
        raise UserError(f"{path}: is a binary file (NUL bytes), not UTF-8 {what}")


def _json_record_text(line: str, field: str) -> tuple[str | None, str, str]:
    """(text, "", "") of a JSON Lines record, or (None, reason, detail) of one to skip (``SKIP_REASONS``)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return None, "invalid_json", f"not valid JSON ({e.msg}: column {e.colno})"
    if not isinstance(record, dict):
        return None, "not_an_object", f"a JSON {_json_type(record)}, not an object with a {field!r} field"
    text = record.get(field)
    if isinstance(text, str):
        return text, "", ""
    if text is None:
        fields = ", ".join(map(repr, list(record)[:10])) or "none"
        return (
            None,
            "no_text_field",
            f"{field!r} is null" if field in record else f"no {field!r} field (fields: {fields})",
        )
    return None, "text_not_a_string", f"{field!r} is a JSON {_json_type(text)}, not a string"


def _check_parquet_column(pa: Any, schema: Any, path: Path, field: str) -> None:
    """A UserError unless ``schema`` has a text (string) column ``field``."""
    if field not in schema.names:
        raise UserError(
            f"{path}: no column {field!r} (columns: {', '.join(schema.names)}); name the text column with --text-field"
        )
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or getattr(pa.types, "is_string_view", lambda _: False)(kind)
    ):
        raise UserError(f"{path}: column {field!r} holds {kind}, not text; name the text column with --text-field")


class CorpusReader(ReadTally):
    """Streams documents (or lines) from corpus files of any accepted format and counts what it read
    (``ReadTally``: the counts, the damage and its warnings). ``bytes_read`` against ``total_bytes`` drives
    a progress bar; for compressed files both count compressed bytes.
    """

    def __init__(
        self, paths: Iterable[Path], strict: bool = False, text_field: str = "text", split_sentences: str | None = None
    ):
        self.paths = [Path(p) for p in paths]
        if not text_field:
            raise UserError("the text field name is empty (--text-field)")
        if split_sentences is not None and split_sentences not in MODES:
            raise UserError(f"unknown sentence splitting {split_sentences!r} (choose from {', '.join(MODES)})")
        super().__init__(strict, text_field)
        self.split_sentences = split_sentences
        self.formats = [input_format(p) for p in self.paths]
        for path, (fmt, compression) in zip(self.paths, self.formats):  # a missing library fails before any work
            if fmt == "parquet":
                _require("pyarrow.parquet", path, "Parquet", "parquet")
            if compression == "zstd":
                _require("zstandard", path, ".zst files", "zstd")
        self.total_bytes = sum(p.stat().st_size for p in self.paths)
        self._done_bytes = 0
        self._position: Callable[[], int] | None = None  # input bytes consumed in the file being read

    def split_mode(self, fmt: str) -> str:
        """How lines of files of this format become sentences: ``auto``, ``lines`` or ``none``."""
        return self.split_sentences or ("lines" if fmt == "text" else "auto")

    @property
    def split_modes(self) -> dict[str, str]:
        """The splitting used for each input format present, e.g. ``{"jsonl": "auto", "text": "lines"}``."""
        return {fmt: self.split_mode(fmt) for fmt in sorted({fmt for fmt, _ in self.formats})}

    @property
    def bytes_read(self) -> int:
        """Bytes of input consumed so far (compressed bytes for compressed files)."""
        position = self._position
        return self._done_bytes + (position() if position is not None else 0)

    def documents(self) -> Iterator[Document]:
        """Yield each document with its stripped, non-empty lines (cut every ``MAX_DOCUMENT_CHARS``)."""
        for path, (fmt, compression) in zip(self.paths, self.formats):
            split = self.split_mode(fmt) == "auto"
            if fmt == "text":
                yield from self._text_documents(path, compression, split)
            else:
                yield from self._record_documents(path, fmt, compression, split)

    def lines(self) -> Iterator[str]:
        """Yield every non-empty stripped line (of plain text, or of a record's text), ignoring documents.

        For vocabulary training, which needs words, not sentences.
        """
        for path, (fmt, compression) in zip(self.paths, self.formats):
            if fmt == "text":
                yield from filter(None, self._file_lines(path, compression, check_long=True))
            else:
                for _, text in self._records(path, fmt, compression):
                    yield from filter(None, map(str.strip, text.splitlines()))

    # ---- plain text ----

    def _text_documents(self, path: Path, compression: str | None, split: bool) -> Iterator[Document]:
        document: list[str] = []
        chars = 0
        cut = False  # has the document being read been cut already?
        for line in self._file_lines(path, compression, check_long=not split):
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
            yield Document(document, split)
            document, chars = [], 0
        if document:
            self.documents_read += 1
            yield Document(document, split)

    def _file_lines(self, path: Path, compression: str | None, check_long: bool) -> Iterator[str]:
        """Stripped lines of one plain-text file, blank ones included (they separate documents)."""
        for number, line in self._decoded_lines(path, compression, "text with one sentence per line"):
            if check_long and len(line) > MAX_LINE_CHARS:
                self._long_line(f"{path}:{number}", len(line), "line")
            yield line.strip()

    def _decoded_lines(self, path: Path, compression: str | None, what: str) -> Iterator[tuple[int, str]]:
        """(line number, line) of a text file, UTF-8 decoded (undecodable bytes replaced and counted)."""
        errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)
        if compression == "zstd":
            import zstandard

            errors += (zstandard.ZstdError,)
        try:
            with _open(path, compression) as (stream, position):
                self._position = position
                try:
                    _refuse_non_utf8(path, stream.peek(_SNIFF_BYTES)[:_SNIFF_BYTES], what)  # type: ignore[attr-defined]
                    for number, data in enumerate(stream, start=1):
                        if number == 1:
                            data = data.removeprefix(encoding.UTF8_BOM)
                        try:
                            line = data.decode("utf-8")
                        except UnicodeDecodeError as e:
                            self._bad_bytes(path, number, data, e)
                            line = data.decode("utf-8", errors="replace")
                        self.lines_read += 1
                        self.line_number = number
                        yield number, line
                finally:
                    self._position = None
        except errors as e:  # unreadable, or a corrupt or truncated compressed file
            raise UserError(f"{path}: cannot be read: {e}") from None
        self._done_bytes += path.stat().st_size

    # ---- records: JSON Lines and Parquet ----

    def _record_documents(self, path: Path, fmt: str, compression: str | None, split: bool) -> Iterator[Document]:
        """One document per record: its paragraphs (non-empty lines), cut at a paragraph end every
        ``MAX_DOCUMENT_CHARS`` characters; a record without text gives none."""
        for number, text in self._records(path, fmt, compression):
            paragraphs: list[str] = []
            chars = 0
            cut = False
            for paragraph in text.splitlines():
                paragraph = paragraph.strip()
                if not paragraph:
                    continue
                if chars >= MAX_DOCUMENT_CHARS:  # the document is full and more text follows: cut here
                    if not cut:
                        self.cut_records += 1
                        if self.first_cut_record is None:
                            self.first_cut_record = self._place(path, fmt, number)
                    cut = True
                    self.documents_read += 1
                    yield Document(paragraphs, split)
                    paragraphs, chars = [], 0
                if not split and len(paragraph) > MAX_LINE_CHARS:
                    self._long_line(self._place(path, fmt, number), len(paragraph), "paragraph")
                paragraphs.append(paragraph)
                chars += len(paragraph)
            if paragraphs:
                self.documents_read += 1
                yield Document(paragraphs, split)

    @staticmethod
    def _place(path: Path, fmt: str, number: int) -> str:
        """Where a record is: ``file:line`` for JSON Lines, ``file, row N`` (from 0) for Parquet."""
        return f"{path}, row {number}" if fmt == "parquet" else f"{path}:{number}"

    def _records(self, path: Path, fmt: str, compression: str | None) -> Iterator[tuple[int, str]]:
        """(line or row number, text) of the usable records of a file; the others are counted and skipped."""
        return self._parquet_records(path) if fmt == "parquet" else self._jsonl_records(path, compression)

    def _jsonl_records(self, path: Path, compression: str | None) -> Iterator[tuple[int, str]]:
        for number, line in self._decoded_lines(path, compression, "JSON Lines"):
            line = line.rstrip("\r\n")
            if number == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark
            if not line.strip():
                continue
            self.records_read += 1
            text, reason, detail = _json_record_text(line, self.text_field)
            if text is None:
                self._skip(reason, f"{path}:{number}", detail)
            else:
                yield number, text

    def _parquet_records(self, path: Path) -> Iterator[tuple[int, str]]:
        pa = _require("pyarrow", path, "Parquet", "parquet")
        pq = _require("pyarrow.parquet", path, "Parquet", "parquet")
        errors = (OSError, ValueError, pa.ArrowException)
        field = self.text_field
        try:
            parquet = pq.ParquetFile(path)
        except errors as e:
            raise UserError(f"{path}: cannot be read as Parquet: {e}") from None
        with parquet:
            _check_parquet_column(pa, parquet.schema_arrow, path, field)
            size = path.stat().st_size
            rows = max(1, parquet.metadata.num_rows)
            row = 0
            self._position = lambda: size * row // rows
            try:
                for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[field], use_threads=False):
                    for text in batch.column(0).to_pylist():
                        self.records_read += 1
                        if text is None:
                            self._skip("no_text_field", f"{path}, row {row}", f"{field!r} is null")
                        else:
                            yield row, text
                        row += 1
            except errors as e:
                raise UserError(f"{path}: cannot be read as Parquet: {e}") from None
            finally:
                self._position = None
        self._done_bytes += size
