"""What `evaluate` reports by label, and the one-line warnings a run gives before its work starts
(issue 40: a newcomer computed per-class recall by hand, and met a macro F1 of 0.487 beside an
accuracy of 0.966 with no word that two of four labels were absent from the test file).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import run_cli, sentiment_reviews, write_tiny_bert

from bertgpu.tasks.sharded_eval import compute_metrics, missing_labels_warning, per_class_table

FOUR = ["news", "negative", "positive", "mixed"]


def test_per_class_metrics_by_hand():
    """Six examples whose counts are worked out by hand: label 0 three times (2 found), label 1 twice
    (1 found, 1 taken for label 2), label 2 once (taken for 0); label 3 never in the data nor predicted."""
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    predicted = torch.tensor([0, 0, 1, 1, 2, 0])
    logits = torch.nn.functional.one_hot(predicted, 4).double() * 5
    m = compute_metrics(logits, labels, FOUR)
    news, negative, positive, mixed = (m["per_class"][name] for name in FOUR)
    assert news == {"precision": 2 / 3, "recall": 2 / 3, "f1": 2 / 3, "support": 3, "predicted": 3}
    assert negative == {"precision": 1 / 2, "recall": 1 / 2, "f1": 1 / 2, "support": 2, "predicted": 2}
    assert positive == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1, "predicted": 1}
    assert mixed == {"precision": None, "recall": None, "f1": None, "support": 0, "predicted": 0}
    assert m["accuracy"] == 3 / 6
    # scikit-learn's macro F1 averages the labels in the data or the predictions: mixed is left out.
    assert m["f1_labels"] == ["news", "negative", "positive"] and m["f1"] == pytest.approx((2 / 3 + 1 / 2) / 3)
    assert m["macro_f1_data_labels"] == pytest.approx((2 / 3 + 1 / 2) / 3)
    assert m["macro_f1_all_labels"] == pytest.approx((2 / 3 + 1 / 2) / 4)
    assert m["data_labels"] == ["news", "negative", "positive"]
    warning = missing_labels_warning(m, "test.csv")
    assert warning.startswith("test.csv holds 3 of the model's 4 labels (not mixed)") and "\n" not in warning
    table = per_class_table(m)
    assert table[0].split() == ["label", "precision", "recall", "f1", "support"]
    assert table[1].split() == ["news", "0.6667", "0.6667", "0.6667", "3"]
    assert table[4].split()[:5] == ["mixed", "-", "-", "-", "0"] and "absent from the data" in table[4]
    # Two labels: the F1 of label id 1, as before.
    binary = compute_metrics(logits[:5, :2], torch.tensor([0, 0, 0, 1, 1]), ["neg", "pos"])
    assert binary["f1_labels"] == ["pos"] and binary["f1"] == binary["per_class"]["pos"]["f1"]
    assert missing_labels_warning(binary, "x.csv") is None


@pytest.fixture(scope="module")
def four_label_classifier(tmp_path_factory, small_uncased_vocab) -> Path:
    """A random tiny BERT classifier of four labels (weights seeded): its predictions spread over all four."""
    from bertgpu.checkpoints.hf_dir import save_pretrained
    from bertgpu.data.tokenizer import load_vocab
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForSequenceClassification

    config = BertConfig.preset("tiny", vocab_size=len(load_vocab(small_uncased_vocab)), id2label=dict(enumerate(FOUR)))
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("clf4") / "clf"
    save_pretrained(
        BertForSequenceClassification(config),
        config,
        path,
        vocab_path=small_uncased_vocab,
        do_lower_case=True,
        architecture="BertForSequenceClassification",
    )
    return path


def test_evaluate_prints_and_writes_each_labels_metrics_and_warns_of_absent_labels(
    tmp_path, four_label_classifier, capsys
):
    """Real reviews that hold 2 of the classifier's 4 labels: the table by label on stdout, the same in
    --json and eval_results.json, each figure the confusion matrix's, and one warning line naming the
    absent labels and the macro F1 over the labels in the data beside the one over those predicted."""
    _, test = sentiment_reviews(tmp_path / "reviews", test_per_class=30, train_per_class=10, seed=4)
    proc = run_cli("evaluate", "--model", four_label_classifier, "--data", test, "--device", "cpu")
    written = json.loads((four_label_classifier / "eval_results.json").read_text())
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"{test}: 60 examples") and "macro over" in lines[0]
    assert lines[1].split() == ["label", "precision", "recall", "f1", "support"]
    assert [line.split()[0] for line in lines[2:6]] == FOUR
    per_class, confusion = written["per_class"], written["confusion"]
    for k, name in enumerate(FOUR):
        support, predicted, tp = sum(confusion[k]), sum(row[k] for row in confusion), confusion[k][k]
        assert per_class[name]["support"] == support and per_class[name]["predicted"] == predicted
        assert per_class[name]["recall"] == (tp / support if support else None)
        assert per_class[name]["precision"] == (tp / predicted if predicted else None)
    assert [per_class[name]["support"] for name in FOUR] == [0, 30, 30, 0]
    assert written["data_labels"] == ["negative", "positive"]
    assert written["f1_labels"] == [name for name in FOUR if per_class[name]["f1"] is not None]
    absent_predicted = [name for name in ("news", "mixed") if per_class[name]["predicted"]]
    assert absent_predicted, "the random classifier predicts an absent label: the case of the issue"
    warnings = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1, proc.stderr
    assert "holds 2 of the model's 4 labels (not news, mixed)" in warnings[0]
    assert f"over the 2 labels in the data it is {written['macro_f1_data_labels']:.4f}" in warnings[0]
    assert ", ".join(absent_predicted) in warnings[0]
    as_json = json.loads(
        run_cli("evaluate", "--model", four_label_classifier, "--data", test, "--device", "cpu", "--json").stdout
    )
    assert as_json["per_class"] == per_class and as_json["f1_average"] == written["f1_average"]


# ---------------------------------------------------------------------------------------------
# Warnings before the work starts, one line each.


def warning_lines(stderr: str, part: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("bertgpu: warning:") and part in line]


def test_the_memory_estimate_is_of_the_measured_order_and_warns_for_a_huge_batch_only():
    """tiny at 128 tokens with bert-base-uncased's vocab and 20 prediction slots grew the peak resident set
    by 11.8 MiB per sequence in fp32 on CPU (bertgpu/memory.py); the estimate must stay within 30% of it.
    The default batches (pretrain 32, finetune 8) fit any machine that runs the tests; a million sequences
    (about 12 TB) fits none."""
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.training import memory

    config = BertConfig.preset("tiny", vocab_size=30522)
    per_sequence = memory.activation_bytes(config, 1, 128, "fp32", "cpu", prediction_slots=20) / 2**20
    assert 11.8 / 1.3 < per_sequence < 11.8 * 1.3
    assert memory.activation_bytes(config, 1, 128, "bf16", "cuda", prediction_slots=20) / 2**20 < per_sequence
    checkpointed = memory.activation_bytes(
        config, 1, 128, "fp32", "cpu", split=memory.Split(activation_checkpointing=True)
    )
    assert checkpointed < memory.activation_bytes(config, 1, 128, "fp32", "cpu")
    state = memory.state_bytes(BertForPreTraining(config))
    assert state == sum(p.numel() for p in BertForPreTraining(config).parameters()) * 16
    available = memory.available_bytes(torch.device("cpu"))
    assert available and available > 2**28

    def warning(batch: int, slots: int = 20) -> str | None:
        activations = memory.activation_bytes(config, batch, 128, "fp32", "cpu", prediction_slots=slots)
        return memory.batch_warning(state, activations, available, 1, f"a batch of {batch}", False)

    assert warning(32) is None and warning(8, slots=0) is None
    huge = warning(1_000_000)
    assert huge.startswith("a batch of 1000000 needs about ") and "lower --batch-size" in huge and "\n" not in huge


@pytest.fixture(scope="module")
def reviews(tmp_path_factory) -> Path:
    return sentiment_reviews(tmp_path_factory.mktemp("reviews"), test_per_class=10, train_per_class=30, seed=5)[0]


TINY_PRETRAIN = ["--model", "tiny", "--device", "cpu", "--loader-workers", "0", "--steps", "1"]


def test_a_batch_the_memory_cannot_hold_is_refused_before_the_first_step(
    tmp_path, monkeypatch, small_english_data, reviews, small_uncased_vocab
):
    """The check is wired into both training commands (the machine's free memory made 100 MiB, the run itself is
    a normal one): refused in one line with the estimate and what is free, leaving no --out (a batch estimated at
    57 GiB with 19 GiB free was warned about and started anyway, and the machine swapped); started with a warning
    under --ignore-memory-estimate. With the real free memory the default batch is neither."""
    from bertgpu.training import memory

    run = run_cli("pretrain", "--data", small_english_data, "--out", tmp_path / "fits", *TINY_PRETRAIN)
    assert not warning_lines(run.stderr, "needs about"), run.stderr
    monkeypatch.setattr(memory, "available_bytes", lambda device: 100 * 2**20)
    out = tmp_path / "pretrain"
    run = run_cli("pretrain", "--data", small_english_data, "--out", out, *TINY_PRETRAIN, check=False)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and not out.exists(), run.stderr
    assert run.stderr.startswith("bertgpu: error: a batch of 32 x 128 tokens per process on cpu needs about ")
    assert "only 0.1 GiB is free" in run.stderr and "; --ignore-memory-estimate starts it anyway" in run.stderr
    run = run_cli("pretrain", "--data", small_english_data, "--out", out, *TINY_PRETRAIN, "--ignore-memory-estimate")
    (line,) = warning_lines(run.stderr, "needs about")
    assert "a batch of 32 x 128 tokens per process on cpu needs about" in line and "only 0.1 GiB is free" in line
    assert line.endswith("(started anyway: --ignore-memory-estimate)") and (out / "checkpoints").is_dir()
    finetune = ["finetune", "--model", "tiny", "--vocab", small_uncased_vocab, "--train", reviews, "--epochs", "1"]
    batch_40 = ["--out", tmp_path / "finetune", "--device", "cpu", "--batch-size", "40"]
    run = run_cli(*finetune, *batch_40, check=False)
    assert run.returncode == 2 and "--ignore-memory-estimate starts it anyway" in run.stderr, run.stderr
    run = run_cli(*finetune, *batch_40, "--ignore-memory-estimate")
    (line,) = warning_lines(run.stderr, "needs about")
    assert re.search(r"a batch of 40 x \d+ tokens per process on cpu", line), line
    # A batch is no larger than the training set and no longer than its longest example (dynamic padding):
    # --batch-size 50000 --max-seq-length 512 on these reviews fits the machine's real memory.
    monkeypatch.undo()
    big = ["--batch-size", "50000", "--max-seq-length", "512"]
    run = run_cli(*finetune, "--out", tmp_path / "finetune-big", "--device", "cpu", *big)
    assert not warning_lines(run.stderr, "needs about"), run.stderr


def test_more_processes_than_cores_is_warned_of_once(tmp_path, monkeypatch, small_english_data):
    """--nproc 2 where this process may run on one core (as `taskset -c 0` leaves it)."""
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    run = run_cli("pretrain", "--data", small_english_data, "--out", tmp_path / "run", *TINY_PRETRAIN, "--nproc", 2)
    (line,) = warning_lines(run.stderr, "core")
    assert line == (
        "bertgpu: warning: --nproc 2 starts 2 processes on 1 CPU core(s): each gets less than a core and they "
        "wait on each other at every step; use --nproc 1 at most (--grad-accum keeps the global batch)"
    )
    assert "2 processes = dp 2" in run.stdout


def test_prepare_warns_when_the_vocab_splits_the_words_far_more_than_a_fitting_one(
    tmp_path, english_corpus, uncased_vocab, chinese_corpus
):
    """The Python reference through bert-base-uncased's vocab: about 1.1 tokens per English word, no
    warning. Through a 400-token vocab trained on it (its letters and a few hundred merges), the [UNK]
    share is 0% yet words break into pieces: one warning line, before the shards are written, which are
    written all the same. Chinese text is not judged (its characters are tokens of their own)."""
    from itertools import islice

    from bertgpu.data.corpus import CorpusReader
    from bertgpu.data.tokenizer import MAX_PIECES_PER_WORD, Tokenizer, pieces_per_word, train_vocab

    proc = run_cli("prepare", english_corpus, "--vocab", uncased_vocab, "--out", tmp_path / "fits", "--workers", 1)
    assert not warning_lines(proc.stderr, "tokens each"), proc.stderr
    small = train_vocab([str(english_corpus)], 400, str(tmp_path / "small-vocab.txt"), progress=False)
    proc = run_cli("prepare", english_corpus, "--vocab", small, "--out", tmp_path / "split", "--workers", 1)
    (line,) = warning_lines(proc.stderr, "tokens each")
    ratio = float(line.split("English words into ")[1].split()[0])
    assert ratio > MAX_PIECES_PER_WORD and "bertgpu vocab" in line
    meta = json.loads((tmp_path / "split" / "meta.json").read_text())
    assert (
        meta["unk_tokens"] == 0
        and meta["tokens"] > 1.5 * json.loads((tmp_path / "fits" / "meta.json").read_text())["tokens"]
    )

    fitting = pieces_per_word(Tokenizer(uncased_vocab), list(islice(CorpusReader([english_corpus]).lines(), 2000)))
    assert 1.0 <= fitting[0] < 1.3 and fitting[1] > 10_000
    chinese = list(islice(CorpusReader([chinese_corpus]).lines(), 2000))
    assert pieces_per_word(Tokenizer(uncased_vocab), chinese) == (0.0, 0)


def test_finetune_from_random_weights_warns_when_its_vocab_splits_the_training_texts(
    tmp_path, english_corpus, uncased_vocab
):
    """`finetune --model tiny --vocab V`: the same check as prepare's, on the training file's texts (an English
    CSV through a 400-token vocab breaks its words up; through bert-base-uncased's it does not)."""
    from itertools import islice

    from bertgpu.data.corpus import CorpusReader
    from bertgpu.data.tokenizer import train_vocab

    lines = [line for line in islice(CorpusReader([english_corpus]).lines(), 3000) if len(line.split()) > 5][:200]
    train = tmp_path / "train.csv"
    with open(train, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *((line, "ab"[i % 2]) for i, line in enumerate(lines))])
    small = train_vocab([str(english_corpus)], 400, str(tmp_path / "small-vocab.txt"), progress=False)
    args = ["finetune", "--model", "tiny", "--train", train, "--epochs", "1", "--max-seq-length", "32"]
    proc = run_cli(*args, "--vocab", small, "--out", tmp_path / "split", "--device", "cpu")
    (line,) = warning_lines(proc.stderr, "tokens each")
    assert f"small-vocab.txt splits {train}'s English words into " in line and "bertgpu vocab" in line
    proc = run_cli(*args, "--vocab", uncased_vocab, "--out", tmp_path / "fits", "--device", "cpu")
    assert not warning_lines(proc.stderr, "tokens each"), proc.stderr


