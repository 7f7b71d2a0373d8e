"""--mlm-bias-init unigram (issue 41): a fresh model's masked-LM decoder bias is each token's log frequency in the
text it trains on, so that its first loss is the unigram plateau's instead of log(vocab)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertgpu.config import DataConfig
from bertgpu.data.heldout import split_documents
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset, token_counts
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab
from bertgpu.models import architectures
from bertgpu.tasks.pretrain import init_bias_to_unigram


def _all_tokens(corpus) -> np.ndarray:
    offsets = corpus.doc_offsets
    return np.concatenate([corpus.tokens(int(offsets[d]), int(offsets[d + 1])) for d in range(corpus.num_documents)])


def test_token_counts_are_the_training_text_s_own(small_english_data):
    corpus = ShardedCorpus(small_english_data)
    every = np.bincount(_all_tokens(corpus), minlength=corpus.vocab_size)
    counts, total = token_counts(corpus, max_tokens=10**9)
    assert total == corpus.num_tokens and np.array_equal(counts, every)
    # Held-out documents are not counted: the training text's and the held-out text's counts add up to all.
    train, heldout = split_documents(corpus, np.arange(0, corpus.num_documents, 5))
    train_counts, train_total = token_counts(train, max_tokens=10**9)
    assert np.array_equal(train_counts + np.bincount(_all_tokens(heldout), minlength=corpus.vocab_size), every)
    assert 0 < train_total < total
    # A sample stops at max_tokens, the same draw on every process.
    sample, n = token_counts(corpus, max_tokens=1000, seed=3)
    assert n == 1000 and sample.sum() == 1000 and np.array_equal(sample, token_counts(corpus, 1000, seed=3)[0])


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_a_unigram_bias_starts_a_fresh_model_on_the_plateau(small_english_data, arch):
    """Masked-LM loss of a fresh tiny model on masked instances of its text: about log(vocab) with a zero bias,
    and with the unigram bias within 0.1 nats of the cross-entropy of the targets under the text's token
    frequencies (the random tied embedding adds logits of a few tenths of standard deviation, whose softmax costs
    a few hundredths of a nat)."""
    corpus = ShardedCorpus(small_english_data)
    vocab = load_vocab(corpus.vocab_path)
    data = DataConfig(data=str(small_english_data), nsp=False, pack=True, masked_lm_prob=0.3, max_predictions=40)
    dataset = PretrainingDataset(corpus, data, seed=0, vocab=vocab)
    batch = {k: torch.from_numpy(np.stack([dataset[i][k] for i in range(64)])) for k in dataset[0]}
    labels = batch["mlm_labels"].flatten()
    targets = labels[labels != IGNORE_INDEX].numpy()
    counts, total = token_counts(corpus, seed=0)
    unigram_xent = float(-np.log((counts[targets] + 0.5) / (total + 0.5 * len(counts))).mean())

    def first_loss(unigram: bool) -> float:
        torch.manual_seed(0)
        config = architectures.preset(arch, "tiny", len(vocab), vocab)
        model = architectures.pretraining_model(architectures.with_dropout(config, 0.0), pad_vocab_multiple=64)
        architectures.use_document_attention(model)
        if unigram:
            init_bias_to_unigram(model, corpus, seed=0)
        with torch.no_grad():
            logits, _ = model(
                batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"]
            )
        return F.cross_entropy(logits.flatten(0, 1), labels, ignore_index=IGNORE_INDEX).item()

    zeros, unigram = first_loss(False), first_loss(True)
    assert abs(zeros - math.log(len(vocab))) < 0.2, zeros
    assert abs(unigram - unigram_xent) < 0.1 and unigram < zeros - 1.5, (unigram, unigram_xent, zeros)
