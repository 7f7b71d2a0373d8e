"""Pipeline parallelism (--pp) is one process on the same global batch: every schedule, 3D, resume, export.

Issue #18's acceptance: pretraining with --pp 2 (GPipe, 1F1B, interleaved 1F1B) and the 3D layout
--pp 2 --tp 2 --strategy fsdp end on the weights of one process with the same global batch to 1e-6
(fp32, dropout 0, lr 1e-4, 3 AdamW steps, gradients clipped to a norm of 0.5, below the ~1 they
have, so that the norm over all stages decides every step); a run that skips the tied embedding's
gradient sum, or counts the matrix twice in the norm, does not. Every run is a real gloo run
through the CLI, on a tiny BERT with 4 layers (2 stages of 2, or 4 stages of 1 when interleaved).
Measured: at most 2.0e-8 for pp 2 and 3.4e-8 for 3D; 4.9e-4 without the tied gradient sum, 1.1e-5 with
the matrix counted twice.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import transformers
from conftest import EXACT, TINY_FINETUNE, run_cli, sentiment_reviews, write_tiny_bert
from safetensors.torch import load_file
from test_parallel import evaluations, final_weights, losses, worst_difference

from bertgpu.config import ParallelConfig, PretrainConfig
from bertgpu.errors import UserError
from bertgpu.models.bert.config import BertConfig
from bertgpu.parallel.layout import check_layout
from bertgpu.tasks.checks import check_parallel

COMMON = [
    *EXACT,
    "--seed",
    "7",
    "--steps",
    "3",
    "--lr",
    "1e-4",
    "--warmup",
    "1",
    "--clip",
    "0.5",
    "--log-every",
    "1",
    "--save-every",
    "2",
    "--device",
    "cpu",
    "--loader-workers",
    "0",
]
PP2 = ["--nproc", "2", "--pp", "2", "--batch-size", "8"]
EVALUATED = ["--eval-instances", "25"]  # with --eval-data: 25, so that the last batch is short
LAYOUTS = {
    "one-process": (["--nproc", "1", "--batch-size", "8", *EVALUATED], {}, "1 process"),
    "gpipe": ([*PP2, "--pp-schedule", "gpipe"], {}, "2 processes = pp 2"),
    "1f1b": ([*PP2, "--pp-schedule", "1f1b", "--pp-microbatches", "4", *EVALUATED], {}, "2 processes = pp 2"),
    "interleaved-1f1b": (
        [*PP2, "--pp-schedule", "interleaved-1f1b", "--pp-stages-per-rank", "2"],
        {},
        "2 processes = pp 2",
    ),
    "3d": (
        ["--nproc", "8", "--pp", "2", "--tp", "2", "--strategy", "fsdp", "--batch-size", "4", *EVALUATED],
        {},
        "8 processes = pp 2 x dp 2 x tp 2, fsdp",
    ),
    # Negative controls, through a hook for tests only: the tied gradients not summed, the matrix counted twice.
    "no-tied-sync": ([*PP2], {"BERTGPU_TEST_BREAK_TIED": "sync"}, "2 processes = pp 2"),
    "tied-counted-twice": ([*PP2], {"BERTGPU_TEST_BREAK_TIED": "norm"}, "2 processes = pp 2"),
}
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory, small_english_data):
    """A tiny BERT's config.json with 4 encoder layers, the data's vocab."""
    from bertgpu.data.shards import ShardedCorpus

    config = BertConfig.preset("tiny", vocab_size=ShardedCorpus(small_english_data).vocab_size)
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps(dataclasses.replace(config, num_hidden_layers=4).to_hf_dict("BertForPreTraining")))
    return path


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, small_english_data, four_layers):
    """Each layout's run directory, run once for the module."""
    done = {}

    def get(name):
        if name not in done:
            flags, env, described = LAYOUTS[name]
            out = tmp_path_factory.mktemp("runs") / name
            if "--eval-instances" in flags:
                flags = [*flags, "--eval-data", small_english_data]
            proc = run_cli(
                "pretrain", "--data", small_english_data, "--model", four_layers, "--out", out, *flags, *COMMON, env=env
            )
            assert described in proc.stdout and "global batch 8" in proc.stdout, proc.stdout
            done[name] = out
        return done[name]

    return get


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "3d"])
def test_same_parameters_as_one_process_with_the_global_batch(name, layouts):
    ref, out = layouts("one-process"), layouts(name)
    first = losses(ref)
    assert len(first) == 3 and first[0] != first[-1]  # training moved the weights: the comparison means something
    worst = worst_difference(final_weights(ref), final_weights(out))
    assert worst <= TOLERANCE, f"max abs parameter difference {worst:.3g}"
    assert losses(out) == pytest.approx(first, abs=1e-5)  # the log's sums come from the last stage


