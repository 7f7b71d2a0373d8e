"""Where words start, for Chinese whole-word masking (``prepare --zh-wwm``), as Chinese-BERT-wwm does it.

BERT tokenizes Chinese one character per token, so its ``##`` marks cannot say that 模 and 型 form
the word 模型. ``prepare --zh-wwm`` segments every sentence into words with jieba (``rjieba``: the
Rust port, jieba-rs, with jieba's dictionary and HMM for words the dictionary lacks, about 20 times
faster than jieba in Python) and stores, for every token, whether it starts a word. The token ids do
not change: they are those of plain ``prepare`` (a bert-base-chinese vocab and checkpoint stay
compatible); ``pretrain --wwm`` reads the word starts and masks every token of a word together.

A token continues the word of the token before it (in the same sentence) when

- it is a ``##`` piece: WordPiece's grouping, as plain ``--wwm`` has it (Latin words keep it), or
- one Chinese word covers both the last character of the token before and the first character of
  this one. A Chinese word is a jieba word that holds a CJK character (in BERT's sense: the
  characters its basic tokenizer makes tokens of their own): 模型, 一九九八年, 李小龍, T恤, B超.

Everything else starts a word. Words and tokens are matched through the tokenizer's character
offsets into the original sentence, which is also what jieba segments, so whatever the tokenizer
does to the text in between agrees with the segmentation by construction:

- a character the vocab lacks is ``[UNK]``, which keeps its character's offsets: a word with a rare
  character is masked whole, [UNK] included;
- lower-casing, accent stripping (café → cafe), dropped control characters and full-width forms
  (ＣＥＯ, １９９８) change the token, not where it comes from in the text;
- a token (a Latin word, a number) that crosses several jieba words joins a Chinese word that covers
  its first or last character (jieba: 3.5 | 万元; BERT: 3 . 5 万 元: only 万元 is one word);
- jieba words without a CJK character (3.5, www.example.com, e.g) are not joined: the tokenizer's
  own words stand there, with their ``##`` pieces;
- whitespace and punctuation are words of their own in jieba and never tokens of a word in BERT.

The word starts of a sentence depend on that sentence alone, so the shards stay byte-identical for
any number of workers.
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from itertools import chain

import numpy as np

from bertgpu.data.tokenizer import Tokenizer
from bertgpu.errors import require

SEGMENTER = "rjieba"

# BERT's _is_chinese_char: the CJK Unified Ideographs blocks, extensions A-F and the compatibility ideographs.
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)

_cut: Callable[[str], list[str]] | None = None  # rjieba.cut, imported once per process
_own_token: np.ndarray | None = None  # per BMP code point: always a token of its own (CJK or punctuation)


def segmenter_name() -> str:
    """The segmenter and its version (recorded in meta.json)."""
    try:
        return f"{SEGMENTER} {version(SEGMENTER)}"
    except PackageNotFoundError:
        return f"{SEGMENTER} (not installed)"


def check_available() -> None:
    """Raise a UserError saying what to install if ``--zh-wwm`` cannot segment here."""
    _segmenter()


def _segmenter() -> Callable[[str], list[str]]:
    global _cut
    if _cut is None:
        _cut = require(
            "rjieba",
            "--zh-wwm segments Chinese words with the rjieba package: pip install "
            "'bertgpu[zh]' (or pip install rjieba)",
        ).cut
    return _cut


def segment(text: str) -> list[str]:
    """The words of ``text`` as jieba cuts them (with its HMM for unknown words); they concatenate to ``text``."""
    return _segmenter()(text)


def is_cjk(codepoints: np.ndarray) -> np.ndarray:
    """Whether each code point is a CJK character in BERT's sense (a token of its own)."""
    out = np.zeros(codepoints.shape, dtype=bool)
    for low, high in _CJK_RANGES:
        out |= (codepoints >= low) & (codepoints <= high)
    return out


