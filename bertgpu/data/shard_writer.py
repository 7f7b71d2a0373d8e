"""``bertgpu prepare``: a corpus tokenized into the memory-mapped shards that ``shards`` reads.

Text is read as a stream (``corpus.CorpusReader``), cut into work items of whole documents,
tokenized by a pool of processes and written in input order, so the output is the same for any
number of workers; the directory is built under a temporary name and appears whole
(``atomic.commit``). The layout is described in ``shards``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bertgpu import atomic
from bertgpu.config import PrepareConfig
from bertgpu.data import sentences, words
from bertgpu.data.corpus import CorpusReader, Document, resolve_inputs
from bertgpu.data.shards import FORMAT, MAX_UNK_SHARE, VERSION, token_dtype
from bertgpu.data.tokenizer import Tokenizer, fragmentation_warning
from bertgpu.errors import UserError
from bertgpu.paths import refuse_clobbering

CHUNK_CHARS = 2 * 2**20  # text per work item: large enough to amortize pickling, small enough to stream
MIN_CHUNK_CHARS = 64 * 2**10  # the smallest work item, at the end of the input (see _tokenized_chunks)
ENCODE_LINES = 1000  # sentences per encode_batch call inside a work item (see _tokenize_chunk)

# (tokens, word starts or None, sentence lengths, sentences per document) of one chunk of documents
Chunk = tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]


def _tokenize_chunk(tokenizer: Tokenizer, chunk: list[Document], zh_wwm: bool = False) -> Chunk:
    """Split the documents marked for it into sentences, tokenize them whole, and drop sentences (then
    documents) left without tokens. With ``zh_wwm``, also mark the tokens that start a word (``words``).

    The sentences go to ``encode_batch`` ``ENCODE_LINES`` at a time and each batch's ids become one
    numpy array at once: the per-token objects ``tokenizers`` returns (an ``Encoding`` with its token
    strings and offsets, a Python int per id) then live for one small batch, not the whole chunk,
    which keeps a worker's memory small and the tokenizer faster (its working set stays in cache).
    """
    documents = [sentences.split_paragraphs(d.lines) if d.split else d.lines for d in chunk]
    texts = list(chain.from_iterable(documents))
    dtype = token_dtype(tokenizer.vocab_size)
    parts: list[np.ndarray] = []
    start_parts: list[np.ndarray] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for start in range(0, len(texts), ENCODE_LINES):
        batch = texts[start : start + ENCODE_LINES]
        if zh_wwm:
            ids, starts = words.encode(tokenizer, batch)
            start_parts.append(starts)
        else:
            ids = tokenizer.encode_batch(batch)
        batch_lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        lengths[start : start + len(ids)] = batch_lengths
        parts.append(np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(batch_lengths.sum())))
    tokens = np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
    starts = (np.concatenate(start_parts) if start_parts else np.empty(0, dtype=bool)) if zh_wwm else None
    kept = lengths > 0
    doc_of_sentence = np.repeat(np.arange(len(documents)), [len(d) for d in documents])
    per_document = np.bincount(doc_of_sentence[kept], minlength=len(documents))
    return tokens, starts, lengths[kept].astype(np.int32), per_document[per_document > 0].astype(np.int32)


_worker_tokenizer: Tokenizer | None = None
_worker_zh_wwm = False


def _init_worker(tokenizer: Tokenizer, zh_wwm: bool = False) -> None:
    """Runs once per worker process: one single-threaded tokenizer; Ctrl-C is the parent's to handle."""
    global _worker_tokenizer, _worker_zh_wwm
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_tokenizer, _worker_zh_wwm = tokenizer, zh_wwm
    _ = tokenizer.backend  # build it now, not inside the first chunk
    if zh_wwm:
        words.segment("预热")  # load jieba's dictionary now too


def _tokenize_in_worker(chunk: list[Document]) -> Chunk:
    assert _worker_tokenizer is not None, "worker not initialized"
    return _tokenize_chunk(_worker_tokenizer, chunk, _worker_zh_wwm)


def _chunks(documents: Iterator[Document], chunk_chars: Callable[[], int]) -> Iterator[list[Document]]:
    """Group documents into work items of about ``chunk_chars()`` characters of text (asked anew for each item)."""
    chunk: list[Document] = []
    size = 0
    limit = chunk_chars()
    for document in documents:
        chunk.append(document)
        size += sum(map(len, document.lines))
        if size >= limit:
            yield chunk
            chunk, size = [], 0
            limit = chunk_chars()
    if chunk:
        yield chunk


