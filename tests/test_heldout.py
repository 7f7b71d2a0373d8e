"""Held-out evaluation of pretraining (issue 22): documents held out are never trained on, a resume
holds out the same ones, `bertgpu evaluate` on prepared data gives what transformers computes, and bad
input is one line. (The same figure in every layout is proved with the parity runs, test_parallel.py.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import EXACT, TINY_RUN, run_cli
from test_cli_errors import assert_one_line_error, assert_one_line_error_in_process

TINY = [*TINY_RUN, *EXACT, "--batch-size", "4", "--max-seq-length", "64"]


def test_held_out_documents_never_reach_training(small_english_data):
    """Every sentence that any training instance reads, over two epochs (random next sentences
    included), lies in a training document; the held-out ones depend on the seed and fraction only."""
    from bertgpu.config import DataConfig
    from bertgpu.data.heldout import heldout_documents, split_documents
    from bertgpu.data.pretraining import PretrainingDataset
    from bertgpu.data.shards import ShardedCorpus
    from bertgpu.data.tokenizer import load_vocab

    corpus = ShardedCorpus(small_english_data)
    held = heldout_documents(corpus.num_documents, 0.2, seed=3)
    assert len(held) == round(0.2 * corpus.num_documents)
    assert np.array_equal(held, heldout_documents(corpus.num_documents, 0.2, seed=3))
    assert not np.array_equal(held, heldout_documents(corpus.num_documents, 0.2, seed=4))
    train, evaluation = split_documents(corpus, held)
    read: list[tuple[int, int]] = []
    tokens = corpus.tokens

    def recording(start, end):
        read.append((start, end))
        return tokens(start, end)

    corpus.tokens = recording
    dataset = PretrainingDataset(
        train, DataConfig(data=str(small_english_data), max_seq_length=64), 3, load_vocab(corpus.vocab_path)
    )
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        for i in range(len(dataset)):
            dataset[i]
    heldout_sentences = np.zeros(corpus.num_sentences, dtype=bool)
    for d in held:
        heldout_sentences[corpus.doc_offsets[d] : corpus.doc_offsets[d + 1]] = True
    assert len(read) > 2 * len(dataset)
    assert not any(heldout_sentences[start:end].any() for start, end in read)
    # and the evaluation subset reads held-out text only, token for token the corpus's
    first = int(corpus.doc_offsets[held[0]])
    assert np.array_equal(evaluation.tokens(0, 1), tokens(first, first + 1))


def held_out_run(data, run) -> list:
    return ["pretrain", "--data", data, "--out", run, *TINY, "--save-every", "2", "--eval-instances", "8"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, small_english_data):
    """2 steps holding out 20% of the documents, evaluated at step 2: (its directory, the finished command).
    The resume test continues a copy of it; its step-2 checkpoint is the model the evaluation tests use."""
    run = tmp_path_factory.mktemp("mlm") / "run"
    return run, run_cli(*held_out_run(small_english_data, run), "--steps", "2", "--eval-fraction", "0.2")


def test_resume_holds_out_the_same_documents(tmp_path, small_english_data, first_run):
    run = tmp_path / "run"
    shutil.copytree(first_run[0], run)
    common = held_out_run(small_english_data, run)
    first = first_run[1]  # `common` with --steps 2 --eval-fraction 0.2, into the directory copied to `run`
    held = torch.load(run / "checkpoints" / "step-0000002" / "training_state.pt", weights_only=True)[
        "heldout_documents"
    ]
    resumed = run_cli(*common, "--steps", "4", "--eval-fraction", "0.4", "--resume")  # the recorded ones win
    again = torch.load(run / "checkpoints" / "step-0000004" / "training_state.pt", weights_only=True)[
        "heldout_documents"
    ]
    assert torch.equal(held, again)
    where = first.stdout.split("evaluated on ")[1].split(";")[0]
    assert where in resumed.stdout and f"{len(held)} held-out documents" in where
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_mlm_loss" in r] == [0, 2, 4]  # step 0: the untrained model


@pytest.fixture(scope="module")
def checkpoint_dir(first_run):
    return first_run[0] / "checkpoints" / "step-0000002"


def _transformers_losses(model, eval_set, nsp: bool) -> dict[str, float]:
    """Masked-token cross-entropy (and NSP) of a transformers model over the evaluation instances."""
    loss_sum = masked = correct = nsp_sum = 0.0
    with torch.no_grad():
        for k in range(len(eval_set)):
            x = {key: torch.as_tensor(v)[None] for key, v in eval_set.instance(k).items()}
            out = model(
                input_ids=x["input_ids"], token_type_ids=x["token_type_ids"], attention_mask=x["attention_mask"]
            )
            logits = out.prediction_logits if nsp else out.logits
            picked = logits[0, x["mlm_positions"][0]]
            labels = x["mlm_labels"][0]
            valid = labels != -100
            loss_sum += torch.nn.functional.cross_entropy(picked[valid], labels[valid], reduction="sum").item()
            masked += valid.sum().item()
            correct += (picked[valid].argmax(-1) == labels[valid]).sum().item()
            if nsp:
                nsp_sum += torch.nn.functional.cross_entropy(out.seq_relationship_logits, x["nsp_label"]).item()
    result = {"eval_mlm_loss": loss_sum / masked, "eval_mlm_acc": correct / masked}
    if nsp:
        result["eval_nsp_loss"] = nsp_sum / len(eval_set)
    return result


@pytest.mark.parametrize("kind", ["ours", "transformers-masked-lm"])
def test_evaluate_on_prepared_data_gives_what_transformers_computes(kind, checkpoint_dir, small_english_data, tmp_path):
    """Ours (BertForPreTraining, NSP too) and a transformers BertForMaskedLM directory (no NSP head):
    the metrics of `bertgpu evaluate --data DIR` on 2 processes equal transformers' forward passes on
    the same masked instances, to 1e-5 (float32 logits, float64 sums)."""
    import transformers

    from bertgpu.config import DataConfig
    from bertgpu.data.heldout import EvalSet
    from bertgpu.data.shards import ShardedCorpus

    if kind == "ours":
        model_dir, nsp = checkpoint_dir, True
        model = transformers.BertForPreTraining.from_pretrained(model_dir).eval()
    else:
        model_dir, nsp = tmp_path / "masked-lm", False
        config = transformers.BertConfig.from_pretrained(checkpoint_dir)
        torch.manual_seed(1)
        model = transformers.BertForMaskedLM(config).eval()
        model.save_pretrained(model_dir)
        for name in ("vocab.txt", "tokenizer_config.json"):
            (model_dir / name).write_bytes((checkpoint_dir / name).read_bytes())
    proc = run_cli(
        "evaluate",
        "--model",
        model_dir,
        "--data",
        small_english_data,
        "--eval-instances",
        "9",
        "--max-seq-length",
        "64",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--json",
    )
    ours = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ours["instances"] == 9 and ("eval_nsp_loss" in ours) == nsp
    eval_set = EvalSet(
        ShardedCorpus(small_english_data), DataConfig(data=str(small_english_data), max_seq_length=64), 42, 9, "test"
    )
    theirs = _transformers_losses(model, eval_set, nsp)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=1e-5), key
    assert ours["eval_perplexity"] == pytest.approx(np.exp(theirs["eval_mlm_loss"]), rel=1e-5)


def test_bad_evaluation_input_is_one_line(
    tmp_path, small_english_data, english_data, checkpoint_dir, minilm_dir, capsys
):
    """Each found before any worker starts: checked in this process (in_process_error), but the first,
    which a real process runs."""
    common = ["pretrain", "--data", small_english_data, "--out", tmp_path / "run", *TINY, "--steps", "1"]
    proc = run_cli(*common, "--eval-data", english_data, check=False)
    assert_one_line_error(proc, f"--eval-data {english_data} was prepared with another vocab")
    for fraction in ("0.6", "-0.1"):
        assert_one_line_error_in_process([*common, "--eval-fraction", fraction], "--eval-fraction must be in (0, 0.5]")
    args = [*common, "--eval-data", small_english_data, "--eval-instances", "1", "--nproc", "2"]
    assert_one_line_error_in_process(args, "gives 1 instance(s), fewer than the 2 data-parallel processes")
    assert not (tmp_path / "run").exists()
    args = ["evaluate", "--model", minilm_dir, "--data", english_data]
    assert_one_line_error_in_process(args, "has no masked-LM head")
    args = ["evaluate", "--model", checkpoint_dir, "--data", english_data]
    assert_one_line_error_in_process(args, "was prepared with another vocab than the model's")


def test_the_unigram_plateau_is_the_loss_of_predicting_token_frequencies(small_english_data):
    """``EvalSet.unigram_loss``: a model whose logits are the log-frequencies of the set's own masked tokens (the
    best context-free predictor of them) scores, through ``evaluate_mlm``, the set's plain entropy, which the
    estimate exceeds by exactly its small-sample correction, (distinct - 1) / (2 x masked) (float64 sums)."""
    from types import SimpleNamespace

    from bertgpu.config import DataConfig
    from bertgpu.data.heldout import EvalSet
    from bertgpu.data.shards import ShardedCorpus
    from bertgpu.training.evaluation import evaluate_mlm

    corpus = ShardedCorpus(small_english_data)
    eval_set = EvalSet(corpus, DataConfig(data=str(small_english_data), max_seq_length=64), 42, 40, "test")
    labels = np.concatenate([eval_set.instance(k)["mlm_labels"] for k in range(len(eval_set))])
    counts = np.bincount(labels[labels >= 0], minlength=corpus.vocab_size).astype(np.float64)
    log_p = torch.tensor(np.log(np.maximum(counts, 1e-300) / counts.sum()), dtype=torch.float32)

    class Frequencies(torch.nn.Module):
        def forward(self, input_ids, token_type_ids, attention_mask, mlm_positions):
            return log_p.expand(*mlm_positions.shape, -1), None

    dims = SimpleNamespace(dp=1, dp_rank=0, dp_sum=lambda t: t)
    loss = evaluate_mlm(Frequencies(), eval_set, dims, torch.device("cpu"), 8, nsp=False)["eval_mlm_loss"]
    correction = (np.count_nonzero(counts) - 1) / (2 * counts.sum())
    assert 0 < correction < 0.5 and eval_set.unigram_loss() == pytest.approx(loss + correction, abs=1e-5)


def test_the_evaluation_line_says_when_the_model_is_still_on_the_unigram_plateau():
    """The mark from step 1 while the loss is within PLATEAU_MARGIN of the plateau (or above it), none once the
    model is below it; the warning naming what to change once, from 3/4 of the run on."""
    from bertgpu.training.evaluation import PLATEAU_MARGIN, plateau_note

    assert plateau_note(9.0, 6.1, 0, 100, False) == ("", False)  # the untrained model: nothing to judge yet
    assert plateau_note(6.1 - PLATEAU_MARGIN - 0.01, 6.1, 80, 100, False) == ("", False)
    note, warned = plateau_note(6.2, 6.1, 50, 100, False)
    assert "not below the unigram plateau (6.10" in note and "warning" not in note and not warned
    note, warned = plateau_note(6.2, 6.1, 75, 100, False)
    assert warned and "bertgpu: warning: at step 75 of 100" in note and "--lr" in note and "--warmup" in note
    assert "warning" not in plateau_note(6.2, 6.1, 90, 100, True)[0]  # said once


def test_evaluation_does_not_compile_the_layers_that_training_compiled(small_english_data):
    """--compile with several processes compiles each encoder layer in place. The held-out evaluation runs them
    eager: compiled, its no-grad passes and batch shapes each compiled again, and a ModernBERT (three layer graphs)
    reached torch._dynamo's recompile limit at its first evaluation, after which training ran eager."""
    from types import SimpleNamespace

    from test_modernbert import small_config

    from bertgpu.config import DataConfig
    from bertgpu.data.heldout import EvalSet
    from bertgpu.data.shards import ShardedCorpus
    from bertgpu.models.modernbert.model import ModernBertForMaskedLM
    from bertgpu.training.evaluation import MODEL_INPUTS, evaluate_mlm

    corpus = ShardedCorpus(small_english_data)
    eval_set = EvalSet(corpus, DataConfig(data=str(small_english_data), max_seq_length=64), 42, 20, "test")
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(small_config(corpus.vocab_size, max_position_embeddings=64))
    torch._dynamo.reset()
    for layer in model.model.layers:
        layer.compile(backend="eager", dynamic=False)  # what parallelize() does, without inductor's C++ build
    batch = torch.utils.data.default_collate([eval_set.instance(k) for k in range(4)])

    def train_forward():
        logits, _ = model(*(batch[k] for k in MODEL_INPUTS))
        logits.sum().backward()

    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    train_forward()
    trained = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    dims = SimpleNamespace(dp=1, dp_rank=0, dp_sum=lambda t: t)
    evaluate_mlm(model, eval_set, dims, torch.device("cpu"), 8, nsp=False)  # batches of 8, 8 and 4, no grad
    train_forward()
    assert trained == 3  # layer 0 (no attention norm), a local layer, a global one
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == trained
