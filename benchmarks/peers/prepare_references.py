"""The two references of ``prepare_throughput.py``, run over a corpus.

- ``reference``: ``create_pretraining_data.py``'s port (``peers/create_pretraining_data.py``) as the original is
  parallelised, one process per input shard: with N workers the input is split at document boundaries into N
  parts of about equal bytes, each run through the whole port in its own process (a spawn
  ``multiprocessing.Pool``, one task per part, seed 12345 + part index; random next sentences come from the part).
- ``reference-lean``: the same kind of pipeline made as cheap as it can be: ``BertTokenizerFast`` called once
  per document on all its sentences (one batched call, ids rather than strings), then per-document Python
  instance creation (``create_instances_from_document``'s chunking walk, random next sentence from the documents
  the worker tokenized lately, ``truncate_seq_pair``) without the masked-LM step, id conversion or padding,
  every instance kept in memory as Python lists. At 2 workers, a ``multiprocessing.Pool`` over documents
  streamed from the file.
"""

from __future__ import annotations

import bisect
import os
import random
import time

from peers.create_pretraining_data import (
    MAX_SEQ_LENGTH,
    RANDOM_SEED,
    SHORT_SEQ_PROB,
    bert_tokenizer_fast,
    original_part,
    truncate_seq_pair,
)

_lean_tokenizer = None
_lean_rng: random.Random | None = None
_lean_recent: list[list[list[int]]] = []  # documents this process tokenized lately: source of random "next" text


def _lean_init(vocab: str) -> None:
    global _lean_tokenizer, _lean_rng
    _lean_tokenizer = bert_tokenizer_fast(vocab)
    _lean_rng = random.Random(12345 + os.getpid())


def _lean_document(sentences: list[str]) -> tuple[int, list]:
    """Tokenize one document (one batched call) and build its instances as the original does."""
    tok, rng = _lean_tokenizer, _lean_rng
    document = [ids for ids in tok(sentences, add_special_tokens=False)["input_ids"] if ids]
    n_tokens = sum(map(len, document))
    cls_id, sep_id = tok.cls_token_id, tok.sep_token_id
    max_num_tokens = MAX_SEQ_LENGTH - 3
    target_seq_length = max_num_tokens
    if rng.random() < SHORT_SEQ_PROB:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a: list[int] = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b: list[int] = []
                is_random_next = False
                if (len(current_chunk) == 1 or rng.random() < 0.5) and _lean_recent:
                    # The original draws B from a random other document of the whole corpus; a worker
                    # sees only its own documents, so draw from those it tokenized lately.
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    random_document = _lean_recent[rng.randint(0, len(_lean_recent) - 1)]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                tokens = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                instances.append((tokens, segment_ids, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    _lean_recent.append(document)
    if len(_lean_recent) > 100:
        del _lean_recent[0]
    return n_tokens, instances


def documents(path: str, max_bytes: int):
    """Documents (lists of stripped non-empty lines) of ``path``, stopping at the first boundary past ``max_bytes``."""
    read = 0
    document: list[str] = []
    with open(path, "rb") as f:
        for raw in f:
            read += len(raw)
            line = raw.decode("utf-8").strip()
            if line:
                document.append(line)
            elif document:
                yield document
                document = []
                if read >= max_bytes:
                    return
    if document:
        yield document


def run_reference_lean(corpus: str, workers: int, max_bytes: int, vocab: str) -> dict:
    """The lean reference on the prefix of ``corpus`` that ``documents`` reads, in ``workers`` processes."""
    t0 = time.perf_counter()
    all_instances: list = []  # the original keeps every instance in memory before writing
    tokens = 0
    if workers == 1:
        _lean_init(vocab)
        for document in documents(corpus, max_bytes):
            n, instances = _lean_document(document)
            tokens += n
            all_instances.extend(instances)
    else:
        import multiprocessing

        with multiprocessing.Pool(workers, initializer=_lean_init, initargs=(vocab,)) as pool:
            for n, instances in pool.imap(_lean_document, documents(corpus, max_bytes), chunksize=32):
                tokens += n
                all_instances.extend(instances)
    seconds = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": seconds, "instances": len(all_instances)}


def split_at_documents(path: str, max_bytes: int, parts: int) -> list[tuple[int, int]]:
    """The prefix ``lean_instances.documents`` reads, as ``parts`` byte ranges of about equal size cut at document boundaries."""
    boundaries = []  # offsets just past a blank line that ends a document, up to the prefix's end
    read = 0
    in_document = False
    with open(path, "rb") as f:
        for raw in f:
            read += len(raw)
            if raw.strip():
                in_document = True
            elif in_document:
                boundaries.append(read)
                in_document = False
                if read >= max_bytes:
                    break
    if not boundaries or boundaries[-1] != read:
        boundaries.append(read)  # the file ended inside a document (or on blank lines): the prefix is all of it
    end = boundaries[-1]
    bounds = [0] + [boundaries[bisect.bisect_left(boundaries, end * i / parts)] for i in range(1, parts)] + [end]
    return list(zip(bounds[:-1], bounds[1:]))


def run_reference(corpus: str, workers: int, max_bytes: int, dupe_factor: int, vocab: str) -> dict:
    """The port on the prefix of ``corpus`` up to the first document boundary past ``max_bytes``, in ``workers``
    processes: word pieces read, seconds, instances made."""
    t0 = time.perf_counter()
    parts = [
        (vocab, corpus, s, e, dupe_factor, RANDOM_SEED + k)
        for k, (s, e) in enumerate(split_at_documents(corpus, max_bytes, workers))
    ]
    if workers == 1:
        results = [original_part(*parts[0])]  # the original: one process
    else:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # fresh processes, as separate runs of the script would be
        with ctx.Pool(workers) as pool:
            results = pool.starmap(original_part, parts, chunksize=1)
    seconds = time.perf_counter() - t0
    return {
        "tokens": sum(t for t, _ in results),
        "seconds": seconds,
        "instances": sum(n for _, n in results),
        "dupe_factor": dupe_factor,
    }
