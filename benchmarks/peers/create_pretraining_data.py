"""The reference of ``prepare_throughput.py``: google-research/bert's create_pretraining_data.py, ported, with
transformers' ``BertTokenizerFast`` in place of its own tokenizer and nothing else changed.

Every line of the input is stripped and, as in the original, ``tokenize``d on its own into word-piece strings
(a blank line ends a document); all documents are read into memory and shuffled; then, for ``dupe_factor``
rounds, ``create_instances_from_document`` on every document: the chunking walk, the random next sentence
drawn from the whole corpus, ``truncate_seq_pair`` and ``create_masked_lm_predictions`` (15% of the word
pieces, at most 20, 80/10/10 ``[MASK]``/kept/random word); the instances are shuffled; then
``write_instance_to_example_files`` up to the ``tf.train.Example``: ``convert_tokens_to_ids`` and padding to
128 tokens and 20 predictions, every instance's lists kept in memory. So it does slightly less than the
original: no TensorFlow, nothing serialised, no file written. Seed 12345 (the original's default). The
original is single-process and is parallelised by running one process per input shard: ``original_part``
is one such process (``peers/prepare_references.py`` runs them).

The original's functions and names, its defaults as constants; only the tokenizer is new, and writing stops
short of TensorFlow. Comments mark where this port has to differ.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from peers import lines_in_part

MAX_SEQ_LENGTH = 128
SHORT_SEQ_PROB = 0.1


def bert_tokenizer_fast(vocab: str):
    """Both references' tokenizer: transformers' BertTokenizerFast on the bert-base-uncased vocab, checked."""
    from transformers import BertTokenizerFast

    # BertTokenizerFast(vocab_file=...) silently builds a 5-token vocab in transformers 5.x; vocab= does not.
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    ids = tokenizer("Hello, unaffable world!", add_special_tokens=False)["input_ids"]
    assert ids == [7592, 1010, 14477, 20961, 3468, 2088, 999], f"reference tokenizer is broken: {ids}"
    return tokenizer


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: random.Random) -> None:
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
    path: str, start: int, end: int, tokenizer, dupe_factor: int, max_seq_length: int, short_seq_prob: float,
    masked_lm_prob: float, max_predictions_per_seq: int, rng: random.Random,
) -> tuple[list[TrainingInstance], int]:  # fmt: skip
    """The original's, on the lines starting in bytes [start, end) of ``path``; also returns the word pieces read."""
    all_documents: list[list[list[str]]] = [[]]
    for line in lines_in_part(path, start, end):  # the original reads the whole file as text
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
                    all_documents, document_index, max_seq_length, short_seq_prob, masked_lm_prob,
                    max_predictions_per_seq, vocab_words, rng,
                )
            )  # fmt: skip
    rng.shuffle(instances)
    return instances, n_tokens


def create_instances_from_document(
    all_documents: list[list[list[str]]], document_index: int, max_seq_length: int, short_seq_prob: float,
    masked_lm_prob: float, max_predictions_per_seq: int, vocab_words: list[str], rng: random.Random,
) -> list[TrainingInstance]:  # fmt: skip
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
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
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
                        tokens=tokens, segment_ids=segment_ids, is_random_next=is_random_next,
                        masked_lm_positions=masked_lm_positions, masked_lm_labels=masked_lm_labels,
                    )
                )  # fmt: skip
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
            (input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights,
             [next_sentence_label])
        )  # fmt: skip
    return features


def original_part(vocab: str, path: str, start: int, end: int, dupe_factor: int, seed: int) -> tuple[int, int]:
    """One run of the ported script on one part (what one process per input shard does): (tokens, instances)."""
    tokenizer = bert_tokenizer_fast(vocab)
    rng = random.Random(seed)
    instances, tokens = create_training_instances(
        path, start, end, tokenizer, dupe_factor, MAX_SEQ_LENGTH, SHORT_SEQ_PROB, MASKED_LM_PROB,
        MAX_PREDICTIONS_PER_SEQ, rng,
    )  # fmt: skip
    features = instance_features(instances, tokenizer, MAX_SEQ_LENGTH, MAX_PREDICTIONS_PER_SEQ)
    return tokens, len(features)  # the lists die with the part, as the original's process exits after writing
