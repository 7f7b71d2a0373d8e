"""Bad input gets one clear line and a non-zero exit, and nothing half-written (acceptance 6)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from conftest import TINY_RUN, run_cli, run_in_process, write_tiny_bert


def assert_one_line_error(proc, *needles: str) -> str:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("bertgpu: error: "), err
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


def in_process_error(*args) -> str:
    """`bertgpu ARGS` run in this process (conftest.run_in_process), for mistakes found before any worker
    starts: the one line it prints, after checking it is exactly one line and exit code 2, with no
    traceback on either stream. (run_cli also runs one-process commands in this process; the tests that
    pass it ``fresh=True`` keep the exit status and whole stderr of a new interpreter covered.)"""
    proc = run_in_process(*map(str, args))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("bertgpu: error: "), err
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    return err


def assert_one_line_error_in_process(args: list, *needles: str) -> str:
    """``in_process_error`` of ``args``, holding every needle (as assert_one_line_error)."""
    err = in_process_error(*args)
    for needle in needles:
        assert needle in err, err
    return err


def test_missing_corpus(tmp_path, uncased_vocab):
    out = tmp_path / "data"
    # fresh interpreters: a user's exit status and whole stderr, not just what Python's streams carry
    proc = run_cli("prepare", tmp_path / "nope.txt", "--vocab", uncased_vocab, "--out", out, check=False, fresh=True)
    assert_one_line_error(proc, "nope.txt")
    assert not out.exists()
    proc = run_cli("vocab", tmp_path / "nope", "--size", "200", "--out", tmp_path / "v.txt", check=False, fresh=True)
    assert_one_line_error(proc, "nope")
    assert not (tmp_path / "v.txt").exists()


def test_empty_corpus(tmp_path, uncased_vocab, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    out = tmp_path / "data"
    assert_one_line_error_in_process(["prepare", empty, "--vocab", uncased_vocab, "--out", out], "empty")
    assert not out.exists() and list(tmp_path.iterdir()) == [empty]
    assert_one_line_error_in_process(["vocab", empty, "--size", "300", "--out", tmp_path / "v.txt"], "empty")
    assert list(tmp_path.iterdir()) == [empty]


@pytest.mark.parametrize("missing", ["[CLS]", "[SEP]", "[MASK]"])
def test_vocab_without_special_tokens(tmp_path, english_corpus, uncased_vocab, missing, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(t for t in uncased_vocab.read_text().splitlines() if t != missing) + "\n")
    args = ["prepare", english_corpus, "--vocab", vocab, "--out", tmp_path / "data"]
    assert_one_line_error_in_process(args, missing, str(vocab))
    assert not (tmp_path / "data").exists()


def test_data_from_another_vocab_than_the_model(tmp_path, small_english_data, minilm_dir, capsys):
    """Data prepared with a vocab of its own (2,000 tokens trained on the corpus) and MiniLM's vocab."""
    run = tmp_path / "run"
    args = ["pretrain", "--data", small_english_data, "--model", minilm_dir, "--out", run, "--steps", "1"]
    assert_one_line_error_in_process(args, "another vocab")
    assert not run.exists()


def test_max_seq_length_beyond_the_model_positions(tmp_path, english_data, capsys):
    run = tmp_path / "run"
    args = ["pretrain", "--data", english_data, "--model", "tiny", "--out", run, "--max-seq-length", "1024"]
    assert_one_line_error_in_process([*args, "--nproc", "2"], "--max-seq-length 1024", "512")
    assert not run.exists()


def test_bad_flags(tmp_path, english_data, capsys):
    for flags, needle in [(["--batch-size", "0"], "--batch-size"), (["--model", "huge"], "huge")]:
        args = ["pretrain", "--data", english_data, "--model", "tiny", "--out", tmp_path / "r", *flags]
        assert_one_line_error_in_process(args, needle)
    args = ["pretrain", "--data", tmp_path / "nodata", "--model", "tiny", "--out", tmp_path / "r"]
    assert_one_line_error_in_process(args, "nodata", "bertgpu prepare")


@pytest.mark.parametrize("command", ["pretrain", "finetune", "evaluate"])
def test_nproc_below_zero_is_named_as_such(tmp_path, command, capsys):
    """`--nproc -1` was "--pp 1 x --tp 1 needs at least 1 processes, the run has -1": flags never given."""
    out = tmp_path / "run"
    args = {
        "pretrain": ["--data", tmp_path / "data", "--model", "tiny", "--out", out],
        "finetune": ["--model", "tiny", "--train", tmp_path / "t.csv", "--out", out],
        "evaluate": ["--model", tmp_path / "clf", "--data", tmp_path / "t.csv", "--output", out],
    }[command]
    err = in_process_error(command, *args, "--nproc", "-1")
    assert err == "bertgpu: error: --nproc must be at least 1, got -1 (or 0: one per GPU, or 1 on CPU)", err
    assert not out.exists()


