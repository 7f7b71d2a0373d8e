"""WordPiece tokenizer and vocab training, checked against transformers' BERT tokenizers on real text."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import pytest
from transformers import BertTokenizer
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from bertgpu.data.tokenizer import SPECIAL_TOKENS, Tokenizer, load_vocab, train_vocab, vocab_is_cased, vocab_sha256
from bertgpu.errors import UserError

# Text that exercises BERT's normalizer: accents, ß, ligatures, CJK next to Latin, control characters,
# odd whitespace (NBSP, ideographic space, zero-width space, tabs), full-width forms, emoji, a word
# longer than WordPiece's 100-character limit. (No Greek capital sigma: Python's str.lower picks the
# final form σ→ς by context, the Rust normalizer does not, so the pure-Python legacy reference differs.)
TRICKY = [
    "Café Münchner Straße naïve résumé",
    "Hello\u00a0world\u3000中文English混合, (parenthetical) — dash… “quotes” «guillemets»",
    "ﬁnance ½ ⅓ №5 x² ™ ©2024 e\u0301tude Ǆemal İstanbul ÅNGSTRÖM",
    "tab\there\u200bzero\x07bell\x1fsep\r\ncrlf\u2028line sep\x0bvt",
    "ＦＵＬＬ　ｗｉｄｔｈ １２３ 。，！？",
    "emoji 😀👍🏽 ok; 日本語のテキストと한국어 텍스트",
    "unaffable " + "x" * 150 + " end",
    "don't stop-believing: a+b=c; foo@example.com https://example.com/a?b=c#d",
    "",
    "   ",
]


def _lines(path: Path, count: int) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][:count]


@pytest.fixture(scope="module")
def cased_vocab(english_corpus, tmp_path_factory) -> Path:
    return train_vocab([str(english_corpus)], 2000, tmp_path_factory.mktemp("cased") / "vocab.txt", cased=True)


@pytest.fixture(scope="module")
def chinese_vocab(chinese_corpus, tmp_path_factory) -> Path:
    # The People's Daily sample holds ~3,300 distinct characters, all of which must fit.
    with pytest.warns(UserWarning, match="fewer than"):
        return train_vocab([str(chinese_corpus)], 8000, tmp_path_factory.mktemp("zh") / "vocab.txt")


@pytest.fixture(scope="module")
def texts(english_corpus, chinese_corpus) -> list[str]:
    """Hundreds of real corpus lines in both languages plus the tricky cases."""
    return _lines(english_corpus, 600) + _lines(chinese_corpus, 400) + TRICKY


def test_reference_tokenizer_is_real(uncased_vocab):
    """Guards the comparison below: transformers 5.x silently builds an empty vocab from ``vocab_file=``."""
    reference = BertTokenizer(vocab=str(uncased_vocab), do_lower_case=True)
    assert reference("Hello world", add_special_tokens=False)["input_ids"] == [7592, 2088]
    assert Tokenizer(uncased_vocab).encode_batch(["Hello world"]) == [[7592, 2088]]


@pytest.mark.parametrize(
    "vocab_name, lowercase",
    [
        ("uncased_vocab", True),
        ("uncased_vocab", False),
        ("cased_vocab", False),
        ("cased_vocab", True),
        ("chinese_vocab", True),
    ],
)
def test_ids_match_transformers(request, texts, vocab_name, lowercase):
    vocab = str(request.getfixturevalue(vocab_name))
    ours = Tokenizer(vocab, lowercase=lowercase).encode_batch(texts)
    fast = BertTokenizer(vocab=vocab, do_lower_case=lowercase)
    legacy = BertTokenizerLegacy(vocab_file=vocab, do_lower_case=lowercase)  # pure Python, the original algorithm
    for text, ids in zip(texts, ours):
        assert ids == fast(text, add_special_tokens=False)["input_ids"], text
        assert ids == legacy.convert_tokens_to_ids(legacy.tokenize(text)), text


@pytest.mark.parametrize("lowercase", [True, False])
def test_a_long_text_encoded_in_pieces_gives_the_ids_of_the_whole(uncased_vocab, texts, lowercase):
    """A text past ``piece`` characters is cut at spaces and encoded in pieces (faster on long lines): the ids are
    those of the text encoded whole, for real English and Chinese lines, accents, punctuation and runs of spaces,
    and a text without spaces stays one piece."""
    tok = Tokenizer(uncased_vocab, lowercase=lowercase)
    long = ["  ".join(texts), " ".join(texts[::-1]) + " ", "x" * 5000, "é" * 300 + " " + "ü" * 300, ""]
    whole = [e.ids for e in tok.backend.encode_batch(long, add_special_tokens=False)]
    assert tok.encode_batch(long, piece=97) == whole and sum(map(len, whole)) > 20_000
    assert tok.encode_batch(long) == whole  # the default size: each text in one piece or a few


def test_uncased_strips_accents_and_cased_keeps_them(uncased_vocab, cased_vocab):
    uncased = Tokenizer(uncased_vocab)
    tokens = [uncased.vocab[i] for i in uncased.encode_batch(["Café Münchner Straße naïve résumé"])[0]]
    assert tokens == ["cafe", "mu", "##nch", "##ner", "st", "##raße", "naive", "resume"]
    cased = Tokenizer(cased_vocab, lowercase=False)
    assert cased.decode(cased.encode_batch(["Python Objects"])[0]) == "Python Objects"


def test_cjk_characters_are_split_one_per_token(chinese_vocab, chinese_corpus):
    tokenizer = Tokenizer(chinese_vocab)
    line = _lines(chinese_corpus, 1)[0]
    ids = tokenizer.encode_batch([line])[0]
    cjk = [c for c in line if "\u4e00" <= c <= "\u9fff"]
    assert [tokenizer.vocab[i] for i in ids if "\u4e00" <= tokenizer.vocab[i][0] <= "\u9fff"] == cjk
    assert tokenizer.unk_id not in ids
    mixed = [tokenizer.vocab[i] for i in tokenizer.encode_batch(["人民日报abc"])[0]]
    assert mixed[:4] == ["人", "民", "日", "报"]


def test_properties_and_pickling(uncased_vocab):
    tokenizer = Tokenizer(uncased_vocab)
    assert tokenizer.vocab_size == 30522
    specials = (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
    assert specials == (0, 100, 101, 102, 103)
    assert tokenizer.is_subword[tokenizer.vocab.index("##ing")]
    assert not tokenizer.is_subword[tokenizer.vocab.index("sing")]
    tokenizer.encode_batch(["build the Rust tokenizer"])
    blob = pickle.dumps(tokenizer)
    assert len(blob) < 1000  # the path and a flag, not the vocab or the Rust object
    clone = pickle.loads(blob)
    assert clone.encode_batch(TRICKY) == tokenizer.encode_batch(TRICKY)


def test_literal_special_tokens_in_text_are_plain_text(uncased_vocab):
    """As in Google's pretraining pipeline: corpus text cannot forge [MASK] or [SEP]."""
    tokenizer = Tokenizer(uncased_vocab)
    ids = tokenizer.encode_batch(["a [MASK] b [SEP]"])[0]
    assert tokenizer.mask_id not in ids and tokenizer.sep_id not in ids