def _tokenized_chunks(
    reader: CorpusReader, tokenizer: Tokenizer, workers: int, zh_wwm: bool = False
) -> Iterator[Chunk]:
    """Tokenized chunks in input order, on ``workers`` processes (in this one for ``workers=1``).

    At most ``2 * workers`` chunks are in flight, so memory stays flat however large the corpus.
    Chunks are ``CHUNK_CHARS`` of text until the input left to read is under ``2 * workers`` of
    them, then shrink with it (down to ``MIN_CHUNK_CHARS``), so that the workers finish close
    together instead of one tokenizing the last big chunk alone, and a small corpus is shared by all
    workers. The output does not depend on where chunks end.
    """
    if workers == 1:
        for chunk in _chunks(reader.documents(), lambda: CHUNK_CHARS):
            yield _tokenize_chunk(tokenizer, chunk, zh_wwm)
        return

    def chunk_chars() -> int:
        left = reader.total_bytes - reader.bytes_read
        return min(CHUNK_CHARS, max(MIN_CHUNK_CHARS, left // (2 * workers)))

    chunks = _chunks(reader.documents(), chunk_chars)
    pool = ProcessPoolExecutor(
        workers, mp_context=get_context("spawn"), initializer=_init_worker, initargs=(tokenizer, zh_wwm)
    )
    pending: deque[Future[Chunk]] = deque()
    try:
        for chunk in chunks:
            pending.append(pool.submit(_tokenize_in_worker, chunk))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _ShardWriter:
    """Appends tokenized documents to shard files, starting a new shard when the next document would overflow."""

    def __init__(self, directory: Path, shard_tokens: int, word_starts: bool = False, unk_id: int = -1):
        self.directory = directory
        self.unk_id = unk_id
        self.unknown = 0  # [UNK] tokens: many of them mean a vocab made for other text
        self.shard_tokens = shard_tokens
        self.word_starts = word_starts  # write .words files (chunks then carry word starts)
        self.shards: list[dict] = []
        self.single_sentence_documents = 0  # too short for next-sentence prediction
        self.words = 0  # tokens that start a word (with word_starts)
        self._files: tuple | None = None
        self._bits = np.empty(0, dtype=bool)  # word starts not yet written: fewer than 8

    def add(self, chunk: Chunk) -> None:
        tokens, starts, sentence_lengths, per_document = chunk
        if not len(per_document):
            return
        self.single_sentence_documents += int(np.count_nonzero(per_document == 1))
        self.unknown += int(np.count_nonzero(tokens == self.unk_id))
        doc_tokens = np.add.reduceat(sentence_lengths.astype(np.int64), np.cumsum(per_document) - per_document)
        doc_ends = np.cumsum(doc_tokens)
        first_doc = first_sentence = first_token = 0
        while first_doc < len(per_document):
            if self._files is None:
                self._open_next()
            filled = self.shards[-1]["tokens"]
            fits = int(np.searchsorted(doc_ends[first_doc:] - first_token, self.shard_tokens - filled, side="right"))
            if not fits:
                if filled:
                    self._open_next()
                    continue
                fits = 1  # a document longer than a shard gets a shard of its own
            last_doc = first_doc + fits
            last_sentence = first_sentence + int(per_document[first_doc:last_doc].sum())
            last_token = int(doc_ends[last_doc - 1])
            self._append(
                tokens[first_token:last_token],
                None if starts is None else starts[first_token:last_token],
                sentence_lengths[first_sentence:last_sentence],
                per_document[first_doc:last_doc],
            )
            first_doc, first_sentence, first_token = last_doc, last_sentence, last_token

    def _append(
        self, tokens: np.ndarray, starts: np.ndarray | None, sentence_lengths: np.ndarray, per_document: np.ndarray
    ) -> None:
        shard = self.shards[-1]
        tokens_file, sentences_file, documents_file = self._files[:3]
        tokens_file.write(tokens.tobytes())
        if self.word_starts:
            assert starts is not None and len(starts) == len(tokens), "word starts must come with every token"
            bits = np.concatenate([self._bits, starts])
            whole = len(bits) - len(bits) % 8
            self._files[3].write(np.packbits(bits[:whole], bitorder="little").tobytes())
            self._bits = bits[whole:]
            self.words += int(np.count_nonzero(starts))
        sentences_file.write((shard["tokens"] + np.cumsum(sentence_lengths, dtype=np.int64)).tobytes())
        documents_file.write((shard["sentences"] + np.cumsum(per_document, dtype=np.int64)).tobytes())
        shard["documents"] += len(per_document)
        shard["sentences"] += len(sentence_lengths)
        shard["tokens"] += len(tokens)

    def _open_next(self) -> None:
        self.close()
        name = f"shard-{len(self.shards):05d}"
        self.shards.append({"name": name, "documents": 0, "sentences": 0, "tokens": 0})
        kinds = ("tokens", "sentences", "documents") + (("words",) if self.word_starts else ())
        self._files = tuple(open(self.directory / f"{name}.{kind}", "wb") for kind in kinds)
        zero = np.zeros(1, dtype=np.int64).tobytes()
        self._files[1].write(zero)
        self._files[2].write(zero)

    def close(self) -> None:
        if self._files is not None and self.word_starts and len(self._bits):
            self._files[3].write(np.packbits(self._bits, bitorder="little").tobytes())  # padded with 0 bits
        self._bits = self._bits[:0]
        for f in self._files or ():
            f.close()
        self._files = None


def check_prepare(cfg: PrepareConfig) -> PrepareConfig:
    """`bertgpu prepare`'s flags, before anything starts; ``cfg`` with --workers 0 made one per core, at most 8."""
    if not 0 <= cfg.max_unk_share <= 1:
        raise UserError(f"--max-unk-share must be between 0 and 1, not {cfg.max_unk_share}")
    if cfg.workers < 0:
        raise UserError(f"--workers must be 0 (one per core, at most 8) or a number of processes, not {cfg.workers}")
    return dataclasses.replace(cfg, workers=cfg.workers or max(1, min(8, os.cpu_count() or 1)))


@dataclass(frozen=True)
class PrepareOptions:
    """How ``prepare`` tokenizes a corpus into shards: its keywords, with their defaults."""

    workers: int = 1
    lowercase: bool = True
    shard_tokens: int = 32 * 2**20
    overwrite: bool = False
    progress: bool = True
    strict: bool = False
    text_field: str = "text"
    split_sentences: str | None = None
    zh_wwm: bool = False
    max_unk_share: float = MAX_UNK_SHARE


def prepare(inputs: list[str], vocab: str | os.PathLike, out_dir: str | os.PathLike, **options: Any) -> dict:
    """Tokenize a corpus into shards in ``out_dir`` and return its meta dict: ``write_shards`` with the keywords
    ``options`` (``PrepareOptions``' fields: workers=1, lowercase=True, shard_tokens, overwrite, progress,
    strict, text_field, split_sentences, zh_wwm, max_unk_share), as ``bertgpu.prepare`` takes them."""
    return write_shards(inputs, vocab, out_dir, PrepareOptions(**options))


def write_shards(
    inputs: list[str], vocab: str | os.PathLike, out_dir: str | os.PathLike, options: PrepareOptions
) -> dict:
    """Tokenize a corpus into shards in ``out_dir`` and return its meta dict.

    Inputs are plain text, JSON Lines or Parquet files (``corpus``); records keep their text in
    ``text_field``. ``split_sentences`` is ``auto`` (split lines into sentences), ``lines`` (a line is
    a sentence) or ``none`` (a paragraph is kept whole); None means ``lines`` for plain text and
    ``auto`` for records. The result appears all at once (built in a hidden sibling directory, then
    renamed), so an interrupted run never leaves a directory that looks usable. The output is
    identical for any number of ``workers``. ``progress`` shows a bar (on a terminal) and prints a
    summary line. Damaged input (non-UTF-8 bytes, over-long lines, bad records) is repaired or
    skipped, counted in the meta and warned about, or with ``strict`` an error. ``zh_wwm`` also segments
    the text into Chinese words (jieba) and stores which tokens start a word, for ``pretrain --wwm``
    (``words``); the token ids stay those of plain ``prepare``. More than ``max_unk_share`` of the
    tokens being [UNK] is an error: the vocab does not fit the text. (Each name is a field of ``options``.)
    """
    workers, shard_tokens, lowercase, zh_wwm = options.workers, options.shard_tokens, options.lowercase, options.zh_wwm
    strict, text_field, split_sentences = options.strict, options.text_field, options.split_sentences
    overwrite, progress, max_unk_share = options.overwrite, options.progress, options.max_unk_share
    refuse_clobbering({"--out": out_dir}, {"the corpus": inputs, "--vocab": vocab})
    if workers < 1:
        raise UserError(f"workers must be at least 1, not {workers}")
    if shard_tokens < 1:
        raise UserError(f"shard_tokens must be at least 1, not {shard_tokens}")
    paths = resolve_inputs(inputs)
    reader = CorpusReader(paths, strict, text_field, split_sentences)
    if "auto" in reader.split_modes.values():
        sentences.check_available()
    if zh_wwm:
        words.check_available()
    tokenizer = Tokenizer(vocab, lowercase=lowercase)
    # Before the work: whether the vocab splits the text's words far more than one made for it (its first lines).
    message = fragmentation_warning(tokenizer, CorpusReader(paths, text_field=text_field).lines(), vocab)
    if message:
        warnings.warn(message, stacklevel=2)
    out = Path(os.path.abspath(out_dir))  # absolute, so that even "." has a sibling to build in
    _check_replaceable(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic.new_temporary(out)
    started = time.perf_counter()
    try:
        meta = _write_shards(reader, tokenizer, tmp, workers, shard_tokens, progress, zh_wwm)
        if not meta["tokens"]:
            why = "".join(f"; {message}" for message in reader.warnings)
            raise UserError(f"no tokens in {', '.join(map(str, inputs))}: the corpus is empty{why}")
        share = meta["unk_tokens"] / meta["tokens"]
        if share > max_unk_share and 2 * reader.bad_lines >= reader.lines_read:  # the encoding is what is wrong
            raise UserError(
                f"{reader.bad_lines:,} of the {reader.lines_read:,} lines of {', '.join(map(str, inputs))} are not "
                f"valid UTF-8 (first at {reader.first_bad}; {reader.first_bad_hint}), so {share:.1%} of the tokens "
                "read are [UNK]"
            )
        if share > max_unk_share:
            raise UserError(
                f"{share:.1%} of the {meta['tokens']:,} tokens of {', '.join(map(str, inputs))} are [UNK] with "
                f"{vocab} (more than --max-unk-share {max_unk_share:g}): the vocab was most likely made for another "
                f"language or corpus (train one with `bertgpu vocab`)"
                f"{'' if lowercase else ', or is cased for lower-case text'}; "
                f"--max-unk-share 1 prepares it anyway"
            )
        for message in reader.warnings:
            warnings.warn(message, stacklevel=2)
        shutil.copyfile(vocab, tmp / "vocab.txt")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        atomic.commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if progress:
        rate = meta["tokens"] / max(time.perf_counter() - started, 1e-9)
        short = meta["single_sentence_documents"] / meta["documents"]
        in_words = ""
        if meta["word_starts"]:
            n_words = meta["word_starts"]["words"]
            in_words = f" in {n_words:,} words ({meta['tokens'] / n_words:.2f} tokens per word, {words.SEGMENTER})"
        print(
            f"prepared {meta['documents']:,} documents, {meta['sentences']:,} sentences, {meta['tokens']:,} tokens"
            f"{in_words} in {len(meta['shards'])} shard(s) at {rate:,.0f} tokens/s -> {out}; "
            f"{meta['unk_tokens'] / meta['tokens']:.2%} of the tokens are [UNK]; {short:.1%} of the "
            "documents have a single sentence, too short for next-sentence prediction"
        )
    return meta


def _check_replaceable(out: Path, overwrite: bool) -> None:
    """Refuse to clobber data: only an empty directory, or a prepared corpus with ``overwrite``, may be replaced."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"output {out} exists and is not a directory")
    if not any(out.iterdir()):
        return
    if not overwrite:
        raise UserError(f"output directory {out} already exists and is not empty (--overwrite replaces it)")
    if not (out / "meta.json").is_file():
        raise UserError(
            f"output directory {out} is not a prepared corpus (no meta.json); not replacing it even with --overwrite"
        )


def _write_shards(
    reader: CorpusReader,
    tokenizer: Tokenizer,
    directory: Path,
    workers: int,
    shard_tokens: int,
    progress: bool,
    zh_wwm: bool = False,
) -> dict:
    """Tokenize the corpus into shards in ``directory`` and return the meta dict describing them."""
    writer = _ShardWriter(directory, shard_tokens, word_starts=zh_wwm, unk_id=tokenizer.unk_id)
    bar = tqdm(total=reader.total_bytes, unit="B", unit_scale=True, desc="prepare", disable=None if progress else True)
    try:
        for chunk in _tokenized_chunks(reader, tokenizer, workers, zh_wwm):
            writer.add(chunk)
            bar.update(reader.bytes_read - bar.n)
    finally:
        writer.close()
        bar.close()
    shards = writer.shards
    modes = reader.split_modes
    return {
        "format": FORMAT,
        "version": VERSION,
        "vocab_sha256": tokenizer.sha256,
        "vocab_size": tokenizer.vocab_size,
        "lowercase": tokenizer.lowercase,
        "token_dtype": token_dtype(tokenizer.vocab_size).name,
        "documents": sum(s["documents"] for s in shards),
        "sentences": sum(s["sentences"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
        "single_sentence_documents": writer.single_sentence_documents,
        "unk_tokens": writer.unknown,
        "inputs": [os.path.abspath(p) for p in reader.paths],
        "input_formats": [fmt + (f"+{compression}" if compression else "") for fmt, compression in reader.formats],
        "text_field": reader.text_field,
        "split_sentences": modes,
        "sentence_splitter": sentences.splitter_name() if "auto" in modes.values() else None,
        "records": reader.records_read,
        "skipped_records": dict(reader.skipped),
        "bad_lines": reader.bad_lines,
        "long_lines": reader.long_lines,
        "cut_documents": reader.cut_documents + reader.cut_records,
        # With --zh-wwm: the .words files exist; the segmenter and the number of words (word starts).
        "word_starts": {"segmenter": words.segmenter_name(), "words": writer.words} if zh_wwm else None,
    }