@pytest.mark.parametrize(
    "command, flags, needles",
    [
        ("pretrain", ["--tp", "2", "--nproc", "3"], ["--tp 2 does not divide the 3 process"]),
        ("pretrain", ["--tp", "4", "--nproc", "4"], ["--tp 4 does not divide", "2 attention heads"]),
        ("pretrain", ["--tp", "2", "--nproc", "1"], ["--tp 2 needs at least 2 processes, the run has 1"]),
        ("pretrain", ["--tp", "0"], ["--tp must be at least 1"]),
        ("finetune", ["--tp", "3", "--nproc", "2"], ["--tp 3 needs at least 3 processes"]),
    ],
    ids=["tp-not-dividing-processes", "tp-not-dividing-heads", "tp-without-processes", "tp-zero", "finetune-tp"],
)
def test_bad_layouts(tmp_path, english_data, minilm_dir, capsys, command, flags, needles):
    """Checked before any process starts: nothing is written."""
    if command == "pretrain":
        args = ["pretrain", "--data", english_data, "--model", "tiny"]
    else:
        reviews = tmp_path / "reviews.csv"
        reviews.write_text("text,label\ngood,pos\nbad,neg\nfine,pos\nawful,neg\n")
        args = ["finetune", "--model", minilm_dir, "--train", reviews]
    err = in_process_error(*args, "--out", tmp_path / "run", "--device", "cpu", *flags)
    assert all(needle in err for needle in needles), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--batch-size", "4,4,4", "--nproc", "2"], "--batch-size 4,4,4 gives 3 sizes for 2 data-parallel rank(s)"),
        (["--batch-size", "4,0", "--nproc", "2"], "--batch-size must be at least 1"),
        (["--batch-size", "four"], "--batch-size four: give a number"),
        (["--balance", "auto", "--nproc", "1"], "--balance auto needs at least 2 data-parallel processes"),
        (["--balance", "auto", "--nproc", "2", "--strategy", "fsdp"], "--balance auto works with --strategy ddp"),
        (
            ["--grad-compression", "powersgd", "--nproc", "2", "--strategy", "fsdp"],
            "powersgd works with --strategy ddp",
        ),
        (["--grad-compression", "powersgd", "--nproc", "2", "--tp", "2"], "powersgd works with --strategy ddp"),
        (["--powersgd-rank", "0"], "--powersgd-rank must be at least 1"),
        (["--lr-scaling", "linear", "--reference-batch", "0"], "--reference-batch must be at least 1"),
        (["--optimizer", "rmsprop", "--rmsprop-alpha", "1"], "--rmsprop-alpha must be in [0, 1)"),
    ],
    ids=[
        "sizes-for-ranks",
        "size-zero",
        "size-not-a-number",
        "balance-one-process",
        "balance-fsdp",
        "powersgd-fsdp",
        "powersgd-tp",
        "powersgd-rank",
        "reference-batch",
        "rmsprop-alpha",
    ],
)
def test_bad_communication_flags(tmp_path, english_data, capsys, flags, needle):
    err = in_process_error(
        "pretrain",
        "--data",
        english_data,
        "--model",
        "tiny",
        "--out",
        tmp_path / "run",
        "--device",
        "cpu",
        *flags,
    )
    assert needle in err
    assert not (tmp_path / "run").exists()


def test_fp16_with_sharded_gradients_is_refused(monkeypatch):
    """fp16's gradient scaler decides on each process's own gradients; with FSDP or tensor parallelism
    those are shards, so the processes could disagree on skipping a step: bf16 is the answer."""
    import torch

    from bertgpu.config import ParallelConfig, PretrainConfig
    from bertgpu.errors import UserError
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.tasks.common import check_layout

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    model = BertConfig.preset("tiny", vocab_size=100)
    for parallel in (ParallelConfig(strategy="fsdp"), ParallelConfig(tp=2)):
        cfg = PretrainConfig(model="tiny", out="x", nproc=2, device="cuda", precision="fp16", parallel=parallel)
        with pytest.raises(UserError, match="--precision fp16 works with --strategy ddp only.*bf16"):
            check_layout(cfg, model)
    check_layout(PretrainConfig(model="tiny", out="x", nproc=2, device="cuda", precision="fp16"), model)  # ddp: fine


def test_non_empty_run_directory_needs_overwrite(tmp_path, english_data, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "precious.txt").write_text("keep me")
    assert_one_line_error_in_process(
        ["pretrain", "--data", english_data, "--model", "tiny", "--out", run], "--overwrite"
    )
    assert (run / "precious.txt").read_text() == "keep me"


# ---------------------------------------------------------------------------------------------
# The bad-input catalogue of the resume issue: each a clear line, a non-zero exit, nothing half-written.


def test_only_one_sentence_documents_suggests_no_nsp(tmp_path, uncased_vocab, capsys):
    corpus = tmp_path / "lines.txt"
    corpus.write_text("".join(f"Sentence number {i} stands alone.\n\n" for i in range(200)))
    run_cli("prepare", corpus, "--vocab", uncased_vocab, "--out", tmp_path / "data")
    args = ["pretrain", "--data", tmp_path / "data", "--model", "tiny", "--out", tmp_path / "run"]
    assert_one_line_error_in_process(args, "single sentence", "--no-nsp")
    assert not (tmp_path / "run").exists()
    # MLM alone on 2 processes: DDP must not wait for gradients of the NSP head, which gets none.
    run_cli(
        "pretrain",
        "--data",
        tmp_path / "data",
        "--out",
        tmp_path / "run",
        *TINY_RUN,
        "--no-nsp",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--nproc",
        "2",
    )