def test_encode_pair_matches_transformers(uncased_vocab, english_corpus):
    tokenizer = Tokenizer(uncased_vocab)
    reference = BertTokenizer(vocab=str(uncased_vocab))
    lines = _lines(english_corpus, 120)
    for a, b in zip(lines[::2], lines[1::2]):
        for max_length in (5, 9, 32, 128):
            ours = tokenizer.encode_pair(a, b, max_length=max_length)
            theirs = reference(a, b, truncation="longest_first", max_length=max_length)
            assert ours == {k: theirs[k] for k in ours}
            assert 0 in ours["token_type_ids"][1:-1] and 1 in ours["token_type_ids"]  # both segments survive
            assert ours["token_type_ids"].count(0) >= 3 and ours["token_type_ids"].count(1) >= 2
        single = tokenizer.encode_pair(a, max_length=16)
        assert single == {k: v for k, v in reference(a, truncation=True, max_length=16).items() if k in single}


def test_encode_pair_layout_and_limits(uncased_vocab):
    tokenizer = Tokenizer(uncased_vocab)
    encoded = tokenizer.encode_pair("hello world", "a b c d e f g", max_length=7)
    assert encoded == {
        "input_ids": [101, 7592, 2088, 102, 1037, 1038, 102],
        "token_type_ids": [0, 0, 0, 0, 1, 1, 1],
        "attention_mask": [1] * 7,
    }
    with pytest.raises(UserError, match="at least 5"):
        tokenizer.encode_pair("a", "b", max_length=4)
    assert tokenizer.decode(encoded["input_ids"], skip_special_tokens=True) == "hello world a b"


def test_decode_round_trip(uncased_vocab, english_corpus):
    tokenizer = Tokenizer(uncased_vocab)
    lines = _lines(english_corpus, 200)
    encoded = tokenizer.encode_batch(lines)
    for ids in encoded:
        if tokenizer.unk_id not in ids:
            assert tokenizer.encode_batch([tokenizer.decode(ids)])[0] == ids


# --- vocab files --------------------------------------------------------------------------------


