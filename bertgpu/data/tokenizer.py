"""WordPiece with BERT's semantics, on Hugging Face ``tokenizers`` for speed.

BERT's basic tokenizer (clean control characters, split CJK characters and punctuation, lowercase
and strip accents when uncased) followed by greedy longest-match WordPiece with ``##`` continuations,
so ids match ``transformers.BertTokenizer`` and the original Google implementation on the same vocab.
Special tokens written literally in the text (``[MASK]``) are split like any other text, as in the
original pretraining data pipeline, so corpus text can never forge a special token.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import WordPiece

from bertgpu import atomic
from bertgpu.data.corpus import CorpusReader, resolve_inputs
from bertgpu.data.encoding import decode_text
from bertgpu.errors import UserError
from bertgpu.paths import refuse_clobbering

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_UNUSED = 99  # bert-base-uncased: [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103
_FIRST_LEARNED = 1 + _UNUSED + 4
MIN_LEARNED_TOKENS = 100  # fewer cannot even hold the alphabet of an English corpus


def load_vocab(path: str | os.PathLike) -> list[str]:
    """Read a BERT ``vocab.txt`` (one token per line, the line number is the id) and check it is usable."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"vocab file {path} does not exist") from None
    except OSError as e:
        raise UserError(f"vocab file {path} cannot be read: {e.strerror}") from None
    text = decode_text(data, path, "vocab file", marks=False)
    tokens = [t.removesuffix("\r") for t in text.split("\n")]
    if tokens and tokens[-1] == "":
        tokens.pop()  # the final newline
    if not tokens:
        raise UserError(f"vocab file {path} is empty")
    first_line: dict[str, int] = {}
    for line, token in enumerate(tokens, start=1):
        if not token:
            raise UserError(f"{path}:{line}: empty line in vocab file (each line must hold one token)")
        if token in first_line:
            raise UserError(f"{path}:{line}: duplicate vocab entry {token!r}, already on line {first_line[token]}")
        first_line[token] = line
    missing = [t for t in SPECIAL_TOKENS if t not in first_line]
    if missing:
        raise UserError(f"vocab file {path} lacks the special token(s) {', '.join(missing)}")
    return tokens


def vocab_sha256(path: str | os.PathLike) -> str:
    """Fingerprint of the token list (not the file bytes, so CRLF and LF copies agree)."""
    return _tokens_sha256(load_vocab(path))


def vocab_is_cased(path: str | os.PathLike) -> bool:
    """Whether a vocab keeps case, judged by its tokens: uncased vocabs (bert-base-uncased) hold no capitals.

    A few capitalized entries (domain words put into [unusedN] slots) do not make a vocab cased;
    more than 1% of tokens do (a cased vocab trained on English has about 10%).
    """
    tokens = [t for t in load_vocab(path) if not (t.startswith("[") and t.endswith("]"))]
    return sum(t != t.lower() for t in tokens) > 0.01 * len(tokens)


def _tokens_sha256(tokens: Sequence[str]) -> str:
    return hashlib.sha256("".join(t + "\n" for t in tokens).encode("utf-8")).hexdigest()


def _bert_pipeline(model: tokenizers.models.Model, lowercase: bool) -> tokenizers.Tokenizer:
    """A ``tokenizers.Tokenizer`` doing BERT's basic tokenization in front of ``model``."""
    backend = tokenizers.Tokenizer(model)
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    return backend


# A text longer than this is encoded as pieces cut at spaces, which the Rust tokenizer encodes in parallel and, on
# one core, three times faster than the whole: a 10 MB line of words took 5.3 s whole, 1.8 s in 64 Ki-character
# pieces, with the same ids (a space ends a token and never joins two).
PIECE_CHARS = 1 << 16


def _pieces(text: str, size: int) -> list[str]:
    """``text`` cut after a space near every ``size`` characters (the last space before the mark, else the first
    after it; a text without spaces stays whole). Joined, the pieces are ``text``."""
    pieces, start = [], 0
    while len(text) - start > size:
        end = text.rfind(" ", start, start + size) + 1 or text.find(" ", start + size) + 1
        if not end:
            break
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


