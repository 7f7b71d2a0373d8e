"""The limit of ``prepare_throughput.py`` and ``prepare_split.py``: the tokenizer itself, nothing else.

``tokenizers``' ``BertWordPieceTokenizer`` ``encode_batch_fast`` (``encode_batch`` without character offsets,
the faster of the two and the call ``prepare`` makes) on the non-empty lines of a file in batches of 1,000,
token ids taken out of each encoding and counted. With 2 workers, two processes each read and encode one half
of the file.
"""

from __future__ import annotations

import os
import time

from peers import lines_in_part

BATCH_LINES = 1_000  # the fastest batch size for encode_batch_fast, and shards.ENCODE_LINES

_limit_tokenizer = None


def _limit_init(vocab: str) -> None:
    global _limit_tokenizer
    from tokenizers import BertWordPieceTokenizer

    _limit_tokenizer = BertWordPieceTokenizer(vocab, lowercase=True)


def _limit_range(path: str, start: int, end: int) -> int:
    """Encode the non-empty lines starting in bytes [start, end) of ``path``; return their token count."""
    encode = _limit_tokenizer._tokenizer.encode_batch_fast
    tokens = 0
    batch: list[str] = []
    for line in lines_in_part(path, start, end):
        if line:
            batch.append(line)
            if len(batch) == BATCH_LINES:
                tokens += sum(len(e.ids) for e in encode(batch, add_special_tokens=False))
                batch = []
    if batch:
        tokens += sum(len(e.ids) for e in encode(batch, add_special_tokens=False))
    return tokens


def _split_at_lines(path: str, parts: int) -> list[tuple[int, int]]:
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as f:
        for i in range(1, parts):
            f.seek(size * i // parts)
            f.readline()  # to the start of the next line
            bounds.append(f.tell())
    bounds.append(size)
    return list(zip(bounds[:-1], bounds[1:]))


def run_limit(corpus: str, workers: int, vocab: str) -> dict:
    t0 = time.perf_counter()
    if workers == 1:
        _limit_init(vocab)
        tokens = _limit_range(corpus, 0, os.path.getsize(corpus))
    else:
        import multiprocessing

        ranges = _split_at_lines(corpus, workers)
        ctx = multiprocessing.get_context("spawn")  # as prepare's pool
        with ctx.Pool(workers, initializer=_limit_init, initargs=(vocab,)) as pool:
            tokens = sum(pool.starmap(_limit_range, [(corpus, s, e) for s, e in ranges]))
    return {"tokens": tokens, "seconds": time.perf_counter() - t0}
