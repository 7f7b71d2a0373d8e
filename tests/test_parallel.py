"""Every layout is one process on the same global batch: DDP, FSDP, tensor parallel, both, accumulation.

BERT-GPU's central claim, and the parallelism issue's acceptance: data-parallel, fully sharded and
tensor-parallel training over gloo processes end on the same parameters as one process with the same
global batch. Every run is a real multi-process run through the CLI.

Tolerance 1e-6 on the parameters after 3 AdamW steps (fp32, dropout 0), 1e-5 on the logged losses:
the layouts compute the same sums in other orders (DDP all-reduces partial gradients, FSDP
reduce-scatters them, tensor parallelism splits the inner dimension of the row-wise matmuls and
all-reduces the partial products), which moves results by a few ulps (~1e-7 relative). Each AdamW
step moves a weight by about lr = 1e-4 times a ratio that such a perturbation changes by as little,
so three steps stay far below 1e-6; measured: at most 6e-8.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from conftest import (
    EXACT,
    TINY_FINETUNE,
    TINY_RUN,
    at_real_tokens,
    run_balanced_with_a_slow_rank,
    run_cli,
    sentiment_reviews,
    workers_from_a_fork_server,
    write_tiny_bert,
)
from safetensors.torch import load_file

COMMON = [*TINY_RUN, *EXACT, "--seed", "7", "--steps", "3", "--lr", "1e-4", "--warmup", "1", "--log-every", "1"]
COMMON += ["--save-every", "2"]
LAYOUTS = {
    "2procs-x-4": (["--nproc", "2", "--batch-size", "4"], "2 processes = dp 2, ddp"),
    "1proc-x-4-x-accum2": (["--nproc", "1", "--batch-size", "4", "--grad-accum", "2"], "1 process"),
    "unequal-6-and-2": (["--nproc", "2", "--batch-size", "6,2"], "2 processes = dp 2, ddp"),
    "fsdp-2procs-x-4": (["--nproc", "2", "--batch-size", "4", "--strategy", "fsdp"], "2 processes = dp 2, fsdp"),
    "tp2-x-8": (["--nproc", "2", "--batch-size", "8", "--tp", "2"], "2 processes = tp 2"),
    "dp2-x-tp2-fsdp-x-4": (
        ["--nproc", "4", "--batch-size", "4", "--tp", "2", "--strategy", "fsdp"],
        "4 processes = dp 2 x tp 2, fsdp",
    ),
    "dp2-x-tp2-ddp-x-4-ac": (
        ["--nproc", "4", "--batch-size", "4", "--tp", "2", "--activation-checkpointing"],
        "4 processes = dp 2 x tp 2, ddp",
    ),
}
TOLERANCE = 1e-6


def evaluated_on(data) -> list[str]:
    """Held-out evaluation in every parity run (at the step-2 checkpoint and the end): it shares their
    launches, and it must neither depend on the layout nor change what training does."""
    return ["--eval-data", str(data), "--eval-instances", "25"]  # 25: the ranks' shares differ in size


def evaluations(run_dir) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [r for r in records if "eval_mlm_loss" in r]


def final_weights(run_dir):
    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    assert ckpt.name == "step-0000003"
    return load_file(ckpt / "model.safetensors")


def losses(run_dir):
    return [r["loss"] for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if "loss" in r]


def worst_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, small_english_data):
    out = tmp_path_factory.mktemp("runs") / "one-by-8"
    run_cli(
        "pretrain",
        "--data",
        small_english_data,
        "--out",
        out,
        "--nproc",
        "1",
        "--batch-size",
        "8",
        *COMMON,
        *evaluated_on(small_english_data),
    )
    first = losses(out)
    assert len(first) == 3 and first[0] != first[-1]  # training changed the weights: the comparisons mean something
    return out


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, small_english_data):
    """Each layout's run directory, run once for the module."""
    done = {}

    def get(name):
        if name not in done:
            flags, described = LAYOUTS[name]
            out = tmp_path_factory.mktemp("runs") / name
            proc = run_cli(
                "pretrain",
                "--data",
                small_english_data,
                "--out",
                out,
                *flags,
                *COMMON,
                *evaluated_on(small_english_data),
            )
            assert described in proc.stdout and "global batch 8" in proc.stdout, proc.stdout
            done[name] = out
        return done[name]

    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_same_parameters_as_one_process_with_the_global_batch(name, layouts, reference):
    out = layouts(name)
    worst = worst_difference(final_weights(reference), final_weights(out))
    assert worst <= TOLERANCE, f"max abs parameter difference {worst:.3g}"
    assert losses(out) == pytest.approx(losses(reference), abs=1e-5)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r for r in records if "layout" in r][-1]["layout"] == LAYOUTS[name][1]