def _is_own_token(codepoints: np.ndarray) -> np.ndarray:
    """Whether each code point always becomes exactly one token: a CJK character or punctuation (BERT's
    basic tokenizer splits both off as words of one character, which normalisation keeps one character)."""
    global _own_token
    if _own_token is None:
        bmp = np.arange(0x10000, dtype=np.uint32)
        _own_token = is_cjk(bmp) | np.array([unicodedata.category(chr(c)).startswith("P") for c in range(0x10000)])
        _own_token[[c for c in range(128) if chr(c) in string.punctuation]] = True
    out = is_cjk(codepoints)
    bmp = codepoints < 0x10000
    out[bmp] |= _own_token[codepoints[bmp]]
    return out


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def encode(tokenizer: Tokenizer, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
    """The token ids of each text (``tokenizer.encode_batch``'s) and, over all their tokens end to end,
    True where a token starts a word (see the module's docstring).

    Tokens are matched to characters through the tokenizer's offsets. A text made only of CJK characters
    and punctuation (most Chinese sentences) needs none: each of its characters is one token, in order,
    and the token count checks it; such texts are tokenized without offsets, which is faster.
    """
    n_texts = len(texts)
    if not n_texts:
        return [], np.zeros(0, dtype=bool)
    joined = "".join(texts)
    codepoints = _codepoints(joined)
    text_lengths = np.fromiter(map(len, texts), dtype=np.int64, count=n_texts)
    text_base = np.zeros(n_texts, dtype=np.int64)
    np.cumsum(text_lengths[:-1], out=text_base[1:])
    others = np.zeros(len(joined) + 1, dtype=np.int64)  # characters that are not always one token, cumulated
    np.cumsum(~_is_own_token(codepoints), out=others[1:])
    simple = others[text_base + text_lengths] == others[text_base]

    ids: list[list[int]] = [[] for _ in range(n_texts)]
    plain = np.flatnonzero(simple)
    for i, encoded in zip(plain, tokenizer.encode_batch([texts[i] for i in plain])):
        ids[i] = encoded
    simple[plain[[len(ids[i]) != text_lengths[i] for i in plain]]] = False  # not one token a character: offsets
    rest = np.flatnonzero(~simple)
    rest_ids, rest_offsets = tokenizer.encode_batch_with_offsets([texts[i] for i in rest])
    for i, encoded in zip(rest, rest_ids):
        ids[i] = encoded

    counts = np.fromiter(map(len, ids), dtype=np.int64, count=n_texts)
    n = int(counts.sum())
    if not n:
        return ids, np.zeros(0, dtype=bool)
    token_ids = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=n)
    sentence = np.repeat(np.arange(n_texts), counts)
    first_token = np.zeros(n_texts, dtype=np.int64)
    np.cumsum(counts[:-1], out=first_token[1:])
    # (first, last) character of every token in the texts end to end: a simple text's k-th token is its k-th character.
    first = text_base[sentence] + np.arange(n) - first_token[sentence]
    last = first.copy()
    with_offsets = ~simple[sentence]
    n_rest = int(with_offsets.sum())
    if n_rest:
        spans = np.fromiter(
            chain.from_iterable(chain.from_iterable(rest_offsets)), dtype=np.int64, count=2 * n_rest
        ).reshape(n_rest, 2)
        base = text_base[sentence[with_offsets]]
        first[with_offsets] = base + spans[:, 0]
        last[with_offsets] = base + np.maximum(spans[:, 1] - 1, spans[:, 0])
    np.clip(first, 0, len(joined) - 1, out=first)
    np.clip(last, 0, len(joined) - 1, out=last)

    # The words, in the same coordinates (a text's words concatenate to the text).
    segmented = list(chain.from_iterable(map(_segmenter(), texts)))
    word_lengths = np.fromiter(map(len, segmented), dtype=np.int64, count=len(segmented))
    word_lengths = word_lengths[word_lengths > 0]
    if int(word_lengths.sum()) != len(joined):
        raise RuntimeError(
            f"{segmenter_name()} returned words that do not add up to the text "
            f"({int(word_lengths.sum())} characters of {len(joined)})"
        )
    word_of_char = np.repeat(np.arange(len(word_lengths)), word_lengths)
    first_char = np.zeros(len(word_lengths), dtype=np.int64)
    np.cumsum(word_lengths[:-1], out=first_char[1:])
    chinese_word = np.logical_or.reduceat(is_cjk(codepoints), first_char)

    cont = tokenizer.is_subword[token_ids]
    word = word_of_char[first[1:]]
    cont[1:] |= (word == word_of_char[last[:-1]]) & chinese_word[word]
    cont[1:] &= sentence[1:] == sentence[:-1]
    cont[0] = False
    return ids, ~cont