def test_binary_file(tmp_path, uncased_vocab, capsys):
    blob = tmp_path / "model.bin"
    blob.write_bytes(bytes(range(256)) * 64)
    assert_one_line_error_in_process(
        ["prepare", blob, "--vocab", uncased_vocab, "--out", tmp_path / "data"], str(blob), "binary"
    )
    assert not (tmp_path / "data").exists()


def test_non_utf8_is_replaced_and_warned_or_an_error_with_strict(tmp_path, uncased_vocab, capsys):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(
        "A plain first line.\nCaf\xe9 au lait.\n\nAnother document here.\nWith two lines.\n".encode("latin-1")
    )
    proc = run_cli("prepare", corpus, "--vocab", uncased_vocab, "--out", tmp_path / "data")
    warning = [line for line in proc.stderr.splitlines() if line.startswith("bertgpu: warning:")]
    assert len(warning) == 1 and f"{corpus}:2" in warning[0], proc.stderr
    args = ["prepare", corpus, "--vocab", uncased_vocab, "--out", tmp_path / "strict", "--strict"]
    assert_one_line_error_in_process(args, f"{corpus}:2", "UTF-8")
    assert not (tmp_path / "strict").exists()


def test_a_10mb_single_line(tmp_path, uncased_vocab, capsys):
    corpus = tmp_path / "dump.txt"
    corpus.write_text("First document, first sentence.\nAnd its second.\n\n" + "word " * 2_097_152 + "\n")
    proc = run_cli("prepare", corpus, "--vocab", uncased_vocab, "--out", tmp_path / "data")
    assert f"{corpus}:4" in proc.stderr and "one sentence per line" in proc.stderr
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert meta["sentences"] == 3 and meta["tokens"] > 2_000_000
    args = ["prepare", corpus, "--vocab", uncased_vocab, "--out", tmp_path / "strict", "--strict"]
    assert_one_line_error_in_process(args, f"{corpus}:4")


def test_duplicate_vocab_entries(tmp_path, english_corpus, uncased_vocab, capsys):
    tokens = uncased_vocab.read_text().splitlines()
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(tokens + ["the"]) + "\n")
    args = ["prepare", english_corpus, "--vocab", vocab, "--out", tmp_path / "data"]
    line = assert_one_line_error_in_process(args, str(vocab), "the")
    assert str(tokens.index("the") + 1) in line and str(len(tokens) + 1) in line


def test_model_and_data_disagree_on_vocab_size(tmp_path, english_data, capsys):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "bert",
                "vocab_size": 1000,
                "hidden_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 128,
            }
        )
    )
    args = ["pretrain", "--data", english_data, "--model", config, "--out", tmp_path / "run"]
    assert_one_line_error_in_process(args, "1000", "30522")


def test_no_gpu_or_too_few_gpus(tmp_path, english_data, monkeypatch, capsys):
    import torch

    from bertgpu.errors import UserError
    from bertgpu.parallel import launch

    if not torch.cuda.is_available():
        args = ["pretrain", "--data", english_data, "--model", "tiny", "--out", tmp_path / "run", "--device", "cuda"]
        assert_one_line_error_in_process([*args, "--nproc", "2"], "no CUDA GPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError, match="--nproc 4 is more than the 2 GPU"):
        launch.resolve_nproc(4, "cuda")
    assert launch.resolve_nproc(0, "cuda") == 2


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, english_data):
    """A finished 2-step run (its checkpoint at step 2), which each test below copies and resumes or damages."""
    run = tmp_path_factory.mktemp("two-steps") / "run"
    run_cli("pretrain", "--data", english_data, "--out", run, *TINY_RUN, "--batch-size", "4", "--steps", "2")
    return run


def test_disk_full_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, english_data, two_step_run):
    """A write that fails half-way (here: a file-size limit of 2 MB, as a full disk would) leaves the previous
    checkpoint the latest, removes the partial one, and says so in one line. The run is a process of its own (the
    limit is its), forked from the test worker's fork server (procs.Forked)."""
    import transformers
    from procs import Forked

    run = tmp_path / "run"
    args = ["pretrain", "--data", english_data, "--out", run, *TINY_RUN, "--batch-size", "4", "--save-every", "2"]
    shutil.copytree(two_step_run, run)  # `args` with --steps 2, run to its end
    argv = ["bertgpu", *map(str, args), "--steps", "4", "--resume"]
    proc = Forked(argv, dict(os.environ), file_size=2_000_000).completed(600)
    assert_one_line_error(proc, "could not write checkpoint", "step-0000004", "step-0000002 is intact")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000002"]
    transformers.BertForPreTraining.from_pretrained(run / "checkpoints" / "step-0000002")


@pytest.mark.parametrize("damaged", ["model.safetensors", "training_state.pt"])
def test_truncated_checkpoint_file(tmp_path, english_data, two_step_run, damaged):
    run = tmp_path / "run"
    args = ["pretrain", "--data", english_data, "--out", run, *TINY_RUN, "--batch-size", "4"]
    shutil.copytree(two_step_run, run)  # `args` with --steps 2, run to its end
    path = run / "checkpoints" / "step-0000002" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    proc = run_cli(*args, "--steps", "4", "--resume", check=False)
    assert_one_line_error(proc, str(path))
    proc = run_cli(
        "pretrain",
        "--data",
        english_data,
        "--model",
        path.parent,
        "--out",
        tmp_path / "other",
        "--steps",
        "2",
        check=False,
    )
    if damaged == "model.safetensors":
        assert_one_line_error(proc, str(path))
        assert not (tmp_path / "other").exists()  # refused before the run made its --out