@pytest.mark.parametrize("name", ["2procs-x-4", "fsdp-2procs-x-4", "tp2-x-8", "dp2-x-tp2-fsdp-x-4"])
def test_held_out_evaluation_is_the_same_in_every_layout(name, layouts, reference):
    """The same instances, masked the same way, summed exactly over the data-parallel ranks: the eval
    loss of every layout is one process's to 1e-6 (the weights agree to ~6e-8, the sums in float64)."""
    ours, ref = evaluations(layouts(name)), evaluations(reference)
    assert [r["step"] for r in ours] == [r["step"] for r in ref] == [0, 2, 3]  # step 0: the untrained model
    for mine, theirs in zip(ours, ref):
        for key in ("eval_mlm_loss", "eval_mlm_acc", "eval_nsp_loss", "eval_nsp_acc"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-6), key
    assert ref[0]["eval_mlm_loss"] != ref[1]["eval_mlm_loss"]  # it measures the weights of its step


def test_evaluation_does_not_change_training(reference, small_english_data, tmp_path):
    """A run with held-out evaluation ends on the same weights as one without, bit for bit: evaluation
    draws nothing from the training RNG and runs without gradients."""
    out = tmp_path / "no-eval"
    run_cli("pretrain", "--data", small_english_data, "--out", out, "--nproc", "1", "--batch-size", "8", *COMMON)
    assert not evaluations(out)
    assert worst_difference(final_weights(reference), final_weights(out)) == 0


def test_fsdp_ends_on_the_weights_of_ddp(layouts):
    worst = worst_difference(final_weights(layouts("2procs-x-4")), final_weights(layouts("fsdp-2procs-x-4")))
    assert worst <= TOLERANCE, f"max abs parameter difference {worst:.3g}"