@pytest.mark.parametrize("name", ["1f1b", "3d"])
def test_held_out_evaluation_runs_through_the_schedule(name, layouts):
    """Evaluation before the first step, at the step-2 checkpoint and the end: forward only through the
    schedule (its shapes inferred anew on each switch from and back to training), the last batch padded,
    the outputs sent from the last stage; the figures are one process's."""
    ours, ref = evaluations(layouts(name)), evaluations(layouts("one-process"))
    assert [r["step"] for r in ours] == [r["step"] for r in ref] == [0, 2, 3]
    for mine, theirs in zip(ours, ref):
        for key in ("eval_mlm_loss", "eval_mlm_acc", "eval_nsp_loss", "eval_nsp_acc"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-6), key


@pytest.mark.parametrize("name", ["no-tied-sync", "tied-counted-twice"])
def test_the_tied_embedding_is_one_matrix_across_stages(name, layouts):
    """Without the gradient sum over the embedding group the first stage's matrix misses the MLM head's
    gradient; counted twice, the clipping norm is too large. Either ends far from one process."""
    worst = worst_difference(final_weights(layouts("one-process")), final_weights(layouts(name)))
    assert worst > 5 * TOLERANCE, f"max abs parameter difference {worst:.3g}"


def test_a_pipeline_checkpoint_is_whole_and_gives_the_logits_of_one_process(layouts):
    """Every stage's tensors reach the Hugging Face directory: transformers loads it without a missing
    key and computes one process's logits (1e-5)."""
    ckpts = [layouts(name) / "checkpoints" / "step-0000003" for name in ("one-process", "1f1b")]
    assert len(list((ckpts[1] / "optimizer").glob("*.distcp"))) == 2  # each stage's process wrote its own
    models = []
    for ckpt in ckpts:
        model, info = transformers.BertForPreTraining.from_pretrained(ckpt, output_loading_info=True)
        assert not info["missing_keys"] and not info["mismatched_keys"], info
        models.append(model.eval())
    ids = torch.randint(5, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, got = (m(input_ids=ids, token_type_ids=torch.zeros_like(ids)) for m in models)
    torch.testing.assert_close(got.prediction_logits, ref.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.seq_relationship_logits, ref.seq_relationship_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "source, target",
    [("gpipe", ["--nproc", "1", "--batch-size", "8"]), ("one-process", [*PP2, "--pp-schedule", "1f1b"])],
    ids=["pp2-resumed-as-one-process", "one-process-resumed-as-pp2"],
)
def test_resume_across_pipeline_degrees(source, target, layouts, small_english_data, four_layers, tmp_path):
    """The optimizer state is saved per process under the parameters' own names (the decoder's copy once,
    as the embedding's), so a run saved at step 2 on one layout ends on another where the uninterrupted run does."""
    out = tmp_path / "run"
    shutil.copytree(layouts(source), out)
    shutil.rmtree(out / "checkpoints" / "step-0000003")
    proc = run_cli(
        "pretrain", "--data", small_english_data, "--model", four_layers, "--out", out, "--resume", *target, *COMMON
    )
    assert "step-0000002 at step 2" in proc.stdout, proc.stdout
    worst = worst_difference(final_weights(layouts("one-process")), final_weights(out))
    assert worst <= TOLERANCE, f"max abs parameter difference {worst:.3g}"


def test_finetune_with_pp_ends_on_the_weights_of_one_process(tmp_path, small_uncased_vocab):
    """Fine-tuning's batches differ in length (and the last is short): the stages see them padded to one
    shape, which changes nothing but the order of some sums. Tolerance 1e-5 as in test_parallel's
    fine-tuning layouts (AdamW epsilon 1e-8); measured 6e-7. The per-epoch evaluation runs through the
    schedule too, and agrees."""
    _, reviews = sentiment_reviews(tmp_path, test_per_class=60, train_per_class=0, seed=1)
    write_tiny_bert(tmp_path / "tiny", small_uncased_vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    flags = [*TINY_FINETUNE, "--dropout", "0", "--epochs", "1", "--lr", "1e-3"]  # compared runs: no dropout
    for name, layout in (("one", ["--nproc", "1"]), ("pp2", ["--nproc", "2", "--pp", "2"])):
        run_cli(
            "finetune", "--model", tmp_path / "tiny", "--train", reviews, "--out", tmp_path / name,
            "--batch-size", "16", *layout, *flags,
        )  # fmt: skip
    ref, got = (load_file(tmp_path / name / "best" / "model.safetensors") for name in ("one", "pp2"))
    worst = worst_difference(ref, got)
    assert worst <= 1e-5, f"max abs parameter difference {worst:.3g}"
    metrics = [json.loads((tmp_path / n / "metrics.json").read_text())["epochs"][0] for n in ("one", "pp2")]
    assert metrics[1]["eval_loss"] == pytest.approx(metrics[0]["eval_loss"], abs=1e-5)


@pytest.mark.parametrize(
    "run, parallel, needle",
    [
        ({"precision": "fp16", "device": "cuda"}, {}, "--precision fp16 does not work with --pp.*bf16"),
        ({}, {"grad_compression": "powersgd"}, "powersgd does not work with --pp: use fp16 or bf16"),
        ({}, {"balance": "auto"}, "--balance auto does not work with --pp"),
        ({}, {"pp": 3}, "--pp 3 x --tp 1 does not divide the 4 process"),
        ({}, {"pp": 2, "pp_stages_per_rank": 2, "pp_schedule": "interleaved-1f1b"}, "makes 4 stages, more than"),
        ({"batch_size": 6}, {"pp_microbatches": 4}, "--pp-microbatches 4 does not divide"),
        ({}, {"pp_microbatches": 1}, "1f1b needs at least as many micro-batches as --pp 2"),
        ({}, {"pp": 2, "tp": 2}, ""),  # 4 processes = pp 2 x tp 2: fine
    ],
    ids=["fp16", "powersgd", "balance", "pp-not-dividing", "more-stages-than-layers", "microbatches", "1f1b-m", "ok"],
)
def test_what_does_not_compose_is_refused_in_one_line(run, parallel, needle, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    model = BertConfig.preset("tiny", vocab_size=100)  # 2 layers
    cfg = PretrainConfig(
        model="tiny", out="x", nproc=4, **{"device": "cpu", **run}, parallel=ParallelConfig(**{"pp": 2, **parallel})
    )
    if not needle:
        assert check_layout(cfg, model).describe() == "4 processes = pp 2 x tp 2"
        return
    with pytest.raises(UserError, match=needle) as e:
        check_layout(cfg, model)
    assert "\n" not in str(e.value)


def test_stages_per_rank_needs_the_interleaved_schedule():
    with pytest.raises(UserError, match="needs --pp-schedule interleaved-1f1b"):
        check_parallel(ParallelConfig(pp=2, pp_stages_per_rank=2, pp_schedule="1f1b"))


def test_the_pipelines_model_has_no_forward_pass_of_its_own_to_fuse_with_the_loss():
    """``WholeModel.forward_backward_objective`` runs the forward pass and the loss as one function, which needs the
    whole pass on one process; the pipeline's stages run it across processes, the loss on the last: its
    ``PipelineModel`` derives from ``ParallelModel`` (``forward_backward``), not from ``WholeModel``. No spread
    model has a ``step`` that is no optimizer step."""
    from bertgpu.parallel.pipeline import PipelineModel
    from bertgpu.parallel.wrap import ParallelModel, WholeModel

    assert issubclass(PipelineModel, ParallelModel) and not issubclass(PipelineModel, WholeModel)
    assert hasattr(WholeModel, "forward_backward_objective")
    assert not hasattr(PipelineModel, "forward_backward_objective") and not hasattr(ParallelModel, "whole_step")
    assert PipelineModel.forward_backward is not ParallelModel.forward_backward  # its own, through the schedule
    assert not any(hasattr(cls, "step") for cls in (ParallelModel, WholeModel, PipelineModel))
