"""The chance-level fine-tune (issue 41): fine-tuning chooses its own dropout and, from a checkpoint whose [CLS]
no pretraining loss trained (--no-nsp, --recipe fast), classifies the mean of the hidden states instead of the
untrained pooler on a [CLS] that is nearly the same vector for every text (BENCHMARKS.md)."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
from conftest import TINY_FINETUNE, TINY_RUN, run_cli, write_tiny_bert

from bertgpu.config import FinetuneConfig
from bertgpu.models import architectures
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForSequenceClassification
from bertgpu.tasks import finetune

TEXTS = [
    ("the parser reads a token and returns the next statement", "code"),
    ("a function call evaluates its arguments from left to right", "code"),
    ("the weather was warm and the garden full of roses", "prose"),
    ("we walked along the river until the sun went down", "prose"),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, small_english_data):
    """Two steps of `pretrain --recipe fast --no-nsp` and of `pretrain` with NSP, tiny: their checkpoints."""
    root = tmp_path_factory.mktemp("head")
    common = ["pretrain", "--data", small_english_data, *TINY_RUN, "--steps", "2", "--batch-size", "4"]
    common += ["--max-seq-length", "32", "--precision", "fp32"]
    run_cli(*common, "--recipe", "fast", "--no-nsp", "--out", root / "fast")
    run_cli(*common, "--out", root / "nsp")
    train = root / "train.csv"
    with open(train, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *(TEXTS * 10)])
    return root / "fast" / "checkpoints" / "step-0000002", root / "nsp" / "checkpoints" / "step-0000002", train


def _plan(model, train, tmp_path, **flags):
    return finetune.check(FinetuneConfig(model=str(model), train=str(train), out=str(tmp_path / "out"), **flags))


def test_a_fast_recipe_checkpoint_is_finetuned_with_dropout_and_mean_pooling(checkpoints, tmp_path):
    """Before issue 41 fine-tuning took the recipe's dropout 0 from config.json and read the untrained pooler."""
    fast, nsp, train = checkpoints
    assert json.loads((fast / "config.json").read_text())["hidden_dropout_prob"] == 0  # the recipe's
    plan = _plan(fast, train, tmp_path)
    c = plan.model_config
    assert (c.hidden_dropout_prob, c.attention_probs_dropout_prob, c.classifier_pooling) == (0.1, 0.1, "mean")
    assert "dropout 0.1 (fine-tuning's default; the model's config says 0)" in plan.head_line
    assert "pooling mean (auto: pretrained without NSP, the pooler is untrained" in plan.head_line
    # NSP trained the pooler: it is kept, as is a Hugging Face BERT of unknown history
    assert _plan(nsp, train, tmp_path).model_config.classifier_pooling is None
    hf = write_tiny_bert(tmp_path / "hf", nsp / "vocab.txt")
    assert _plan(hf, train, tmp_path).model_config.classifier_pooling is None
    # what the user asks wins
    mine = _plan(fast, train, tmp_path, dropout=0.0, pooling="pooler").model_config
    assert (mine.hidden_dropout_prob, mine.classifier_pooling) == (0.0, None)


def test_mean_pooling_reads_the_real_tokens_only_and_round_trips_through_config_json():
    config = BertConfig.preset("tiny", vocab_size=100, id2label={0: "a", 1: "b"})
    config = architectures.for_finetuning(config, 0.1, "mean")
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    ids = torch.tensor([[2, 5, 6, 7, 3]])
    padded = torch.tensor([[2, 5, 6, 7, 3, 0, 0]])
    with torch.no_grad():
        alone = model(ids, torch.zeros_like(ids), torch.ones_like(ids))
        with_padding = model(padded, torch.zeros_like(padded), (padded != 0).long())
        hidden, _ = model.bert(ids, torch.zeros_like(ids), torch.ones_like(ids))
        expected = model.classifier(hidden.mean(1))
    # the same sum in another order (padding masked out): float32 rounding only
    torch.testing.assert_close(with_padding, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(alone, expected, atol=1e-5, rtol=0)
    saved = config.to_hf_dict("BertForSequenceClassification")
    assert saved["classifier_pooling"] == "mean"
    assert architectures.config_from_hf_dict(saved).classifier_pooling == "mean"
    plain = architectures.for_finetuning(config, 0.1, "pooler").to_hf_dict()
    assert "classifier_pooling" not in plain  # a pooler classifier's config.json is transformers' own


def test_finetuning_says_and_records_what_it_chose(checkpoints, tmp_path):
    fast, _, train = checkpoints
    out = tmp_path / "clf"
    proc = run_cli("finetune", "--model", fast, "--train", train, "--out", out, "--epochs", "1", *TINY_FINETUNE)
    assert "dropout 0.1, pooling mean" in proc.stdout  # the start line
    assert "mean pooling, which transformers' BertForSequenceClassification does not read" in proc.stdout
    config = json.loads((out / "best" / "config.json").read_text())
    assert (config["hidden_dropout_prob"], config["classifier_pooling"]) == (0.1, "mean")
    card = (out / "best" / "README.md").read_text()
    assert "| dropout | 0.1 |" in card and "| pooling | mean of the last hidden states" in card
    ran = json.loads((out / "best" / "bertgpu.json").read_text())["config"]
    assert (ran["dropout"], ran["pooling"]) == (0.1, "mean")
    predicted = run_cli("predict", "--model", out / "best", TEXTS[0][0])  # bertgpu reads the mean pooling back
    assert predicted.stdout.split()[0] in ("code", "prose")
    # fine-tuned again on other labels (a new head): the pooler it never trained is still not read
    relabelled = tmp_path / "relabelled.csv"
    with open(relabelled, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *((text, label[0]) for text, label in TEXTS * 10)])
    again = _plan(out / "best", relabelled, tmp_path)
    assert again.model_config.classifier_pooling == "mean" and "classifier_pooling mean" in again.head_line


def test_a_continuation_that_stayed_near_its_start_keeps_the_starts_pooler(checkpoints, tmp_path):
    """A --no-nsp continuation records how far its encoder moved (start CKA, in bertgpu.json): near its start the
    start's pooler still fits (MiniLM at start CKA 0.993: a pair task 0.814 through it, 0.777 through the mean), further
    from it the mean reads as well or better (at 0.912: 0.769 against 0.777; at 0.838: 0.72 against 0.78)."""
    fast, _, train = checkpoints
    for cka, pooling in ((0.99, None), (0.84, "mean")):
        ckpt = tmp_path / f"cka{cka}"
        shutil.copytree(fast, ckpt)
        record = json.loads((ckpt / "bertgpu.json").read_text())
        (ckpt / "bertgpu.json").write_text(json.dumps({**record, "start_cka": cka}))
        plan = _plan(ckpt, train, tmp_path)
        assert plan.model_config.classifier_pooling == pooling, plan.head_line
    assert "pooling mean (auto: pretrained without NSP, the pooler is untrained" in plan.head_line
    assert (
        "pooling pooler (auto: continued to start CKA 0.990, the start's pooler still fits)"
        in _plan(tmp_path / "cka0.99", train, tmp_path).head_line
    )