class Tokenizer:
    """BERT WordPiece tokenizer over a ``vocab.txt``.

    Pickles as its vocab path and flag (the file is re-read on unpickling) and builds the Rust
    tokenizer lazily on first use, so sending one to a worker process is cheap and safe.
    """

    def __init__(self, vocab_path: str | os.PathLike, lowercase: bool = True):
        self.vocab = load_vocab(vocab_path)
        self.vocab_path = Path(os.path.abspath(vocab_path))  # absolute, so a worker with another cwd finds it
        self.lowercase = lowercase
        ids = {token: i for i, token in enumerate(self.vocab)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (ids[t] for t in SPECIAL_TOKENS)
        self.is_subword = np.array([t.startswith("##") and len(t) > 2 for t in self.vocab], dtype=bool)
        self._backend: tokenizers.Tokenizer | None = None
        self._pair_backend: tokenizers.Tokenizer | None = None

    def __reduce__(self) -> tuple:
        return Tokenizer, (self.vocab_path, self.lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def sha256(self) -> str:
        return _tokens_sha256(self.vocab)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The Rust tokenizer without special tokens or truncation (built on first use)."""
        if self._backend is None:
            model = WordPiece({t: i for i, t in enumerate(self.vocab)}, unk_token="[UNK]", max_input_chars_per_word=100)
            self._backend = _bert_pipeline(model, self.lowercase)
        return self._backend

    def encode_batch(self, texts: list[str], piece: int = PIECE_CHARS) -> list[list[int]]:
        """Token ids of each text, without special tokens, in one call into Rust (a text longer than ``piece``
        characters as pieces cut at spaces: ``_pieces``)."""
        pieces, owner = [], []
        for i, text in enumerate(texts):
            cut = _pieces(text, piece)
            pieces += cut
            owner += [i] * len(cut)
        encoded = self.backend.encode_batch_fast(pieces, add_special_tokens=False)
        if len(pieces) == len(texts):
            return [e.ids for e in encoded]
        ids: list[list[int]] = [[] for _ in texts]
        for i, e in zip(owner, encoded):
            ids[i] += e.ids
        return ids

    def encode_batch_with_offsets(self, texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
        """Token ids of each text and, for each token, the (start, end) characters of the text it comes from."""
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encodings], [e.offsets for e in encodings]

    def encode_pair(self, a: str, b: str | None = None, max_length: int = 128) -> dict[str, list[int]]:
        """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` with segment ids and attention mask, at most ``max_length``.

        Truncation is longest-first (as in BERT and ``transformers``), so with ``max_length >= 5`` neither
        segment of a pair is ever dropped entirely.
        """
        least = 3 if b is None else 5
        if max_length < least:
            what = "text" if b is None else "pair"
            raise UserError(f"max_length {max_length} is too short: a {what} needs at least {least}")
        if self._pair_backend is None:
            self._pair_backend = tokenizers.Tokenizer.from_str(self.backend.to_str())
            self._pair_backend.post_processor = processors.BertProcessing(
                ("[SEP]", self.sep_id), ("[CLS]", self.cls_id)
            )
        backend = self._pair_backend
        if (backend.truncation or {}).get("max_length") != max_length:
            backend.enable_truncation(max_length, strategy="longest_first")
        encoding = backend.encode(a, b)
        return {
            "input_ids": encoding.ids,
            "token_type_ids": encoding.type_ids,
            "attention_mask": encoding.attention_mask,
        }

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` with ``##`` pieces joined (lowercased and accent-free if the tokenizer is)."""
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            special = {self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id}
            ids = [i for i in ids if i not in special]
        return self.backend.decode(ids, skip_special_tokens=False)


def train_vocab(
    inputs: list[str],
    size: int,
    out: str | os.PathLike,
    cased: bool = False,
    progress: bool = True,
    text_field: str = "text",
    overwrite: bool = False,
) -> Path:
    """Learn a WordPiece vocab of ``size`` tokens from a corpus and write it to ``out`` (a ``vocab.txt``).

    Ids follow bert-base-uncased ([PAD]=0, [unused0..98], [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103),
    so the unused slots stay free for later additions as in Google's vocabs. The file appears only when
    complete (written to a temporary file, then renamed); an existing ``out`` is replaced only with
    ``overwrite``. Training the same corpus twice may give slightly different vocabs: the ``tokenizers``
    trainer breaks ties between equally frequent merges in the order of a Rust hash map, which is
    seeded at random in every process and cannot be fixed from outside (huggingface/tokenizers#1794;
    ``RAYON_NUM_THREADS=1`` does not help), so keep the file rather than expecting to regenerate it. The corpus
    may hold plain text, JSON Lines and Parquet files, as for ``prepare`` (records' text in ``text_field``).
    """
    refuse_clobbering({"--out": out}, {"the corpus": inputs})
    if Path(out).exists() and not overwrite:
        raise UserError(
            f"--out {out} already exists; pass --overwrite to replace it (a vocab cannot be trained "
            "twice alike: keep the one your data was prepared with)"
        )
    files = resolve_inputs(inputs)
    if size < _FIRST_LEARNED + MIN_LEARNED_TOKENS:
        raise UserError(f"vocab size {size} is too small: it must be at least {_FIRST_LEARNED + MIN_LEARNED_TOKENS}")
    learned_slots = size - _FIRST_LEARNED
    # Every character needs a slot (twice for Latin: "a" and "##a"); tokenizers' default cap of 1,000
    # characters would turn most of a Chinese corpus into [UNK]. First 3/4 of the slots; when that cap
    # binds and word pieces leave slots empty (Chinese characters are words of their own and never
    # merge), once more with the empty slots given to the next most frequent characters.
    alphabet_cap = learned_slots * 3 // 4
    reader = CorpusReader(files, text_field=text_field)
    learned = _train_wordpiece(reader, learned_slots, alphabet_cap, cased, progress)
    if not learned:
        raise UserError(f"no text to learn a vocab from in {', '.join(map(str, inputs))}: the corpus is empty")
    for message in reader.warnings:
        warnings.warn(message, stacklevel=2)
    cap_binds = sum(1 for t in learned if len(t) == 1) >= alphabet_cap
    if len(learned) < learned_slots and cap_binds:
        # A little more than the empty slots: the trainer's merges vary a little from run to run (see
        # above), and what overflows is cut below (the last, rarest merges).
        alphabet_cap += learned_slots - len(learned) + max(8, learned_slots // 100)
        learned = _train_wordpiece(
            CorpusReader(files, text_field=text_field), learned_slots, alphabet_cap, cased, progress
        )
        cap_binds = sum(1 for t in learned if len(t) == 1) >= alphabet_cap
    tokens = ["[PAD]", *(f"[unused{i}]" for i in range(_UNUSED)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += learned[:learned_slots]
    if len(tokens) < size:
        why = (
            f"its {alphabet_cap:,} most frequent characters are in and nothing more merges; its rarer "
            f"characters will be [UNK] (a larger --size keeps more of them)"
            if cap_binds
            else "no further word piece occurs twice"
        )
        warnings.warn(
            f"the corpus gives {len(tokens):,} vocab entries, fewer than the {size:,} asked for: {why}", stacklevel=2
        )
    return atomic.write_text(Path(out), "".join(t + "\n" for t in tokens))


def coverage(
    vocab_path: str | os.PathLike, inputs: list[str], cased: bool, text_field: str = "text", max_lines: int = 20_000
) -> tuple[int, int]:
    """``([UNK] tokens, tokens)`` of the first ``max_lines`` lines of a corpus under a vocab: how much of
    the text the vocab can spell (a vocab trained on the corpus leaves only rare characters out)."""
    tokenizer = Tokenizer(vocab_path, lowercase=not cased)
    lines = list(islice(CorpusReader(resolve_inputs(inputs), text_field=text_field).lines(), max_lines))
    unknown = total = 0
    for batch in _batches(iter(lines)):
        for ids in tokenizer.encode_batch(batch):
            total += len(ids)
            unknown += ids.count(tokenizer.unk_id)
    return unknown, total


def _train_wordpiece(
    reader: CorpusReader, learned_slots: int, alphabet_cap: int, cased: bool, progress: bool
) -> list[str]:
    """The learned tokens (special tokens excluded), in the trainer's id order."""
    trainer = trainers.WordPieceTrainer(
        vocab_size=learned_slots + len(SPECIAL_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        limit_alphabet=alphabet_cap,
        continuing_subword_prefix="##",
        show_progress=progress and sys.stderr.isatty(),  # off a terminal it only prints blank lines
    )
    backend = _bert_pipeline(WordPiece(unk_token="[UNK]"), lowercase=not cased)
    backend.train_from_iterator(_batches(reader.lines()), trainer=trainer)
    return [t for t, _ in sorted(backend.get_vocab().items(), key=lambda kv: kv[1]) if t not in SPECIAL_TOKENS]


def _batches(lines: Iterator[str], batch: int = 1000) -> Iterator[list[str]]:
    """Group lines so the Rust trainer crosses the Python boundary once per batch, not per line."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == batch:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# WordPiece tokens per English word (a word of two or more ASCII letters) above which a vocab splits the text
# far more than one made for it. Measured on 2026-11-27 over the first 2,000 lines of real corpora
# (/work/shared/DATA.md: the Python reference, the Python 3.11 docs, WordNet's glosses): a vocab trained on
# the text (2k-30k tokens) or bert-base-uncased's gives 1.00-1.30; an English vocab trained on another of
# them 1.28 (30k tokens) to 1.50 (8k); bert-base-chinese's 1.82-1.86 (with 0.02-0.4% [UNK], which the
# [UNK] check lets through), and a 2k English vocab of another domain 1.63-2.02. Chinese characters are
# tokens of their own, split no further (their misfit is [UNK], checked apart); other alphabets are not judged.
MAX_PIECES_PER_WORD = 1.6
# The sample judges only text that is English enough: this many words, and this share of its words.
_MIN_WORDS, _MIN_WORD_SHARE = 500, 0.25
# The start of the text that is judged: 2,000 lines, each cut at 10,000 characters, a million characters in all
# (a corpus of one 10 MB line must not be tokenized twice).
_SAMPLE_LINES, _SAMPLE_LINE_CHARS, _SAMPLE_CHARS = 2000, 10_000, 1_000_000


def _start_of(lines: Iterable[str]) -> list[str]:
    """The first lines of a text, as much of them as the fragmentation check reads."""
    sample, chars = [], 0
    for line in islice(lines, _SAMPLE_LINES):
        sample.append(line[:_SAMPLE_LINE_CHARS])
        chars += len(sample[-1])
        if chars >= _SAMPLE_CHARS:
            break
    return sample


def pieces_per_word(tokenizer: Tokenizer, lines: list[str]) -> tuple[float, int]:
    """(WordPiece tokens per English word, English words) of ``lines``: how finely the vocab splits
    words of two or more ASCII letters (1.0: each is a token; a word the vocab cannot spell, [UNK], is one
    token). The words are BERT's (split at whitespace and punctuation); the second value is 0 where the
    lines hold too few English words, or too small a share of their words, to judge."""
    pieces = words = all_words = 0
    for line, encoding in zip(lines, tokenizer.backend.encode_batch(lines, add_special_tokens=False)):
        counts: dict[int, int] = {}
        for word in encoding.word_ids:
            if word is not None:
                counts[word] = counts.get(word, 0) + 1
        all_words += len(counts)
        for word, n in counts.items():
            start, end = encoding.word_to_chars(word)
            text = line[start:end]
            if len(text) >= 2 and text.isascii() and text.isalpha():
                pieces, words = pieces + n, words + 1
    if words < _MIN_WORDS or words < _MIN_WORD_SHARE * all_words:
        return 0.0, 0
    return pieces / words, words


def fragmentation_warning(
    tokenizer: Tokenizer, lines: Iterable[str], vocab: str | os.PathLike, text: str = "the corpus's"
) -> str | None:
    """One line when ``vocab`` splits the English words of the start of ``lines`` (a corpus, or a training
    file's texts; ``text`` names it) into more than ``MAX_PIECES_PER_WORD`` tokens each."""
    ratio, words = pieces_per_word(tokenizer, _start_of(lines))
    if not words or ratio <= MAX_PIECES_PER_WORD:
        return None
    return (
        f"{vocab} splits {text} English words into {ratio:.2f} tokens each ({words:,} words sampled from "
        f"its start), above the {MAX_PIECES_PER_WORD} of a vocab made for another language or domain (one made "
        "for such text gives 1.0-1.3): sequences hold less text and the model learns less per token; train a "
        "vocab on this text with `bertgpu vocab`"
    )