def test_a_damaged_model_leaves_no_out_directory(tmp_path, tiny_classifier_setup, capsys):
    """`finetune` from a truncated model.safetensors left an empty --out behind its one line, which the next start
    then refused without --overwrite; a --out that was there before stays."""
    model, reviews = tiny_classifier_setup
    damaged = shutil.copytree(model, tmp_path / "damaged")
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "run"
    args = ["finetune", "--model", damaged, "--train", reviews, "--text-column", "review", "--out", out]
    assert_one_line_error_in_process([*args, "--device", "cpu"], f"{weights}: cannot read safetensors weights")
    assert not out.exists()
    out.mkdir()
    assert_one_line_error_in_process([*args, "--device", "cpu"], f"{weights}: cannot read safetensors weights")
    assert out.is_dir()


# ---------------------------------------------------------------------------------------------
# Fine-tuning on one small GPU: LoRA, quantisation and accumulation flags.


@pytest.fixture(scope="module")
def tiny_classifier_setup(tmp_path_factory, small_uncased_vocab):
    """(a random tiny BERT directory, a 4-row CSV): enough for the checks made before training."""
    root = tmp_path_factory.mktemp("small-gpu")
    write_tiny_bert(root / "tiny", small_uncased_vocab)
    (root / "reviews.csv").write_text("label,review\n好评,很好\n差评,很差\n好评,不错\n差评,太差\n", encoding="utf-8")
    return root / "tiny", root / "reviews.csv"


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--lora-rank", "0"], ["--lora-rank must be at least 1, got 0"]),
        (["--quantize", "nf4"], ["--quantize needs --lora-rank"]),
        (["--lora-alpha", "16"], ["--lora-alpha needs --lora-rank"]),
        (["--lora-rank", "4", "--lora-dropout", "1"], ["--lora-dropout must be in [0, 1)"]),
        (["--grad-accum", "0"], ["--grad-accum must be at least 1, got 0"]),
        (["--lora-rank", "4", "--lora-targets", "query,attention"], ["--lora-targets attention", "no linear layer"]),
        (["--lora-rank", "4", "--lora-targets", "classifier"], ["classifier head is trained whole"]),
        (["--lora-rank", "4", "--tp", "2", "--nproc", "2"], ["--tp 2 cannot split LoRA's adapted layers", "fsdp"]),
        (
            ["--lora-rank", "4", "--quantize", "int8", "--strategy", "fsdp", "--nproc", "2"],
            ["--quantize int8 cannot be sharded with --strategy fsdp"],
        ),
    ],
    ids=[
        "rank-0",
        "quantize-without-lora",
        "alpha-without-lora",
        "dropout-1",
        "grad-accum-0",
        "unknown-target",
        "head-as-target",
        "lora-with-tp",
        "quantize-with-fsdp",
    ],
)
def test_bad_lora_and_accumulation_flags(tmp_path, tiny_classifier_setup, flags, needles, capsys):
    model, reviews = tiny_classifier_setup
    args = ["finetune", "--model", model, "--train", reviews, "--text-column", "review", "--out", tmp_path / "run"]
    assert_one_line_error_in_process([*args, "--device", "cpu", *flags], *needles)
    assert not (tmp_path / "run").exists()