def test_load_vocab_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_vocab(tmp_path / "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(UserError, match=f"{empty} is empty"):
        load_vocab(empty)
    partial = tmp_path / "partial.txt"
    partial.write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(UserError, match=r"lacks the special token\(s\) \[CLS\], \[SEP\], \[MASK\]"):
        Tokenizer(partial)
    duplicate = tmp_path / "duplicate.txt"
    duplicate.write_text("\n".join([*SPECIAL_TOKENS, "hello", "world", "hello"]) + "\n")
    with pytest.raises(UserError, match=rf"{duplicate}:8: duplicate vocab entry 'hello', already on line 6"):
        load_vocab(duplicate)


def test_vocab_sha256_ignores_line_endings(uncased_vocab, tmp_path):
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(uncased_vocab.read_bytes().replace(b"\n", b"\r\n"))
    assert load_vocab(crlf) == load_vocab(uncased_vocab)
    assert vocab_sha256(crlf) == vocab_sha256(uncased_vocab)


def test_vocab_is_cased(uncased_vocab, cased_vocab, chinese_vocab, tmp_path):
    assert vocab_is_cased(cased_vocab)
    assert not vocab_is_cased(uncased_vocab) and not vocab_is_cased(chinese_vocab)
    domain = tmp_path / "domain.txt"  # a few capitalized words in [unusedN] slots keep it uncased
    vocab = load_vocab(uncased_vocab)
    domain.write_text("".join(t + "\n" for t in [vocab[0], "COVID", "mRNA", *vocab[3:]]))
    assert not vocab_is_cased(domain)


# --- vocab training -----------------------------------------------------------------------------


def test_train_vocab_has_bert_layout(english_corpus, tmp_path):
    out = train_vocab([str(english_corpus)], 1000, tmp_path / "vocab.txt", progress=False)
    vocab = load_vocab(out)
    assert len(vocab) == 1000
    assert [vocab.index(t) for t in SPECIAL_TOKENS] == [0, 100, 101, 102, 103]
    assert vocab[1:100] == [f"[unused{i}]" for i in range(99)]
    assert "the" in vocab and any(t.startswith("##") for t in vocab)
    assert all(t == t.lower() for t in vocab[104:])
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left behind


def test_train_vocab_reads_gz_and_folders(english_corpus, tmp_path):
    folder = tmp_path / "corpus"
    (folder / "part").mkdir(parents=True)
    text = english_corpus.read_bytes()
    half = text.index(b"\n\n", len(text) // 2) + 2
    (folder / "a.txt").write_bytes(text[:half])
    with gzip.open(folder / "part" / "b.txt.gz", "wb") as f:
        f.write(text[half:])
    from_folder = load_vocab(train_vocab([str(folder)], 1000, tmp_path / "folder.txt", progress=False))
    from_gz = load_vocab(train_vocab([str(folder / "part" / "b.txt.gz")], 1000, tmp_path / "gz.txt", progress=False))
    assert len(from_folder) == len(from_gz) == 1000
    assert {"python", "function"} <= set(from_folder)


def test_train_vocab_fewer_tokens_than_asked_warns(english_corpus, tmp_path):
    with pytest.warns(UserWarning, match="fewer than the 20,000 asked for"):
        out = train_vocab([str(english_corpus)], 20000, tmp_path / "vocab.txt", progress=False)
    assert 1000 < len(load_vocab(out)) < 20000


def test_train_vocab_errors(english_corpus, tmp_path):
    out = tmp_path / "vocab.txt"
    with pytest.raises(UserError, match="vocab size 150 is too small"):
        train_vocab([str(english_corpus)], 150, out)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n  \n")
    with pytest.raises(UserError, match=f"no text to learn a vocab from in {blank}"):
        train_vocab([str(blank)], 1000, out, progress=False)
    with pytest.raises(UserError, match="no-such-file.txt"):
        train_vocab([str(tmp_path / "no-such-file.txt")], 1000, out)
    small = tmp_path / "small.bin"
    small.write_bytes(b"some text\n\0\0\0\n")
    with pytest.raises(UserError, match=f"{small}: is a binary file"):
        train_vocab([str(small)], 1000, out, progress=False)
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_train_vocab_gives_a_chinese_corpus_the_size_asked_for(chinese_corpus, tmp_path):
    """Chinese characters never merge, so the vocab is mostly characters: the alphabet cap (3/4 of the
    learned slots) must leave room for them. With a cap of 1/2, People's Daily at --size 3000 gave only
    2,460 entries and a warning blaming the corpus."""
    vocab = load_vocab(train_vocab([str(chinese_corpus)], 3000, tmp_path / "vocab.txt", progress=False))
    assert len(vocab) == 3000
    assert sum(1 for t in vocab if len(t) == 1 and "\u4e00" <= t <= "\u9fff") > 2000