@pytest.mark.parametrize("name", ["fsdp-2procs-x-4", "dp2-x-tp2-fsdp-x-4"])
def test_sharded_checkpoints_export_what_transformers_loads_with_the_same_logits(name, layouts, uncased_vocab):
    """The weights of a sharded run are gathered into one Hugging Face directory: transformers reads
    it as it is and computes our logits (1e-5, real tokens)."""
    from bertgpu.checkpoints.hf_dir import load_pretrained
    from bertgpu.models.bert.model import BertForPreTraining

    ckpt = layouts(name) / "checkpoints" / "step-0000003"
    assert sorted(p.name for p in (ckpt / "optimizer").iterdir())[0] == ".metadata"
    assert len(list((ckpt / "optimizer").glob("*.distcp"))) >= 2  # each process wrote its own shard
    theirs, info = transformers.BertForPreTraining.from_pretrained(ckpt, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    tokenizer = transformers.BertTokenizer.from_pretrained(ckpt)
    enc = tokenizer(
        ["The if statement is used for conditional execution.", "Short."],
        ["It selects exactly one suite.", "A longer second segment than the first."],
        padding=True,
        return_tensors="pt",
    )
    ours = load_pretrained(ckpt, BertForPreTraining).eval()
    with torch.no_grad():
        mlm, nsp = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
        ref = theirs.eval()(**enc)
    mask = enc["attention_mask"]
    torch.testing.assert_close(
        at_real_tokens(mlm, mask), at_real_tokens(ref.prediction_logits, mask), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "source, target",
    [
        ("fsdp-2procs-x-4", ["--nproc", "2", "--batch-size", "8", "--tp", "2"]),
        ("tp2-x-8", ["--nproc", "1", "--batch-size", "8"]),
    ],
    ids=["fsdp-resumed-as-tp2", "tp2-resumed-as-one-process"],
)
def test_resume_on_another_layout_continues_the_run(source, target, layouts, reference, small_english_data, tmp_path):
    """A checkpoint written by one layout (sharded optimizer state, one file per process) resumes
    on another with the same global batch and ends where the uninterrupted run does."""
    out = tmp_path / "run"
    shutil.copytree(layouts(source), out)
    shutil.rmtree(out / "checkpoints" / "step-0000003")
    proc = run_cli("pretrain", "--data", small_english_data, "--out", out, "--resume", *target, *COMMON)
    assert "resuming from" in proc.stdout and "step-0000002 at step 2" in proc.stdout, proc.stdout
    worst = worst_difference(final_weights(reference), final_weights(out))
    assert worst <= TOLERANCE, f"max abs parameter difference {worst:.3g}"


def test_resume_with_another_global_batch_continues_from_the_same_instance(layouts, small_english_data, tmp_path):
    """2 x 4 resumed as 1 x 4 does not restart the epoch's sampler at the same step with half the batch:
    it continues at the same instance (2 steps x 8 = instance 16) and says so."""
    out = tmp_path / "run"
    shutil.copytree(layouts("2procs-x-4"), out)
    shutil.rmtree(out / "checkpoints" / "step-0000003")
    proc = run_cli(
        "pretrain", "--data", small_english_data, "--out", out, "--resume", "--nproc", "1", "--batch-size", "4", *COMMON
    )
    assert "the global batch changed from 8 to 4: continuing at instance 16 of epoch 0" in proc.stdout, proc.stdout
    last = json.loads((out / "log.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 3 and last["global_batch"] == 4


def test_activation_checkpointing_gives_the_same_gradients():
    """Recomputing each encoder layer in the backward pass changes no gradient, dropout on: the
    recomputation replays the RNG, so it draws the same masks."""
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.parallel import ParallelDims, SpreadOptions, parallelize

    def gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=500))
        net = parallelize(
            model, ParallelDims(1), torch.device("cpu"), SpreadOptions(activation_checkpointing=checkpointing)
        )
        if checkpointing:
            assert type(model.bert.encoder.layer[0]).__name__ == "CheckpointWrapper"
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(5, 500, (4, 32), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 20:] = 0
        torch.manual_seed(2)  # the same dropout masks for both
        mlm, nsp = net.train()(ids, torch.zeros_like(ids), mask)
        (mlm.float().logsumexp(-1).mean() + nsp.sum()).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = gradients(False), gradients(True)
    names = {k.replace("._checkpoint_wrapped_module", "") for k in checkpointed}
    assert names == set(plain)
    for name, grad in checkpointed.items():
        torch.testing.assert_close(grad, plain[name.replace("._checkpoint_wrapped_module", "")], atol=0, rtol=0)


# --- fine-tuning on the same layouts ----------------------------------------------------------------

# 120 real reviews, 10% held out: 108 training examples, 7 steps of global batch 16 (the last one 12).
# --dropout 0: the layouts compared run without dropout (fine-tuning's default is 0.1)
FINETUNE = [*TINY_FINETUNE, "--dropout", "0", "--epochs", "1", "--lr", "1e-3", "--log-every", "1"]
FINETUNE_LAYOUTS = {
    "1proc-x-16": ["--nproc", "1", "--batch-size", "16"],
    "fsdp-2procs-x-8": ["--nproc", "2", "--batch-size", "8", "--strategy", "fsdp"],
    "tp2-x-16": ["--nproc", "2", "--batch-size", "16", "--tp", "2"],
}


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, small_uncased_vocab):
    """Each fine-tuning layout's output directory: a random tiny BERT without dropout, real reviews."""
    root = tmp_path_factory.mktemp("finetune-layouts")
    _, reviews = sentiment_reviews(root, test_per_class=60, train_per_class=0, seed=1)
    write_tiny_bert(root / "tiny", small_uncased_vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    outs = {}
    for name, flags in FINETUNE_LAYOUTS.items():
        outs[name] = root / name
        run_cli("finetune", "--model", root / "tiny", "--train", reviews, "--out", outs[name], *flags, *FINETUNE)
    return outs


@pytest.mark.parametrize("name", ["fsdp-2procs-x-8", "tp2-x-16"])
def test_finetune_layouts_end_on_the_weights_of_one_process(name, finetuned):
    """Tolerance 1e-5: fine-tuning's AdamW epsilon is 1e-8 (transformers' default), so near-zero
    gradients carry more of the summation-order noise into the update than in pretraining; 7 steps
    at lr 1e-3 moved the weights by at most 1e-6 from one process's (measured; 1.2e-6 after 23 steps)."""
    ref, got = (load_file(finetuned[n] / "best" / "model.safetensors") for n in ("1proc-x-16", name))
    worst = worst_difference(ref, got)
    assert worst <= 1e-5, f"max abs parameter difference {worst:.3g}"
    metrics = [json.loads((finetuned[n] / "metrics.json").read_text())["epochs"][0] for n in ("1proc-x-16", name)]
    assert metrics[0]["eval_examples"] == metrics[1]["eval_examples"] == 12
    assert metrics[1]["eval_loss"] == pytest.approx(metrics[0]["eval_loss"], abs=1e-5)
    hf = transformers.BertForSequenceClassification.from_pretrained(finetuned[name] / "best").eval()
    from bertgpu.tasks.classifier import Classifier

    ours = Classifier.load(finetuned[name] / "best", device="cpu")
    enc = transformers.BertTokenizer.from_pretrained(finetuned[name] / "best")(
        ["我觉得不错!", "质量很差"], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        torch.testing.assert_close(
            ours.model(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]),
            hf(**enc).logits,
            atol=1e-5,
            rtol=0,
        )


def test_finetune_with_unequal_batch_sizes_ends_on_the_weights_of_one_process(finetuned, tmp_path):
    """--batch-size 6,2 on 2 processes, and 4,4 moved by --balance auto, are one process with batch 8,
    for fine-tuning too: the same
    global batches (the last, short one shared in proportion), the loss normalised by the global batch.
    50 training reviews, 7 steps at lr 5e-5: 1e-6 holds with a margin (measured 1e-7 at 1e-4); the
    learning rate is low because AdamW's epsilon 1e-8 lets near-zero gradients (an attention key
    bias has none in exact arithmetic) turn summation-order noise into steps of about lr."""
    model, reviews = finetuned["1proc-x-16"].parent / "tiny", finetuned["1proc-x-16"].parent / "test.csv"
    small = tmp_path / "reviews.csv"
    small.write_text("".join(reviews.read_text(encoding="utf-8").splitlines(keepends=True)[:57]), encoding="utf-8")
    args = [*FINETUNE, "--lr", "5e-5", "--train", small, "--model", model]
    outs = {name: tmp_path / name for name in ("one", "unequal")}
    run_cli("finetune", "--out", outs["one"], "--nproc", "1", "--batch-size", "8", *args)
    proc = run_cli("finetune", "--out", outs["unequal"], "--nproc", "2", "--batch-size", "6,2", *args)
    assert "global batch 8 = (6 + 2) x 1" in proc.stdout, proc.stdout
    # --balance auto, process 1 slowed from outside the product (tests/slow_rank.py, as in
    # test_communication): 4,4 becomes a larger share for process 0 after step 5, the same batches.
    _, line, new = run_balanced_with_a_slow_rank(
        "finetune", "--out", tmp_path / "balanced", "--batch-size", "4", "--balance", "auto", *args
    )
    assert sum(new) == 8 and new[0] > new[1] and line.endswith("ms per example)"), line
    outs["balanced"] = tmp_path / "balanced"
    ref, got, got_balanced = (load_file(outs[n] / "best" / "model.safetensors") for n in outs)
    start = load_file(model / "model.safetensors")
    assert worst_difference({k: ref[k] for k in start if k in ref}, {k: start[k] for k in start if k in ref}) > 1e-4
    for weights in (got, got_balanced):
        worst = worst_difference(ref, weights)
        assert worst <= 1e-6, f"max abs parameter difference {worst:.3g}"


# --- tensor parallelism and dropout ----------------------------------------------------------------


def _tensor_parallel_dropout_worker(out: str) -> None:
    """One rank of a tp-2 group, set up as a training run sets it up: two training steps with dropout
    on, then every replicated parameter (the ones tensor parallelism leaves whole) compared with the
    other rank's."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from bertgpu.config import OptimConfig, ParallelConfig, PretrainConfig
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.tasks.common import Session, spread
    from bertgpu.training.optim import build_optimizer

    config = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
    session = Session(
        PretrainConfig(model="tiny", out=out, nproc=2, device="cpu", precision="fp32", parallel=ParallelConfig(tp=2)),
        config,
    )
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    net = spread(session, model, total_steps=2)  # seeds dropout as every training run does
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2), session.device)
    ids = torch.randint(5, 300, (4, 24), generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        mlm, nsp = net.train()(ids)
        (mlm.logsumexp(-1).mean() + nsp.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    replicated = torch.cat([p.detach().flatten() for p in model.parameters() if not isinstance(p, DTensor)])
    both = [torch.zeros_like(replicated) for _ in range(2)]
    dist.all_gather(both, replicated)
    if dist.get_rank() == 0:
        (Path(out) / "result.json").write_text(
            json.dumps(
                {"max_difference": (both[0] - both[1]).abs().max().item(), "changed": (replicated != 0).any().item()}
            )
        )
    session.stop.restore()


def test_dropout_agrees_within_a_tensor_parallel_group(tmp_path, monkeypatch):
    """The processes of a tp group compute the whole-model parts (embeddings, LayerNorms, heads)
    each for itself: with dropout on they must draw the same masks, or those copies drift apart."""
    from bertgpu.parallel import launch

    monkeypatch.setattr(launch, "_start_method", workers_from_a_fork_server)  # not 2 interpreters importing torch
    launch.launch(launch.worker_main, (_tensor_parallel_dropout_worker, str(tmp_path)), nproc=2)
    got = json.loads((tmp_path / "result.json").read_text())
    assert got["changed"] and got["max_difference"] == 0.0, got