def test_quantize_without_bitsandbytes_says_what_to_install(tmp_path, tiny_classifier_setup, monkeypatch):
    """A machine without bitsandbytes (here: an import of it that fails, as where it is not installed; in this
    process, as the check runs before any worker: no interpreter of its own with a shadowing PYTHONPATH)."""
    import sys

    model, reviews = tiny_classifier_setup
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` raises ImportError
    proc = run_cli(
        "finetune",
        "--model",
        model,
        "--train",
        reviews,
        "--text-column",
        "review",
        "--out",
        tmp_path / "run",
        "--device",
        "cpu",
        "--lora-rank",
        "4",
        "--quantize",
        "nf4",
        check=False,
    )
    assert_one_line_error(proc, "--quantize nf4 needs the bitsandbytes package", "pip install 'bertgpu[quant]'")
    assert not (tmp_path / "run").exists()


def test_a_finetune_run_without_best_yet(tmp_path, capsys):
    run = tmp_path / "clf"
    (run / "checkpoints").mkdir(parents=True)
    assert_one_line_error_in_process(
        ["predict", "--model", run, "some text"], str(run), "without a classifier yet", "best/"
    )


# ---------------------------------------------------------------------------------------------
# Chinese whole-word masking and `bertgpu inspect` (issue 12).


def test_zh_wwm_without_the_segmenter(tmp_path, uncased_vocab):
    """rjieba is an extra ([zh]): without it, --zh-wwm says what to install, before reading anything."""
    hide = tmp_path / "hide"
    (hide / "rjieba").mkdir(parents=True)
    (hide / "rjieba" / "__init__.py").write_text("raise ImportError('No module named rjieba')\n")
    corpus = tmp_path / "zh.txt"
    corpus.write_text("今天天气不错。\n我们去公园吧。\n")
    out = tmp_path / "data"
    proc = run_cli(
        "prepare",
        corpus,
        "--vocab",
        uncased_vocab,
        "--out",
        out,
        "--zh-wwm",
        check=False,
        env={"PYTHONPATH": str(hide)},
    )
    assert_one_line_error(proc, "--zh-wwm", "pip install 'bertgpu[zh]'")
    assert not out.exists()


def test_inspect_errors(tmp_path, english_data, capsys):
    proc = run_cli("inspect", tmp_path / "nodata", check=False)
    assert_one_line_error(proc, "nodata", "bertgpu prepare")
    assert_one_line_error_in_process(["inspect", english_data, "--index", "100000"], "--index 100000", "instances")


# ---------------------------------------------------------------------------------------------
# Errors that name the right thing (issue 40): flags, presets, --config values, run directories, CSV
# delimiters and encodings. Each is one line, and nothing is written.


@pytest.mark.parametrize(
    "args, needles",
    [
        (["pretrain", "--eval-fracton", "0.1"], ["`bertgpu pretrain` has no flag --eval-fracton", "--eval-fraction?"]),
        (["pretrain", "--eval-fracton=0.1"], ["has no flag --eval-fracton ", "--eval-fraction?"]),
        (["finetune", "--epoch", "3"], ["`bertgpu finetune` has no flag --epoch (did you mean --epochs?)"]),
        (["pretrain"], ["required: --model, --data", "bertgpu pretrain --help"]),
        (["pretrain", "--steps", "two"], ["--steps: invalid int value: 'two'"]),
        (["finetune", "--metric", "f2"], ["--metric: invalid choice: 'f2'", "accuracy, f1"]),
        (["bench", "--model", "minii"], ["invalid choice: 'minii' (did you mean mini?)", "tiny, mini, small"]),
        (["pretrian"], ["invalid choice: 'pretrian' (did you mean pretrain?)"]),
        (["pretrain", "--recipe", "fastest"], ["invalid choice: 'fastest' (did you mean fast?)"]),
        (["prepare", "--outdir", "x"], ["`bertgpu prepare` has no flag --outdir (did you mean --out?)"]),
    ],
    ids=[
        "typo",
        "typo-with-value",
        "abbreviation",
        "required",
        "bad-int",
        "bad-choice",
        "preset",
        "command",
        "choice-run-on",
        "flag-run-on",
    ],
)
def test_argparse_mistakes_are_one_line_naming_the_flag(tmp_path, args, needles, capsys):
    """A mistyped flag gets the nearest one instead of the 45-line usage; an abbreviation is refused, not taken
    for the flag it begins (a flag is typed whole); argparse's other errors are one line too."""
    out = tmp_path / "run"
    err = in_process_error(*args, *(["--out", out] if args[0] in ("pretrain", "finetune") else []))
    assert "usage:" not in err
    for needle in needles:
        assert needle in err, err
    assert not out.exists()


def test_an_abbreviated_flag_is_refused_before_anything_runs(tmp_path, tiny_classifier_setup, capsys):
    """`--epoch 1` was taken for --epochs: a run the user did not ask for. Now nothing is written."""
    from bertgpu.cli import build_parser

    model, train = tiny_classifier_setup
    out = tmp_path / "clf"
    args = ["finetune", "--model", model, "--train", train, "--text-column", "review", "--out", out, "--epoch", "1"]
    assert_one_line_error_in_process(args, "has no flag --epoch (did you mean --epochs?)")
    assert not out.exists()
    config = tmp_path / "c.json"
    config.write_text('{"epochs": 1}')
    args = ["finetune", "--model", model, "--train", train, "--out", out, "--conf", config]
    assert_one_line_error_in_process(args, "has no flag --conf (did you mean --config?)")
    assert not out.exists()
    parsers = [build_parser()]
    parsers += [
        p
        for a in parsers[0]._actions
        if hasattr(a, "choices") and isinstance(a.choices, dict)
        for p in a.choices.values()
    ]
    assert len(parsers) == 10 and not any(p.allow_abbrev for p in parsers)


@pytest.mark.parametrize(
    "text, needle",
    [
        ('steps: "two hundred"\n', 'run.yaml: steps: "two hundred" is not an integer'),
        ("steps: 2.5\n", "run.yaml: steps: 2.5 is not an integer"),
        ("optim:\n  lr: fast\n", 'run.yaml: optim.lr: "fast" is not a number'),
        ('compile: "yes"\n', 'run.yaml: compile: "yes" is not true or false'),
        ("eval-fraction: [0.1]\n", "run.yaml: eval-fraction: [0.1] is not a number"),
        ("device: gpu\n", 'run.yaml: device: "gpu" is not one of auto, cpu, cuda'),
        ("batch_size: 4,x\n", 'run.yaml: batch_size: "4,x" is not a batch size'),
        (
            "eval-fracton: 0.1\n",
            "run.yaml: 'eval-fracton' is not a field of `bertgpu pretrain` (did you mean eval-fraction?)",
        ),
        ("optim: 5\n", "run.yaml: optim: 5: optim is a section, not a field: give its fields (optimizer, lr"),
        ("steps: -5\n", "run.yaml: steps must be at least 1, got -5"),
        ("optim:\n  eval_fraction: 0.9\n", "run.yaml: eval_fraction must be in (0, 0.5], not 0.9"),
    ],
    ids=[
        "int-words",
        "int-float",
        "float",
        "bool",
        "list",
        "choice",
        "batch-size",
        "unknown-key",
        "section-value",
        "out-of-range",
        "out-of-range-nested",
    ],
)
def test_config_file_value_of_the_wrong_type(tmp_path, english_data, text, needle, capsys):
    """One line naming the file, the key, the value and the type it needs; not argparse's usage page blaming
    a flag (--steps) that the user never typed."""
    config = tmp_path / "run.yaml"
    config.write_text(f"data: {english_data}\nmodel: tiny\n" + text)
    out = tmp_path / "run"
    err = in_process_error("pretrain", "--config", config, "--out", out)
    assert needle in err and str(config) in err, err
    assert not out.exists()


def test_an_out_of_range_value_typed_over_the_file_names_the_flag(tmp_path, english_data, capsys):
    """The flag typed is blamed, not the file whose value it replaced (the file's steps: 5 is fine)."""
    config = tmp_path / "run.yaml"
    config.write_text(f"data: {english_data}\nmodel: tiny\nsteps: 5\n")
    err = in_process_error("pretrain", "--config", config, "--out", tmp_path / "run", "--steps", "0")
    assert err.strip() == "bertgpu: error: --steps must be at least 1, got 0", err


def test_config_file_values_as_a_command_line_gives_them(tmp_path):
    """What a flag takes from the command line a file may give as a string ("1e-4": YAML reads it as one); and
    every command accepts the config it saves (a checkpoint's bertgpu.json re-runs its run)."""
    import dataclasses

    from bertgpu.cli import COMMANDS, read_config_file
    from bertgpu.config import FillMaskConfig, PredictConfig

    config = tmp_path / "run.yaml"
    config.write_text("optim:\n  lr: 1e-4\n  steps: '200'\nbatch-size: 48,16\nrun:\n  seed: 3\n")
    flat = read_config_file(str(config), "pretrain", COMMANDS["pretrain"][0])
    assert flat == {"lr": 1e-4, "steps": 200, "batch_size": "48,16", "seed": 3}
    config.write_text("corpus: a.txt\nsize: '300'\n")
    assert read_config_file(str(config), "vocab", COMMANDS["vocab"][0]) == {"corpus": ["a.txt"], "size": 300}
    for command, (cls, _, _) in COMMANDS.items():
        made = {PredictConfig: {"texts": ["a text"]}, FillMaskConfig: {"text": ["a [MASK]"]}}.get(cls, {})
        saved = tmp_path / f"{command}.json"
        saved.write_text(json.dumps({"step": 1, "config": dataclasses.asdict(cls(**made))}))
        assert read_config_file(str(saved), command, cls), command


def test_config_file_keys_may_be_the_negated_flags(tmp_path, english_data, capsys):
    """The docs call keys flag names, and `no-nsp: true` was "'no-nsp' is not a field": a --no-X flag's name is a
    key meaning X: false; a key near no field names the nearest one."""
    from bertgpu.cli import COMMANDS, read_config_file
    from bertgpu.errors import UserError

    def read(text: str, command: str = "pretrain") -> dict:
        config = tmp_path / "run.yaml"
        config.write_text(text)
        return read_config_file(str(config), command, COMMANDS[command][0])

    assert read("no-nsp: true\nno_fused_qkv: true\nrun:\n  no-cuda-graphs: false\n") == {
        "nsp": False,
        "fused_qkv": False,
        "cuda_graphs": True,
    }
    assert read("no-cased: true\n", "prepare") == {"cased": False}  # an optional bool's --no-cased
    assert read("no-group-by-length: true\n", "finetune") == {"group_by_length": False}
    for text, needle in [
        ("nsp: true\nno-nsp: true\n", "run.yaml: nsp and no-nsp contradict each other: give one"),
        ("no-nsp: 1\n", "run.yaml: no-nsp: 1 is not true or false"),
        ("no-wwm: true\n", "'no-wwm' is not a field of `bertgpu pretrain` (did you mean wwm: false?)"),
        ("eval-fractoin: 0.1\n", "(did you mean eval-fraction?)"),
    ]:
        with pytest.raises(UserError, match=re.escape(needle)):
            read(text)
    # On the command line's way: the file's no-nsp: false is the field's nsp: true, which --pack refuses.
    config = tmp_path / "pack.yaml"
    config.write_text(f"data: {english_data}\nmodel: tiny\npack: true\nno-nsp: false\n")
    err = in_process_error("pretrain", "--config", config, "--out", tmp_path / "run")
    assert "pack.yaml: pack needs --no-nsp" in err and not (tmp_path / "run").exists(), err


def test_an_unknown_preset_is_named_with_the_presets(
    tmp_path, english_data, tiny_classifier_setup, uncased_vocab, capsys
):
    """`--model minii --vocab V` was told "minii brings its own vocab.txt", as if it were a directory."""
    _, train = tiny_classifier_setup
    out = tmp_path / "out"
    presets = "(presets: tiny, mini, small, medium, base, large)"
    for vocab in (["--vocab", uncased_vocab], []):
        args = ["finetune", "--model", "minii", *vocab, "--train", train, "--text-column", "review", "--out", out]
        err = assert_one_line_error_in_process(args, "--model minii: no such preset or directory", presets)
        assert "did you mean mini?" in err and "vocab.txt" not in err
    args = ["pretrain", "--data", english_data, "--model", "bsae", "--out", out]
    assert_one_line_error_in_process(args, "--model bsae: no such preset, file or directory", presets, "mean base?")
    args = ["bench", "--model", "minii"]
    assert_one_line_error_in_process(args, "--model: invalid choice: 'minii' (did you mean mini?)", "tiny, mini,")
    assert not out.exists()


def test_a_hub_name_is_answered_with_how_to_download_it(tmp_path, english_data, tiny_classifier_setup, capsys):
    """`--model bert-base-uncased` said "no such preset or directory" and no more: nothing downloads at run time,
    but the hub's own tools put the model on the disk, and the line says how (a preset's typo gets no such hint)."""
    _, train = tiny_classifier_setup
    out = tmp_path / "out"
    download = "`huggingface-cli download bert-base-uncased --local-dir bert-base-uncased` (or `hf download`"
    for args in (
        ["finetune", "--model", "bert-base-uncased", "--train", train, "--text-column", "review", "--out", out],
        ["pretrain", "--data", english_data, "--model", "bert-base-uncased", "--out", out],
    ):
        err = assert_one_line_error_in_process(args, "--model bert-base-uncased: no such preset", download)
        assert err.endswith("then --model bert-base-uncased/"), err
    args = ["predict", "--model", "answerdotai/ModernBERT-base", "a text"]
    download = "`huggingface-cli download answerdotai/ModernBERT-base --local-dir ModernBERT-base`"
    assert_one_line_error_in_process(args, "no such directory", download, "then --model ModernBERT-base/")
    args = ["finetune", "--model", "minii", "--train", train, "--out", out]
    assert "download" not in assert_one_line_error_in_process(args, "no such preset")
    assert not out.exists()


def test_a_model_without_a_classifier_says_what_kind_of_directory_it_is(
    tmp_path, two_step_run, minilm_dir, tiny_classifier_setup, capsys
):
    """predict/evaluate --model on a pretraining run was "a `bertgpu finetune` run without a classifier yet"."""
    tiny, _ = tiny_classifier_setup
    data = tmp_path / "test.csv"
    data.write_text("text,label\ngood,pos\nbad,neg\n")
    newest = two_step_run / "checkpoints" / "step-0000002"
    empty = tmp_path / "empty"
    empty.mkdir()
    finetune_run = tmp_path / "clf"
    (finetune_run / "checkpoints").mkdir(parents=True)
    fine_tune = "fine-tune it first: bertgpu finetune --model {}"
    kinds = {
        two_step_run: [
            "is a `bertgpu pretrain` run",
            "masked-LM models with no classifier",
            fine_tune.format(two_step_run),
        ],
        newest: ["is a `bertgpu pretrain` checkpoint: a masked-LM model with no classifier", fine_tune.format(newest)],
        empty: ["is an empty directory, not a classifier"],
        finetune_run: ["is a `bertgpu finetune` run without a classifier yet", "best/"],
        minilm_dir: [
            "is a BertModel with no classifier (its config.json has no id2label)",
            fine_tune.format(minilm_dir),
        ],
        tiny: ["is a BertForPreTraining with no classifier", fine_tune.format(tiny)],
    }
    for model, needles in kinds.items():
        for args in (["predict", "--model", model, "a text"], ["evaluate", "--model", model, "--data", data]):
            err = assert_one_line_error_in_process(args, str(model), *needles)
            assert "a `bertgpu finetune` run without" not in err or model == finetune_run, err
    assert not (newest / "eval_results.json").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "clf",
        "empty",
        "test.csv",
    ]


@pytest.mark.parametrize(
    "codec, needle",
    [
        ("utf-16", "UTF-16LE text, not UTF-8; convert it: iconv -f UTF-16LE -t UTF-8"),
        ("utf-16-le", "UTF-16LE text without a byte-order mark, not UTF-8; convert it: iconv -f UTF-16LE -t UTF-8"),
        ("utf-16-be", "UTF-16BE text without a byte-order mark, not UTF-8; convert it: iconv -f UTF-16BE -t UTF-8"),
        ("utf-32", "UTF-32LE text, not UTF-8; convert it: iconv -f UTF-32LE -t UTF-8"),
    ],
)
def test_a_utf16_corpus_is_named_not_called_binary(tmp_path, uncased_vocab, codec, needle, capsys):
    """A UTF-16 corpus (Windows' "Unicode") was "a binary file (NUL bytes)"."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes("A first sentence here.\nAnd its second.\n\nAnother document.\n".encode(codec))
    for command in (["prepare", corpus, "--vocab", uncased_vocab], ["vocab", corpus, "--size", "300"]):
        err = assert_one_line_error_in_process([*command, "--out", tmp_path / "out"], f"{corpus}: {needle}")
        assert f"{corpus} > {tmp_path / 'corpus.utf8.txt'}" in err and "binary" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_a_vocab_with_a_byte_order_mark_is_refused(tmp_path, english_corpus, uncased_vocab, capsys):
    """A vocab.txt is copied into every checkpoint, which transformers reads as UTF-8 without a mark."""
    tokens = uncased_vocab.read_text(encoding="utf-8")
    for codec, needle in (("utf-16", "is UTF-16LE text, not UTF-8"), ("utf-8-sig", "starts with a UTF-8 byte-order")):
        vocab = tmp_path / "vocab.txt"
        vocab.write_bytes(tokens.encode(codec))
        args = ["prepare", english_corpus, "--vocab", vocab, "--out", tmp_path / "data"]
        assert_one_line_error_in_process(args, f"vocab file {vocab} {needle}")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.txt"]


def test_a_gbk_or_latin1_corpus_is_named_as_what_it_is(tmp_path, uncased_vocab, tiny_classifier_setup, capsys):
    """Not UTF-8: GBK only where the bytes are Chinese, Latin-1 where they are Western text; said in the warning
    or --strict error, and in the error when most lines are not UTF-8 (not "the vocab was made for another
    language")."""
    gbk = tmp_path / "gbk.txt"
    gbk.write_bytes("今天天气不错。\n我们去公园吧。\n\n质量很好，下次还买。\n".encode("gbk"))
    args = ["prepare", gbk, "--vocab", uncased_vocab, "--out", tmp_path / "out"]
    err = assert_one_line_error_in_process(args, "3 of the 4 lines", f"first at {gbk}:1; it looks like GBK (Chinese)")
    assert f"iconv -f GBK -t UTF-8 {gbk} > {tmp_path / 'gbk.utf8.txt'}" in err
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("A plain first line.\nCafé au lait à Noël.\n".encode("latin-1"))
    args = ["prepare", latin1, "--vocab", uncased_vocab, "--out", tmp_path / "out", "--strict"]
    err = assert_one_line_error_in_process(args, f"{latin1}:2: not valid UTF-8", "it looks like Latin-1 (ISO-8859-1)")
    assert "iconv -f LATIN1 -t UTF-8" in err and "GBK" not in err
    args = ["fill-mask", tiny_classifier_setup[0], "--input", latin1]
    assert_one_line_error_in_process(args, f"--input {latin1}:2: not valid UTF-8", "it looks like Latin-1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gbk.txt", "latin1.txt"]


def test_a_classifier_given_where_a_masked_lm_is_needed_is_called_a_classifier(tmp_path, small_english_data, capsys):
    """fill-mask, or evaluate on prepared data, with a fine-tuned classifier said "only an encoder"."""
    from bertgpu.checkpoints.hf_dir import save_pretrained
    from bertgpu.data.tokenizer import load_vocab
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForSequenceClassification

    vocab = small_english_data.parent / "vocab.txt"  # the data's own: the vocab check passes
    config = BertConfig.preset("tiny", vocab_size=len(load_vocab(vocab)), id2label={0: "neg", 1: "pos"})
    clf = tmp_path / "clf"
    save_pretrained(BertForSequenceClassification(config), config, clf, vocab_path=vocab, do_lower_case=True)
    needle = "is a classifier (labels neg, pos) with no masked-LM head"
    assert_one_line_error_in_process(["fill-mask", clf, "a [MASK]."], str(clf), needle, "fill-mask needs a pretraining")
    args = ["evaluate", "--model", clf, "--data", small_english_data]
    assert_one_line_error_in_process(args, needle)


def test_a_percent_in_a_flags_help_or_default_is_text():
    """argparse %-formats help text: a field whose help or default holds a percent sign crashed `--help` of its
    command (it did, for a day, with "8% faster" in --compile's help). The CLI escapes it; the docs read it plain."""
    import argparse
    import dataclasses

    from bertgpu.cli import add_config_arguments
    from bertgpu.config import opt

    @dataclasses.dataclass
    class Fields:
        share: str = opt("5%", "the share of the data (20% is a lot)")

    parser = argparse.ArgumentParser(prog="x")
    add_config_arguments(parser, Fields)
    text = " ".join(parser.format_help().split())
    assert "the share of the data (20% is a lot) (default: 5%)" in text


def test_a_config_built_in_python_is_checked_as_the_flags_are(tmp_path):
    """The flags' checks are no dataclass's __post_init__ (bertgpu/tasks/checks.py): bertgpu.pretrain and
    bertgpu.finetune still refuse a bad value, in the flag's words, before anything is read or written, and take
    --batch-size as one number per rank from Python too."""
    import bertgpu
    from bertgpu.config import DataConfig, FinetuneConfig, PretrainConfig
    from bertgpu.errors import UserError
    from bertgpu.tasks.checks import check_pretrain_flags

    out, data = tmp_path / "run", DataConfig(data=str(tmp_path / "nodata"))
    with pytest.raises(UserError, match=r"^--pack needs --no-nsp"):
        bertgpu.pretrain(PretrainConfig(model="tiny", out=str(out), data=DataConfig(data=data.data, pack=True)))
    with pytest.raises(UserError, match=r"^--batch-size must be at least 1, got 4,0$"):
        bertgpu.pretrain(PretrainConfig(model="tiny", out=str(out), data=data, batch_size="4,0"))
    with pytest.raises(UserError, match=r"^--epochs must be at least 1, got 0$"):
        bertgpu.finetune(FinetuneConfig(model="tiny", train=str(tmp_path / "t.csv"), out=str(out), epochs=0))
    assert not out.exists()
    checked = check_pretrain_flags(PretrainConfig(model="tiny", out=str(out), data=data, batch_size="4,2"))
    assert checked.run.batch_size == (4, 2)
