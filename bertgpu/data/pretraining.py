"""Pretraining instances, as the original BERT's create_pretraining_data defines them, made dynamic.

Per epoch, from prepared shards:

1. ``build_instance_spans`` walks every document as the original does (a target length of
   max_seq_length - 3, shortened with probability ``short_seq_prob``; sentences gathered into a chunk
   until the target is reached; segment A = a random number of the chunk's sentences; with
   probability 0.5 B is random text and the chunk's unused sentences are put back for the next
   instance; a one-sentence chunk is split inside the sentence, the one change from the original,
   see ``build_instance_spans``). The walk runs over all documents at once, in numpy, seeded by
   (seed, epoch).
2. ``PretrainingDataset[index]`` turns span ``index`` into a training example with a generator seeded
   by (seed, epoch, index): the random document for B, truncation of the pair from the front or back,
   and masked-LM masking (15% of tokens, 80% [MASK] / 10% a random word piece / 10% unchanged;
   whole words with ``wwm``: the words ``prepare --zh-wwm`` stored, Chinese words included, or else
   ``##`` pieces joined to the piece before). Any example can be rebuilt on its own, so a run resumes
   anywhere without replay; ``bertgpu inspect`` prints examples as built here.
3. ``GlobalBatchSampler`` cuts one global order per epoch into global batches; data-parallel rank r
   takes every dp-th instance of each (as DistributedSampler does) and splits its share into
   micro-batches, so step k trains on the same instances whatever the number of processes or
   accumulation steps.

With ``--pack`` (MLM only), step 1 is ``build_packed_spans`` instead: rows that hold the corpus's tokens
in order, a document cut at a row's end continuing in the next, the same rows every epoch; step 2
encodes each document piece of a row as ``[CLS] text [SEP]`` and numbers the pieces in
``attention_mask`` (1, 2, ...; 0 on padding), from which the model keeps attention within each document.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from bertgpu.config import DataConfig
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.sharing import share
from bertgpu.data.tokenizer import load_vocab
from bertgpu.data.words import is_cjk
from bertgpu.errors import UserError

IGNORE_INDEX = -100  # label of positions that are not predicted (as in transformers)

# Tags that keep the random streams of one (seed, epoch) apart.
_TAG_INSTANCE, _TAG_SPANS, _TAG_ORDER, _TAG_COUNTS = 0, 1, 2, 3
# Markers in a span's b_end: B is random text / A and B split one sentence between them.
RANDOM_NEXT, SPLIT_SENTENCE = -1, -2
PACKED = -3  # b_end of a packed span (--pack): sentences of several documents, [SEP] between documents


def build_instance_spans(
    sentence_lengths: np.ndarray,
    doc_offsets: np.ndarray,
    max_num_tokens: int,
    short_seq_prob: float,
    nsp: bool,
    rng: np.random.Generator,
) -> np.ndarray:
    """The chunking walk of create_instances_from_document over all documents at once.

    Returns an int64 array [n, 5] of (a_start, a_end, b_end, target_length, doc): sentences
    [a_start, a_end) are segment A; B is [a_end, b_end) when it is the actual continuation,
    b_end == RANDOM_NEXT when B must be random text (drawn per instance), and SPLIT_SENTENCE when
    the chunk is one sentence that A and B split between them. Without NSP, A is the whole chunk
    and b_end == a_end.

    One change from the original: it forces a random B on every one-sentence chunk (a sentence
    that fills the target alone, or the last one of a document), which pushes the random share
    above one half on corpora with long sentences (57.7% on People's Daily). Here the coin is
    always fair, and "actual next" for one sentence means its two halves, split at a random token:
    B is still the text that follows A.
    """
    cum = np.zeros(len(sentence_lengths) + 1, dtype=np.int64)
    np.cumsum(sentence_lengths, out=cum[1:])
    n_docs = len(doc_offsets) - 1
    # One target length per document, as in the original.
    target = np.full(n_docs, max_num_tokens, dtype=np.int64)
    short = rng.random(n_docs) < short_seq_prob
    target[short] = rng.integers(2, max_num_tokens + 1, size=int(short.sum()))
    pos = doc_offsets[:-1].astype(np.int64)
    end = doc_offsets[1:].astype(np.int64)
    docs = np.flatnonzero(pos < end)
    spans = []
    while docs.size:
        p, e, t = pos[docs], end[docs], target[docs]
        # The chunk ends with the first sentence that brings it to the target, or at the document's end.
        chunk_end = np.minimum(np.maximum(np.searchsorted(cum, cum[p] + t, side="left"), p + 1), e)
        n = chunk_end - p
        if nsp:
            a_count = np.ones_like(n)
            multi = n >= 2
            a_count[multi] = rng.integers(1, n[multi])  # uniform in [1, n - 1]
            is_random = rng.random(docs.size) < 0.5
            a_end = p + a_count
            # A one-sentence chunk whose coin says "actual next" is split inside the sentence.
            b_end = np.where(is_random, RANDOM_NEXT, np.where(multi, chunk_end, SPLIT_SENTENCE))
            nxt = np.where(is_random, a_end, chunk_end)  # random B: unused sentences go back
        else:
            a_end = b_end = nxt = chunk_end
        spans.append(np.stack([p, a_end, b_end, t, docs], axis=1))
        pos[docs] = nxt
        docs = docs[nxt < e]
    if not spans:
        return np.zeros((0, 5), dtype=np.int64)
    out = np.concatenate(spans)
    return out[np.lexsort((out[:, 0], out[:, 4]))]  # document order


# A packed row starts no new document piece shorter than this (it pads instead): a piece of a few tokens
# gives its masked tokens almost nothing to be predicted from, and costs two special tokens.
MIN_PIECE = 8


def pack_overhead(per_document: bool) -> tuple[int, int]:
    """(special tokens of a packed row, more per document piece): [CLS] text [SEP] per piece with
    ``per_document``, else [CLS] first [SEP] second [SEP] ... (one [SEP] per piece and the row's [CLS])."""
    return (0, 2) if per_document else (1, 1)


def build_packed_spans(doc_tokens: np.ndarray, length: int, per_document: bool) -> np.ndarray:
    """``--pack`` (MLM only): rows of ``length`` tokens that hold the corpus's tokens in order, document
    after document, a document that does not fit continuing in the next row (cut at any token), so a row
    is padded only where the next piece would be shorter than ``MIN_PIECE``. ``doc_tokens`` are the
    documents' first token (in the corpus's token stream) and the total; each row costs
    ``pack_overhead`` special tokens. Same columns as ``build_instance_spans``: (first token, end token,
    ``PACKED``, length, document of the first token).

    The loop runs once per row that holds a document's end (rows inside a long document are made in
    bulk), as the sentence-wise packing before it ran once per row."""
    bounds = np.unique(np.asarray(doc_tokens, dtype=np.int64))  # empty documents merge away
    n = len(bounds) - 1
    row_cost, piece_cost = pack_overhead(per_document)
    budget = length - row_cost
    per_row = budget - piece_cost  # tokens of a row that holds one piece
    # cost of the whole documents [d, e) of a row starting at token t of document d: key[e] - t - key[d] + bounds[d]
    key = bounds + piece_cost * np.arange(n + 1)
    starts: list = []
    ends: list = []
    t, d = int(bounds[0]) if n > 0 else 0, 0
    while d < n:
        rest = int(bounds[d + 1]) - t
        if rest > per_row:  # rows inside document d
            k = (rest - 1) // per_row
            first = t + per_row * np.arange(k, dtype=np.int64)
            starts.append(first)
            ends.append(first + per_row)
            t += k * per_row
        # This row holds the end of document d, then as many whole documents as fit, then a piece of the next.
        limit = t + budget + piece_cost * d
        e = int(np.searchsorted(key, limit, side="right")) - 1
        left = limit - int(key[e])
        end = int(bounds[e])
        if e < n and left - piece_cost >= MIN_PIECE:
            end += left - piece_cost
        starts.append(np.array([t], dtype=np.int64))
        ends.append(np.array([end], dtype=np.int64))
        t, d = end, e
    if not starts:
        return np.zeros((0, 5), dtype=np.int64)
    first, last = np.concatenate(starts), np.concatenate(ends)
    doc = np.searchsorted(bounds, first, side="right") - 1
    return np.stack([first, last, np.full_like(first, PACKED), np.full_like(first, length), doc], axis=1)


def packed_fill(spans: np.ndarray, doc_tokens: np.ndarray, per_document: bool) -> np.ndarray:
    """The real (non-padding) tokens of each packed row of ``spans`` (``build_packed_spans``'), special
    tokens included, without building the rows."""
    bounds = np.unique(np.asarray(doc_tokens, dtype=np.int64))
    first, end = spans[:, 0], spans[:, 1]
    pieces = np.searchsorted(bounds, end, side="left") - np.searchsorted(bounds, first, side="right") + 1
    row_cost, piece_cost = pack_overhead(per_document)
    return (end - first) + piece_cost * pieces + row_cost


def truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator):
    """Truncate the pair to max_tokens, each token taken from the longer side (ties: B), and from its
    front or back with probability 1/2: the original truncate_seq_pair, drawn in closed form."""
    la, lb = len(a), len(b)
    excess = la + lb - max_tokens
    if excess <= 0:
        return a, b
    if la > lb:
        d = min(excess, la - lb)
        la, excess = la - d, excess - d
    elif lb > la:
        d = min(excess, lb - la)
        lb, excess = lb - d, excess - d
    lb -= (excess + 1) // 2
    la -= excess // 2

    def cut(x: np.ndarray, keep: int) -> np.ndarray:
        removed = len(x) - keep
        front = int(rng.binomial(removed, 0.5)) if removed else 0
        return x[front : front + keep]

    return cut(a, la), cut(b, lb)


def check_data(cfg: DataConfig) -> None:
    """The instances' flags on their own (pretrain's and inspect's), before anything starts."""
    if cfg.pack and cfg.nsp:
        raise UserError(
            "--pack needs --no-nsp: packed sequences cross documents, so there is no next sentence to predict"
        )
    if cfg.max_seq_length < 8:
        raise UserError(f"--max-seq-length must be at least 8, got {cfg.max_seq_length}")
    if cfg.max_predictions < 1:
        raise UserError(f"--max-predictions must be at least 1, got {cfg.max_predictions}")
    if not 0 < cfg.masked_lm_prob < 1:
        raise UserError(f"--masked-lm-prob must be in (0, 1), got {cfg.masked_lm_prob}")


def check_nsp_possible(corpus: ShardedCorpus) -> None:
    """Next-sentence prediction needs documents of two sentences or more, and two documents."""
    doc_sizes = np.diff(corpus.doc_offsets)
    if len(doc_sizes) < 2:
        raise UserError(
            f"{corpus.data_dir}: next-sentence prediction needs at least 2 documents, "
            "the data has 1 (are documents separated by blank lines?); use --no-nsp"
        )
    if doc_sizes.max() < 2:
        raise UserError(
            f"{corpus.data_dir}: every document has a single sentence, so next-sentence "
            "prediction cannot be built (one sentence per line, a blank line between documents); "
            "use --no-nsp"
        )


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    cls: int
    sep: int
    mask: int
    vocab_size: int

    @classmethod
    def from_vocab(cls, vocab: list[str]) -> SpecialIds:
        return cls(
            pad=vocab.index("[PAD]"),
            cls=vocab.index("[CLS]"),
            sep=vocab.index("[SEP]"),
            mask=vocab.index("[MASK]"),
            vocab_size=len(vocab),
        )


# --wwm on data prepared without --zh-wwm warns when at least this share of its tokens are CJK characters.
CHINESE_SHARE = 0.1
_SAMPLE_TOKENS = 1_000_000  # tokens read to measure the share, from the starts of up to _SAMPLE_SHARDS shards
_SAMPLE_SHARDS = 64


def chinese_share(corpus: ShardedCorpus, vocab: list[str]) -> float:
    """The share of the corpus's tokens that are CJK characters, over a sample of about a million tokens
    (the first tokens of shards spread over the corpus)."""
    cjk_ids = is_cjk(np.array([ord(t) if len(t) == 1 else 0 for t in vocab], dtype=np.uint32))
    shards = corpus.meta["shards"]
    first = np.concatenate([[0], np.cumsum([s["sentences"] for s in shards])])
    picked = np.unique(np.linspace(0, len(shards) - 1, min(len(shards), _SAMPLE_SHARDS)).astype(int))
    per_shard = _SAMPLE_TOKENS // len(picked)
    cjk = total = 0
    for shard in picked:
        start, end = int(first[shard]), int(first[shard + 1])
        lengths = np.cumsum(corpus.sentence_lengths[start:end], dtype=np.int64)
        stop = start + min(end - start, int(np.searchsorted(lengths, per_shard)) + 1)
        tokens = corpus.tokens(start, stop)
        cjk += int(cjk_ids[tokens].sum())
        total += len(tokens)
    return cjk / max(total, 1)


def token_counts(corpus: ShardedCorpus, max_tokens: int = 1 << 21, seed: int = 0) -> tuple[np.ndarray, int]:
    """How often each token id occurs in the text (``corpus``: a prepared corpus or the documents of it a run
    trains on), and over how many tokens: all of it, or whole documents drawn at random (the seed's order)
    until ``max_tokens`` (the last one's first sentences only). Every process draws the same."""
    offsets, lengths = corpus.doc_offsets, corpus.sentence_lengths
    cum = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    doc_tokens = cum[offsets[1:]] - cum[offsets[:-1]]
    order = np.random.default_rng([seed, _TAG_COUNTS]).permutation(corpus.num_documents)
    taken = np.cumsum(doc_tokens[order])
    chosen = order[: int(np.searchsorted(taken, max_tokens)) + 1]
    pieces = [corpus.tokens(int(offsets[d]), int(offsets[d + 1])) for d in np.sort(chosen[:-1])]
    if len(chosen):  # the last document up to max_tokens, through the sentences that hold them
        last, have = int(chosen[-1]), sum(map(len, pieces))
        start, end = int(offsets[last]), int(offsets[last + 1])
        end = min(end, int(np.searchsorted(cum, cum[start] + max_tokens - have)) + 1)
        pieces.append(corpus.tokens(start, end)[: max_tokens - have])
    ids = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    return np.bincount(ids, minlength=corpus.vocab_size)[: corpus.vocab_size], len(ids)


def wwm_fallback_warning(corpus: ShardedCorpus, cfg: DataConfig) -> str | None:
    """What to warn about when --wwm meets Chinese data without word starts (prepared without --zh-wwm), or None."""
    if not cfg.wwm or corpus.has_word_starts:
        return None
    share = chinese_share(corpus, load_vocab(corpus.vocab_path))
    if share < CHINESE_SHARE:
        return None
    return (
        f"{corpus.data_dir} holds Chinese text ({share:.0%} of its tokens are CJK characters) but was prepared "
        "without --zh-wwm, so --wwm falls back to masking each Chinese character on its own (whole words only "
        "for ## pieces); run `bertgpu prepare --zh-wwm` to mask whole Chinese words"
    )


def warn_wwm_fallback(corpus: ShardedCorpus, cfg: DataConfig) -> None:
    """Warn (once per call: call it once per command) if --wwm cannot mask whole Chinese words on this data."""
    message = wwm_fallback_warning(corpus, cfg)
    if message:
        warnings.warn(message, stacklevel=2)


class PretrainingDataset(torch.utils.data.Dataset):
    """Instances of one epoch; call ``set_epoch`` before iterating a new epoch.

    With ``cfg.wwm``, words are the data's stored word starts when it was prepared with ``--zh-wwm``
    (Chinese words and ``##`` pieces), else ``##`` pieces joined to the piece before them.
    """

    def __init__(self, corpus: ShardedCorpus, cfg: DataConfig, seed: int, vocab: list[str]):
        self.corpus, self.cfg, self.seed = corpus, cfg, seed
        self.special = SpecialIds.from_vocab(vocab)
        self.is_subword = np.array([t.startswith("##") for t in vocab])
        # Segments carry each token's word start beside its id ([n, 2] arrays) when masking uses them.
        self.stored_words = cfg.wwm and corpus.has_word_starts
        # The 10% random replacements are real word pieces: never [CLS], [SEP], [PAD], [MASK] or
        # [unusedN] (the original draws from the whole vocab, which can plant a [SEP] mid-text).
        self.random_ids = np.array([i for i, t in enumerate(vocab) if not (t.startswith("[") and t.endswith("]"))])
        self.max_num_tokens = cfg.max_seq_length - (3 if cfg.nsp else 2)
        if cfg.nsp:
            check_nsp_possible(corpus)
        self._cum = np.zeros(corpus.num_sentences + 1, dtype=np.int64)
        np.cumsum(corpus.sentence_lengths, out=self._cum[1:])
        # --pack: rows are ranges of the corpus's token stream; where each document starts in it
        self.doc_tokens = self._cum[corpus.doc_offsets]
        self.per_document = cfg.pack and cfg.pack_attention == "document"
        self.epoch = -1
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        if epoch == self.epoch:
            return
        self.epoch = epoch
        rng = np.random.default_rng([self.seed, epoch, _TAG_SPANS])
        if self.cfg.pack:  # the same spans every epoch (masking is still drawn afresh)
            if not hasattr(self, "_packed"):
                self._packed = build_packed_spans(self.doc_tokens, self.cfg.max_seq_length, self.per_document)
            self.spans = self._packed
            return
        self.spans = build_instance_spans(
            self.corpus.sentence_lengths,
            self.corpus.doc_offsets,
            self.max_num_tokens,
            self.cfg.short_seq_prob,
            self.cfg.nsp,
            rng,
        )

    def __len__(self) -> int:
        return len(self.spans)

    def _random_segment(self, doc: int, target_len: int, rng: np.random.Generator) -> np.ndarray:
        """Text for a random B: from a random other document, at a random sentence, until target_len."""
        n_docs = len(self.corpus.doc_offsets) - 1
        other = int(rng.integers(n_docs - 1))
        other += other >= doc  # any document but this one
        start, end = int(self.corpus.doc_offsets[other]), int(self.corpus.doc_offsets[other + 1])
        s = int(rng.integers(start, end))
        stop = int(np.searchsorted(self._cum, self._cum[s] + max(target_len, 1), side="left"))
        return self._segment(s, min(max(stop, s + 1), end))

    def _segment(self, start: int, end: int) -> np.ndarray:
        """Sentences [start, end): their token ids, or with stored words an [n, 2] array of (id, starts a word)."""
        ids = self.corpus.tokens(start, end)
        if not self.stored_words:
            return ids
        return np.stack([ids, self.corpus.word_starts(start, end)], axis=1)

    def _packed_pieces(self, start: int, end: int) -> list[np.ndarray]:
        """Tokens [start, end) of the corpus's token stream, one array per document they touch (as ``_segment``
        gives them)."""
        bounds, cum = self.doc_tokens, self._cum
        doc = int(np.searchsorted(bounds, start, side="right")) - 1
        pieces = []
        while start < end:
            stop = min(end, int(bounds[doc + 1]))
            if stop > start:  # the sentences that hold [start, stop), all inside this document
                first = int(np.searchsorted(cum, start, side="right")) - 1
                last = int(np.searchsorted(cum, stop, side="left"))
                pieces.append(self._segment(first, last)[start - cum[first] : stop - cum[first]])
            start, doc = stop, doc + 1
        return pieces

    def fill(self) -> np.ndarray:
        """--pack: the real (non-padding) tokens of each row, special tokens included."""
        return packed_fill(self.spans, self.doc_tokens, self.per_document)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.example(index)

    def example(self, index: int, word_starts: bool = False) -> dict[str, np.ndarray]:
        """Instance ``index`` of the epoch (what ``dataset[index]`` returns); with ``word_starts``, also
        ``word_starts``: where --wwm's words start, per position (for ``bertgpu inspect``)."""
        a_start, a_end, b_end, target, doc = (int(v) for v in self.spans[index])
        rng = np.random.default_rng([self.seed, self.epoch, _TAG_INSTANCE, index])
        if b_end == PACKED:
            return self._encode_packed(self._packed_pieces(a_start, a_end), rng, word_starts)
        a = self._segment(a_start, a_end)
        is_random = 0
        if not self.cfg.nsp:
            b = a[:0]
        elif b_end == SPLIT_SENTENCE and len(a) >= 2:
            cut = int(rng.integers(1, len(a)))
            a, b = a[:cut], a[cut:]
        elif b_end < 0:  # RANDOM_NEXT, or a one-token sentence that cannot be split
            b = self._random_segment(doc, target - len(a), rng)
            is_random = 1
        else:
            b = self._segment(a_end, b_end)
        a, b = truncate_pair(a, b, self.max_num_tokens, rng)
        return self._encode(a, b, is_random, rng, word_starts)

    def _encode(
        self, a: np.ndarray, b: np.ndarray, is_random: int, rng: np.random.Generator, with_word_starts: bool = False
    ) -> dict:
        sp, cfg = self.special, self.cfg
        stored = a.ndim == 2  # (id, starts a word) pairs: the data's stored words
        if stored:
            (a, a_starts), (b, b_starts) = a.T, b.T
        L = cfg.max_seq_length
        n_a = len(a) + 2
        n = n_a + (len(b) + 1 if cfg.nsp else 0)
        ids = np.full(L, sp.pad, dtype=np.int64)
        ids[0] = sp.cls
        ids[1 : n_a - 1] = a
        ids[n_a - 1] = sp.sep
        types = np.zeros(L, dtype=np.int64)
        if cfg.nsp:
            ids[n_a : n - 1] = b
            ids[n - 1] = sp.sep
            types[n_a:n] = 1
        attention = np.zeros(L, dtype=np.int64)
        attention[:n] = 1
        starts = None
        if cfg.wwm:  # where whole words start: stored, or where a position holds no ## piece
            if not stored:
                starts = ~self.is_subword[ids]
            else:
                starts = np.ones(L, dtype=bool)
                starts[1 : n_a - 1] = a_starts
                if cfg.nsp:
                    starts[n_a : n - 1] = b_starts

        # Masked LM: candidates are the real tokens (never [CLS], [SEP] or padding).
        cand = np.ones(n, dtype=bool)
        cand[0] = cand[n_a - 1] = cand[n - 1] = False
        return self._mask(ids, types, attention, starts, cand, is_random, rng, with_word_starts)

    def _encode_packed(self, pieces: list[np.ndarray], rng: np.random.Generator, with_word_starts: bool) -> dict:
        """A --pack row: with ``per_document``, [CLS] piece [SEP] per document piece, and ``attention_mask``
        the piece's number (1, 2, ...; 0 on padding), which the model reads as document bounds (its
        attention kept within each piece, positions from 0 in each); else [CLS] first [SEP] second [SEP] ...
        with the 0/1 mask, one sequence to the model."""
        sp, cfg = self.special, self.cfg
        L = cfg.max_seq_length
        ids = np.full(L, sp.pad, dtype=np.int64)
        attention = np.zeros(L, dtype=np.int64)
        cand = np.zeros(L, dtype=bool)  # the pieces' tokens, never a [CLS], [SEP] or padding
        stored_starts = np.ones(L, dtype=bool)
        pos = 0
        for k, piece in enumerate(pieces):
            if self.per_document or k == 0:
                ids[pos] = sp.cls
                attention[pos] = k + 1
                pos += 1
            tokens = piece[:, 0] if piece.ndim == 2 else piece
            n = len(tokens)
            ids[pos : pos + n] = tokens
            if piece.ndim == 2:
                stored_starts[pos : pos + n] = piece[:, 1]
            cand[pos : pos + n] = True
            ids[pos + n] = sp.sep
            attention[pos : pos + n + 1] = k + 1
            pos += n + 1
        if not self.per_document:
            attention = (attention > 0).astype(np.int64)
        starts = None
        if cfg.wwm:
            starts = stored_starts if self.stored_words else ~self.is_subword[ids]
        types = np.zeros(L, dtype=np.int64)
        return self._mask(ids, types, attention, starts, cand[:pos], 0, rng, with_word_starts)

    def _mask(self, ids, types, attention, starts, cand, is_random, rng, with_word_starts) -> dict:
        """Masked LM over candidate positions ``cand`` (a bool array over the row's first len(cand) tokens:
        its real tokens), as the original's create_masked_lm_predictions: the example's arrays."""
        sp, cfg = self.special, self.cfg
        L, n = cfg.max_seq_length, len(cand)
        cand_pos = np.flatnonzero(cand)
        num_to_predict = min(cfg.max_predictions, max(1, int(round(n * cfg.masked_lm_prob))))
        if cfg.wwm:
            chosen = self._choose_whole_words(starts, cand_pos, num_to_predict, rng)
        else:
            chosen = np.sort(rng.permutation(cand_pos)[:num_to_predict])
        labels = ids[chosen].copy()
        r = rng.random(len(chosen))
        to_mask = r < 0.8
        to_random = r >= 0.9
        ids[chosen[to_mask]] = sp.mask
        ids[chosen[to_random]] = self.random_ids[rng.integers(len(self.random_ids), size=int(to_random.sum()))]

        positions = np.zeros(cfg.max_predictions, dtype=np.int64)
        mlm_labels = np.full(cfg.max_predictions, IGNORE_INDEX, dtype=np.int64)
        positions[: len(chosen)] = chosen
        mlm_labels[: len(chosen)] = labels
        example = {
            "input_ids": ids,
            "token_type_ids": types,
            "attention_mask": attention,
            "mlm_positions": positions,
            "mlm_labels": mlm_labels,
            "nsp_label": np.int64(is_random),  # transformers' convention: 0 = B follows A, 1 = random
        }
        if with_word_starts:  # the words masking used: [CLS], [SEP] and the position after each start one too
            example["word_starts"] = np.ones(L, dtype=bool)
            if starts is not None:
                outside = np.ones(L + 1, dtype=bool)
                outside[1 + cand_pos] = False
                example["word_starts"] = starts | outside[1:] | outside[:-1]
        return example

    def _choose_whole_words(self, starts, cand_pos, num_to_predict, rng) -> np.ndarray:
        """Group candidates into words (a position that does not start a word joins the one before it)
        and take whole words in random order while they fit, as the original does with do_whole_word_mask."""
        cont = ~starts[cand_pos]
        cont[0] = False
        cont[1:] &= np.diff(cand_pos) == 1  # a piece after [SEP] starts a word
        firsts = np.flatnonzero(~cont)
        lengths = np.diff(firsts, append=len(cand_pos))
        sizes = lengths.tolist()  # the loop runs on Python ints: a hundred words per instance, no array each
        taken = np.zeros(len(firsts), dtype=bool)
        count = 0
        for w in rng.permutation(len(firsts)).tolist():
            if count >= num_to_predict:
                break
            if count + sizes[w] > num_to_predict:
                continue
            taken[w] = True
            count += sizes[w]
        return cand_pos[np.repeat(taken, lengths)]  # in position order


class GlobalBatchSampler(torch.utils.data.Sampler):
    """Yields this rank's micro-batches (lists of indices) for the steps of one epoch.

    The epoch's order is one permutation seeded by (seed, epoch). Global batch k is
    ``order[start + k*G : start + (k+1)*G]``, with G = sum(sizes) × accum and ``start`` the instances
    of the epoch already trained (a resumed run); data-parallel rank r takes its share of it (``sizes[r]
    × accum`` instances, see ``sharing``; with equal sizes every dp-th, as DistributedSampler) and
    yields it as ``accum`` micro-batches of ``sizes[r]``. Step k therefore trains on the same instances
    whatever the number of processes, the per-rank sizes or the accumulation steps. The epoch ends when
    fewer than G instances remain.
    """

    def __init__(
        self,
        num_instances: int,
        sizes: list[int],
        dp_rank: int,
        grad_accum: int,
        seed: int,
        epoch: int,
        start_instance: int = 0,
    ):
        self.sizes, self.rank, self.accum = list(sizes), dp_rank, grad_accum
        self.b = self.sizes[dp_rank]
        self.global_batch = sum(self.sizes) * grad_accum
        self.start = start_instance
        self.steps = max(0, num_instances - start_instance) // self.global_batch
        self.order = np.random.default_rng([seed, epoch, _TAG_ORDER]).permutation(num_instances)

    def __len__(self) -> int:
        return self.steps * self.accum

    def __iter__(self):
        G, b = self.global_batch, self.b
        slots = [size * self.accum for size in self.sizes]
        for k in range(self.steps):
            first = self.start + k * G
            mine = share(self.order[first : first + G], slots, self.rank)
            for m in range(self.accum):
                yield mine[m * b : (m + 1) * b].tolist()
