"""Held-out documents and the fixed evaluation set of pretraining.

``--eval-fraction F`` holds out a seeded fraction of the *documents* of the training data: the
training instances are built from the other documents only (random "next sentences" included), so
no held-out text is ever trained on, and the held-out documents are the same for any process count
(they depend on the seed, F and the data only) and recorded in every checkpoint, so a resume holds out
the same ones. ``--eval-data DIR`` evaluates on another prepared directory instead.

``EvalSet`` is the evaluation set: K instances of the held-out text, built by the same code as the
training instances (``PretrainingDataset``) with a seed of their own, so they are the same instances,
masked the same way, at every evaluation, in every layout.
"""

from __future__ import annotations

import numpy as np

from bertgpu.config import DataConfig
from bertgpu.data.pretraining import PretrainingDataset
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab
from bertgpu.errors import UserError

_TAG_HOLDOUT, _TAG_EVAL = 7, 8  # keep these random streams apart from the training ones
EVAL_EPOCH = 0


class DocumentSubset:
    """Some documents of a prepared corpus, as a corpus of their own (what ``PretrainingDataset`` reads).

    Sentence ``i`` of the subset is sentence ``self.sentences[i]`` of the corpus; a range of sentences
    inside one document maps to a range of the corpus, so tokens are read as they are. Pickles as the
    directory and the document ids (DataLoader workers reopen the files)."""

    def __init__(self, corpus: ShardedCorpus | str, documents: np.ndarray):
        self.corpus = corpus if isinstance(corpus, ShardedCorpus) else ShardedCorpus(corpus)
        self.documents = np.sort(np.asarray(documents, dtype=np.int64))
        if len(self.documents) and (self.documents[0] < 0 or self.documents[-1] >= self.corpus.num_documents):
            raise ValueError("document ids outside the corpus")
        offsets = self.corpus.doc_offsets
        starts, ends = offsets[self.documents], offsets[self.documents + 1]
        counts = ends - starts
        self.doc_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # The corpus sentence of each subset sentence: one arange per document, concatenated.
        self.sentences = np.repeat(starts - self.doc_offsets[:-1], counts) + np.arange(self.doc_offsets[-1])
        self.sentence_lengths = self.corpus.sentence_lengths[self.sentences]
        self.num_sentences = int(self.doc_offsets[-1])
        self.num_documents = len(self.documents)
        self.data_dir, self.meta, self.vocab_path = self.corpus.data_dir, self.corpus.meta, self.corpus.vocab_path
        self.vocab_size, self.vocab_sha256 = self.corpus.vocab_size, self.corpus.vocab_sha256

    @property
    def has_word_starts(self) -> bool:
        return self.corpus.has_word_starts

    def _corpus_range(self, start: int, end: int) -> tuple[int, int]:
        if end <= start:
            first = int(self.sentences[start]) if start < self.num_sentences else 0
            return first, first
        return int(self.sentences[start]), int(self.sentences[end - 1]) + 1

    def tokens(self, start_sentence: int, end_sentence: int) -> np.ndarray:
        return self.corpus.tokens(*self._corpus_range(start_sentence, end_sentence))

    def word_starts(self, start_sentence: int, end_sentence: int) -> np.ndarray:
        return self.corpus.word_starts(*self._corpus_range(start_sentence, end_sentence))

    def __getstate__(self) -> dict:
        return {"data_dir": self.corpus.data_dir, "documents": self.documents}

    def __setstate__(self, state: dict) -> None:
        self.__init__(str(state["data_dir"]), state["documents"])


def heldout_documents(num_documents: int, fraction: float, seed: int) -> np.ndarray:
    """The documents ``--eval-fraction`` holds out: a seeded choice of ``round(fraction * n)`` of them
    (at least one), a function of the seed, the fraction and the corpus alone."""
    if not 0 < fraction <= 0.5:
        raise UserError(f"--eval-fraction must be in (0, 0.5], not {fraction:g}")
    count = max(1, round(fraction * num_documents))
    if count >= num_documents:
        raise UserError(f"--eval-fraction {fraction:g} of {num_documents} document(s) leaves none to train on")
    rng = np.random.default_rng([seed, _TAG_HOLDOUT])
    return np.sort(rng.permutation(num_documents)[:count])


def split_documents(corpus: ShardedCorpus, heldout: np.ndarray) -> tuple[DocumentSubset, DocumentSubset]:
    """(the documents to train on, the held-out ones)."""
    train = np.setdiff1d(np.arange(corpus.num_documents), heldout)
    return DocumentSubset(corpus, train), DocumentSubset(corpus, heldout)


class EvalSet:
    """The fixed evaluation instances: the first ``count`` of a seeded order of the held-out text's
    instances (all of them when there are fewer), built as pretraining builds its instances."""

    def __init__(self, corpus: ShardedCorpus | DocumentSubset, cfg: DataConfig, seed: int, count: int, where: str):
        self.dataset = PretrainingDataset(corpus, cfg, seed + 1_000_003 * _TAG_EVAL, load_vocab(corpus.vocab_path))
        self.dataset.set_epoch(EVAL_EPOCH)
        n = len(self.dataset)
        order = np.random.default_rng([seed, _TAG_EVAL]).permutation(n)
        self.indices = np.sort(order[: min(count, n)])
        self.where = where

    def __len__(self) -> int:
        return len(self.indices)

    def check_enough(self, dp: int) -> None:
        if len(self) < dp:
            raise UserError(
                f"the evaluation set ({self.where}) gives {len(self)} instance(s), fewer than the {dp} "
                "data-parallel processes that share it: hold out more text (--eval-fraction) or give "
                "--eval-data"
            )

    def instance(self, k: int) -> dict[str, np.ndarray]:
        return self.dataset[int(self.indices[k])]

    def unigram_loss(self) -> float:
        """The masked-LM loss of predicting every masked token by its frequency: the plateau a model sits on before
        it uses any context. Estimated from this set's masked tokens as their entropy, in nats, with the
        Miller-Madow correction ((distinct tokens - 1) / (2 x tokens)): a few thousand masked tokens of a large
        vocabulary would put the plain estimate a few tenths of a nat too low. Computed once (every process alike:
        the set is the same everywhere)."""
        if not hasattr(self, "_unigram"):
            labels = np.concatenate([np.asarray(self.instance(k)["mlm_labels"]).ravel() for k in range(len(self))])
            counts = np.bincount(labels[labels >= 0]).astype(np.float64)
            counts = counts[counts > 0]
            p = counts / max(counts.sum(), 1.0)
            self._unigram = float(-(p * np.log(p)).sum() + (len(counts) - 1) / (2 * max(counts.sum(), 1.0)))
        return self._unigram