def test_evaluate_on_prepared_data_says_what_the_data_is_to_the_run(tmp_path, small_english_data, english_corpus):
    """`evaluate --data` on the run's own training shards is a training loss, and says so in a warning
    before it starts and in its line (it used to call them "held-out instances"); on the run's --eval-data
    it says held-out; on other shards, other data; on a model that is no bertgpu run, only instances."""
    from bertgpu.data.shard_writer import prepare

    lines = english_corpus.read_text(encoding="utf-8").splitlines()
    half = tmp_path / "half.txt"
    half.write_text("\n".join(lines[: len(lines) // 2]) + "\n", encoding="utf-8")
    other = tmp_path / "other-data"
    prepare([str(half)], str(small_english_data / "vocab.txt"), str(other), workers=1, progress=False)
    fraction, eval_data = tmp_path / "fraction", tmp_path / "eval-data"
    FEW = ["--eval-instances", "40"]
    run_cli("pretrain", "--data", small_english_data, "--out", fraction, *TINY_PRETRAIN, "--eval-fraction", "0.1", *FEW)
    run_cli("pretrain", "--data", small_english_data, "--out", eval_data, *TINY_PRETRAIN, "--eval-data", other, *FEW)

    def evaluate(model: Path, data: Path) -> tuple[dict, str, str]:
        output = tmp_path / "metrics.json"
        args = ["--eval-instances", "40", "--output", output, "--overwrite"]  # the same file each time
        proc = run_cli("evaluate", "--model", model, "--data", data, *args)
        return json.loads(output.read_text()), proc.stdout, proc.stderr

    result, stdout, stderr = evaluate(fraction, small_english_data)
    assert result["data_is"] == "training" and "held-out instances" not in stdout
    (line,) = warning_lines(stderr, "training loss")
    assert f"{small_english_data} is the run's training data (it held out " in line
    assert "documents, --eval-fraction 0.1; these instances come from all): this is a training loss" in line
    assert "this is a training loss, not a held-out one" in stdout
    result, stdout, stderr = evaluate(eval_data, other)
    assert (
        result["data_is"] == "held-out" and "40 instances of the run's held-out data (its --eval-data, never" in stdout
    )
    assert not warning_lines(stderr, "")
    result, stdout, _ = evaluate(fraction, other)
    assert (
        result["data_is"] == "other" and f"other prepared data than the run's --data ({small_english_data})" in stdout
    )
    result, stdout, stderr = evaluate(eval_data, small_english_data)
    assert result["data_is"] == "training" and warning_lines(stderr, "training loss")
    result, stdout, stderr = evaluate(write_tiny_bert(tmp_path / "hf", small_english_data / "vocab.txt"), other)
    assert result["data_is"] == "unknown" and stdout.splitlines()[0].endswith("| 40 instances")
    assert not warning_lines(stderr, "")


def test_evaluate_of_a_run_without_nsp_reports_no_nsp(tmp_path, small_english_data):
    """A --no-nsp run saves BERT's NSP head untrained: evaluating it on prepared data gives no NSP figures (they
    were a coin's: accuracy about 0.5) and draws single-segment instances, as the run trained on."""
    run = tmp_path / "run"
    run_cli("pretrain", "--data", small_english_data, "--out", run, *TINY_PRETRAIN, "--no-nsp")
    proc = run_cli("evaluate", "--model", run, "--data", small_english_data, "--eval-instances", "40", "--json")
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["nsp_instances"] is False and not any(
        key.startswith("nsp") for key in result if key != "nsp_instances"
    )
