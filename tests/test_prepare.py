"""Corpus reading, ``prepare`` (corpus → token shards) and ``ShardedCorpus``, on the real sample corpora."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from bertgpu.data import shard_writer
from bertgpu.data.corpus import CorpusReader, resolve_inputs
from bertgpu.data.shard_writer import prepare
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import Tokenizer, vocab_sha256
from bertgpu.errors import UserError


def _documents(*texts: str) -> list[list[str]]:
    """The documents of files with these contents, by the format's rules, parsed independently of CorpusReader."""
    docs = []
    for text in texts:
        for block in text.replace("\r\n", "\n").split("\n\n"):
            lines = [line.strip() for line in block.split("\n") if line.strip()]
            if lines:
                docs.append(lines)
    return docs


def _all_tokens(corpus: ShardedCorpus) -> list[list[int]]:
    return [corpus.tokens(i, i + 1).tolist() for i in range(corpus.num_sentences)]


def _expected(tokenizer: Tokenizer, docs: list[list[str]]) -> tuple[list[list[int]], list[int]]:
    """Sentence ids and sentences per document, with empty sentences and documents dropped."""
    sentences, per_document = [], []
    for doc in docs:
        ids = [s for s in tokenizer.encode_batch(doc) if s]
        if ids:
            sentences.extend(ids)
            per_document.append(len(ids))
    return sentences, per_document


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def english_shards(english_corpus, uncased_vocab, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "en"
    prepare([str(english_corpus)], str(uncased_vocab), str(out), shard_tokens=8192, progress=False)
    return out


def test_shards_hold_the_tokenized_corpus(english_shards, english_corpus, uncased_vocab):
    corpus = ShardedCorpus(english_shards)
    tokenizer = Tokenizer(uncased_vocab)
    sentences, per_document = _expected(tokenizer, _documents(english_corpus.read_text(encoding="utf-8")))
    assert _all_tokens(corpus) == sentences
    assert np.diff(corpus.doc_offsets).tolist() == per_document
    assert corpus.sentence_lengths.tolist() == [len(s) for s in sentences]
    assert corpus.sentence_lengths.dtype == np.int32 and corpus.doc_offsets.dtype == np.int64
    assert (corpus.num_documents, corpus.num_sentences, corpus.num_tokens) == (
        len(per_document),
        len(sentences),
        sum(map(len, sentences)),
    )
    first = corpus.tokens(0, 1)
    assert first.dtype == np.int64
    assert tokenizer.encode_batch([tokenizer.decode(first)])[0] == first.tolist()


def test_meta_and_layout(english_shards, uncased_vocab):
    meta = json.loads((english_shards / "meta.json").read_text())
    assert meta["format"] == "bertgpu-shards" and meta["version"] == 2 and meta["word_starts"] is None
    assert meta["vocab_sha256"] == vocab_sha256(uncased_vocab) == vocab_sha256(english_shards / "vocab.txt")
    assert (meta["vocab_size"], meta["lowercase"], meta["token_dtype"], meta["bad_lines"]) == (30522, True, "uint16", 0)
    assert len(meta["shards"]) > 3, "shard_tokens=8192 should split the corpus"
    for key in ("documents", "sentences", "tokens"):
        assert meta[key] == sum(s[key] for s in meta["shards"])
    for shard in meta["shards"]:
        tokens = np.fromfile(english_shards / f"{shard['name']}.tokens", dtype=np.uint16)
        sentences = np.fromfile(english_shards / f"{shard['name']}.sentences", dtype=np.int64)
        documents = np.fromfile(english_shards / f"{shard['name']}.documents", dtype=np.int64)
        assert len(tokens) == shard["tokens"] and sentences[0] == 0 and sentences[-1] == len(tokens)
        assert len(sentences) == shard["sentences"] + 1 and documents[0] == 0 and documents[-1] == shard["sentences"]
        assert len(documents) == shard["documents"] + 1
        # Documents are whole: a shard overflows only when one document alone exceeds the budget.
        assert shard["tokens"] <= 8192 or shard["documents"] == 1
    corpus = ShardedCorpus(english_shards)
    assert corpus.meta == meta and corpus.vocab_path == english_shards / "vocab.txt"
    assert corpus.vocab_sha256 == meta["vocab_sha256"] and corpus.vocab_size == 30522
    for start, end in zip(corpus.doc_offsets[:-1], corpus.doc_offsets[1:]):
        corpus.tokens(int(start), int(end))  # every document lies within one shard


def test_documents_split_at_blank_lines_and_files(uncased_vocab, tmp_path):
    a = "First sentence.\nSecond one.\n\n\nThird, alone.\n  \nFourth\r\nfifth\n"
    b = "Sixth in a new file.\n\n\x07\n\nseventh\n\n"  # "\x07" tokenizes to nothing: sentence and document dropped
    (tmp_path / "a.txt").write_text(a)
    (tmp_path / "b.txt").write_text(b)
    inputs = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    prepare(inputs, str(uncased_vocab), str(tmp_path / "out"), progress=False)
    corpus = ShardedCorpus(tmp_path / "out")
    tokenizer = Tokenizer(uncased_vocab)
    docs = [
        [tokenizer.decode(corpus.tokens(i, i + 1)) for i in range(s, e)]
        for s, e in zip(corpus.doc_offsets[:-1], corpus.doc_offsets[1:])
    ]
    assert docs == [
        ["first sentence.", "second one."],
        ["third, alone."],
        ["fourth", "fifth"],
        ["sixth in a new file."],
        ["seventh"],
    ]


def test_document_without_blank_lines_is_cut(english_corpus, uncased_vocab, tmp_path, monkeypatch):
    """A corpus with no blank lines is not one document held whole: it is cut every MAX_DOCUMENT_CHARS
    characters (at a line end), with a warning naming where, and the pieces spread over the workers."""
    from bertgpu.data import corpus as corpus_module

    monkeypatch.setattr(corpus_module, "MAX_DOCUMENT_CHARS", 5_000)
    lines = [line for line in english_corpus.read_text().splitlines() if line.strip()]
    flat = tmp_path / "flat.txt"
    flat.write_text("\n".join(lines) + "\n\nA short document.\n")
    reader = CorpusReader([flat])
    docs = [doc.lines for doc in reader.documents()]
    assert [line for doc in docs for line in doc] == lines + ["A short document."]
    assert docs[-1] == ["A short document."]
    for doc in docs[:-2]:  # every piece but the last of the long document reached the bound, and no more
        assert sum(map(len, doc)) >= 5_000 > sum(map(len, doc[:-1]))
    assert len(docs) > 10 and reader.cut_documents == 1
    assert reader.warnings == [
        f"1 document(s) ran past 5,000 characters without a blank line and were cut into "
        f"documents of that size (first cut at {flat}:{len(docs[0])}); the format puts a "
        "blank line between documents"
    ]
    monkeypatch.setattr(shard_writer, "CHUNK_CHARS", 20_000)
    with pytest.warns(UserWarning, match="were cut into documents"):
        meta = prepare([str(flat)], str(uncased_vocab), str(tmp_path / "out"), workers=2, progress=False)
    assert meta["documents"] == len(docs)


def test_workers_give_identical_output(english_corpus, english_shards, uncased_vocab, tmp_path, monkeypatch):
    monkeypatch.setattr(shard_writer, "CHUNK_CHARS", 20_000)  # many chunks, so order across workers matters
    out = tmp_path / "two"
    prepare([str(english_corpus)], str(uncased_vocab), str(out), workers=2, shard_tokens=8192, progress=False)
    assert _files(out) == _files(english_shards)


def test_gz_folder_and_glob_inputs(english_corpus, english_shards, uncased_vocab, tmp_path):
    text = english_corpus.read_bytes()
    half = text.index(b"\n\n", len(text) // 2) + 2
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_bytes(text[:half])
    with gzip.open(folder / "sub" / "b.txt.gz", "wb") as f:
        f.write(text[half:])
    (folder / ".hidden.txt").write_text("Never read.\n")
    expected = _all_tokens(ShardedCorpus(english_shards))
    as_folder = [folder]
    as_files = [folder / "a.txt", folder / "sub" / "b.txt.gz"]
    as_globs = [folder / "*.txt", folder / "**" / "*.gz"]
    for inputs in (as_folder, as_files, as_globs):
        out = tmp_path / "out"
        meta = prepare([str(p) for p in inputs], str(uncased_vocab), str(out), overwrite=True, progress=False)
        assert _all_tokens(ShardedCorpus(out)) == expected, inputs
        assert [Path(p).name for p in meta["inputs"]] == ["a.txt", "b.txt.gz"]


def test_corpus_reader_counts_bytes_and_bad_lines(english_corpus, tmp_path):
    packed = tmp_path / "en.txt.gz"
    packed.write_bytes(gzip.compress(english_corpus.read_bytes()))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\n\nbroken \xff\xfe bytes\nok\nagain \xc3\n")
    reader = CorpusReader(resolve_inputs([str(packed), str(bad)]))
    assert reader.total_bytes == packed.stat().st_size + bad.stat().st_size
    docs = [doc.lines for doc in reader.documents()]
    assert reader.bytes_read == reader.total_bytes
    assert docs[-1] == ["broken \ufffd\ufffd bytes", "ok", "again \ufffd"]
    assert reader.documents_read == len(docs) == len(_documents(english_corpus.read_text())) + 2
    assert (reader.bad_lines, reader.first_bad) == (2, f"{bad}:3")
    assert f"{bad}:3" in reader.warnings[0]


def test_non_utf8_bytes_are_replaced_counted_and_warned(uncased_vocab, tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("Plain line.\nCaf\xe9 cr\xe8me.\n\nAnother caf\xe9.\n".encode("latin-1"))
    with pytest.warns(UserWarning, match=rf"2 line\(s\) were not valid UTF-8.*first at {corpus}:2"):
        meta = prepare([str(corpus)], str(uncased_vocab), str(tmp_path / "out"), progress=False)
    assert meta["bad_lines"] == 2 and meta["sentences"] == 3
    with pytest.raises(UserError, match=f"{corpus}:2: not valid UTF-8 \\(byte 0xe9 at column 4\\)"):
        prepare([str(corpus)], str(uncased_vocab), str(tmp_path / "strict"), strict=True, progress=False)
    assert not (tmp_path / "strict").exists()


def test_existing_output_needs_overwrite(english_corpus, uncased_vocab, tmp_path):
    out = tmp_path / "out"
    args = ([str(english_corpus)], str(uncased_vocab), str(out))
    prepare(*args, progress=False)
    (out / "stale-file").write_text("from an older run")
    with pytest.raises(UserError, match=f"{out} already exists and is not empty"):
        prepare(*args, progress=False)
    prepare(*args, overwrite=True, progress=False)
    assert not (out / "stale-file").exists() and ShardedCorpus(out).num_documents > 0
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(UserError, match="not a prepared corpus"):
        prepare([str(english_corpus)], str(uncased_vocab), str(precious), overwrite=True, progress=False)
    assert (precious / "thesis.tex").exists()
    (precious / "checkpoints").mkdir()  # a run directory given as data (inspect RUN, or --model and --data swapped)
    with pytest.raises(UserError, match="is a model or a run directory, not prepared data"):
        ShardedCorpus(precious)
    (precious / "checkpoints").rmdir()
    (tmp_path / "empty").mkdir()
    prepare([str(english_corpus)], str(uncased_vocab), str(tmp_path / "empty"), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out", "precious"]  # no temporary leftovers


def test_failure_leaves_nothing(english_corpus, english_shards, uncased_vocab, tmp_path, monkeypatch):
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"header\n\0\0\0\0")
    out = tmp_path / "out"
    with pytest.raises(UserError, match=f"{binary}: is a binary file"):
        prepare([str(english_corpus), str(binary)], str(uncased_vocab), str(out), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]

    def interrupt(self, chunk):
        raise KeyboardInterrupt

    monkeypatch.setattr(shard_writer._ShardWriter, "add", interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(english_corpus)], str(uncased_vocab), str(english_shards), overwrite=True, progress=False)
    assert ShardedCorpus(english_shards).num_sentences > 0  # the previous result is untouched
    assert not [p for p in english_shards.parent.iterdir() if p.name.startswith(".")]


def test_input_errors(uncased_vocab, tmp_path):
    vocab = str(uncased_vocab)
    with pytest.raises(UserError, match=f"{tmp_path / 'missing.txt'}: no such file or directory"):
        prepare([str(tmp_path / "missing.txt")], vocab, str(tmp_path / "out"))
    with pytest.raises(UserError, match=r"\*\.nothing: no such file"):
        prepare([str(tmp_path / "*.nothing")], vocab, str(tmp_path / "out"))
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(UserError, match="directory contains no files"):
        prepare([str(tmp_path / "empty-dir")], vocab, str(tmp_path / "out"))
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n\x07\n")
    with pytest.raises(UserError, match=f"no tokens in {blank}"):
        prepare([str(blank)], vocab, str(tmp_path / "out"), progress=False)
    truncated = tmp_path / "cut.txt.gz"
    truncated.write_bytes(gzip.compress(b"Some text.\n" * 1000)[:60])
    with pytest.raises(UserError, match=f"{truncated}: cannot be read: Compressed file ended"):
        prepare([str(truncated)], vocab, str(tmp_path / "out"), progress=False)
    partial = tmp_path / "vocab.txt"
    partial.write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(UserError, match=r"\[CLS\], \[SEP\], \[MASK\]"):
        prepare([str(blank)], str(partial), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_sharded_corpus_pickles_and_reopens(english_shards):
    corpus = ShardedCorpus(english_shards)
    expected = corpus.tokens(5, 9)
    blob = pickle.dumps(corpus)
    assert len(blob) < 1000  # the directory, not index arrays or memory maps
    clone = pickle.loads(blob)
    assert np.array_equal(clone.tokens(5, 9), expected)
    assert np.array_equal(clone.doc_offsets, corpus.doc_offsets)
    with pytest.raises(IndexError):
        corpus.tokens(0, corpus.num_sentences)  # spans shards


def test_sharded_corpus_errors(english_shards, tmp_path):
    with pytest.raises(UserError, match="does not exist; create it with `bertgpu prepare`"):
        ShardedCorpus(tmp_path / "nowhere")
    with pytest.raises(UserError, match="no meta.json"):
        ShardedCorpus(tmp_path)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for path in english_shards.iterdir():
        (damaged / path.name).write_bytes(path.read_bytes())
    tokens = damaged / "shard-00001.tokens"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    with pytest.raises(UserError, match=f"{tokens} has .* bytes, expected"):
        ShardedCorpus(damaged)


def test_large_vocab_uses_uint32(uncased_vocab, tmp_path):
    big = tmp_path / "big-vocab.txt"
    filler = [f"[extra{i}]" for i in range(70000)]
    big.write_text("\n".join([*filler, *Tokenizer(uncased_vocab).vocab]) + "\n")
    corpus_file = tmp_path / "c.txt"
    corpus_file.write_text("The quick brown fox.\nJumps over.\n\nThe lazy dog.\n")
    meta = prepare([str(corpus_file)], str(big), str(tmp_path / "out"), progress=False)
    assert meta["token_dtype"] == "uint32"
    corpus = ShardedCorpus(tmp_path / "out")
    ids = corpus.tokens(0, 2)
    assert ids.min() >= 70000 and Tokenizer(big).decode(ids) == "the quick brown fox. jumps over."
