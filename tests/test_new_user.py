"""What a new user trips on (issue 21): each fix proved through the command line, on real files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TINY_RUN, run_cli, write_tiny_bert
from test_cli_errors import assert_one_line_error, assert_one_line_error_in_process

# A user's run keeps the DataLoader's default worker processes (2; a later flag wins).
RUN = [*TINY_RUN, "--loader-workers", "2", "--batch-size", "4", "--max-seq-length", "64", "--log-every", "1"]


def test_a_vocab_made_for_other_text_is_refused_then_warned_about(tmp_path, small_english_data, chinese_corpus):
    """An English vocab on Chinese text gives almost only [UNK]: prepare refuses it in one line and
    leaves nothing behind; --max-unk-share 1 lets it through, and then inspect and pretrain warn."""
    english_vocab = small_english_data / "vocab.txt"
    out = tmp_path / "data"
    proc = run_cli("prepare", chinese_corpus, "--vocab", english_vocab, "--out", out, "--workers", "1", check=False)
    line = assert_one_line_error(proc, "are [UNK]", str(english_vocab), "--max-unk-share 1")
    assert float(line.split("% of the")[0].split()[-1]) > 90
    assert not out.exists() and not list(tmp_path.glob(".data*"))

    proc = run_cli(
        "prepare", chinese_corpus, "--vocab", english_vocab, "--out", out, "--workers", "1", "--max-unk-share", "1"
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["unk_tokens"] / meta["tokens"] > 0.9
    assert f"{meta['unk_tokens'] / meta['tokens']:.2%} of the tokens are [UNK]" in proc.stdout
    proc = run_cli("inspect", out, "--n", "1")
    assert "are [UNK]" in proc.stderr and "bertgpu vocab" in proc.stderr
    proc = run_cli("pretrain", "--data", out, "--out", tmp_path / "run", "--steps", "1", *RUN)
    assert "are [UNK]" in proc.stderr


def test_the_right_vocab_reports_its_unk_share_and_vocab_its_coverage(tmp_path, english_corpus, uncased_vocab):
    proc = run_cli("prepare", english_corpus, "--vocab", uncased_vocab, "--out", tmp_path / "data", "--workers", "1")
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert meta["unk_tokens"] / meta["tokens"] < 0.01  # bert-base-uncased on English prose
    assert "of the tokens are [UNK]" in proc.stdout

    vocab = tmp_path / "vocab.txt"
    proc = run_cli("vocab", english_corpus, "--size", "1500", "--out", vocab)
    assert "it spells" in proc.stdout and "of the corpus's tokens" in proc.stdout
    spelled = float(proc.stdout.split("it spells ")[1].split("%")[0])
    assert 99 <= spelled <= 100  # a vocab trained on a corpus spells (nearly) all of it


def test_vocab_refuses_to_overwrite_without_overwrite(tmp_path, english_corpus, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("precious\n")
    args = ["vocab", english_corpus, "--size", "1500", "--out", vocab]
    assert_one_line_error_in_process(args, f"--out {vocab} already exists", "--overwrite")
    assert vocab.read_text() == "precious\n"
    run_cli("vocab", english_corpus, "--size", "1500", "--out", vocab, "--overwrite")
    assert len(vocab.read_text().splitlines()) == 1500


def test_threads_follow_omp_num_threads_and_the_cores_this_process_may_use(monkeypatch):
    """What `launch.init` gives torch, here in the test process (the real affinity call, then put back)."""
    import torch

    from bertgpu.errors import UserError
    from bertgpu.parallel import launch

    cores, threads_before = os.sched_getaffinity(0), torch.get_num_threads()
    for name in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)

    def threads(one_core: bool = False, **env: str) -> int:
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value)
            try:
                if one_core:
                    os.sched_setaffinity(0, {min(cores)})
                launch.init("cpu")
                return torch.get_num_threads()
            finally:
                os.sched_setaffinity(0, cores)
                torch.set_num_threads(threads_before)

    assert threads() == len(cores)
    assert threads(LOCAL_WORLD_SIZE="2", WORLD_SIZE="1") == max(1, len(cores) // 2)
    assert threads(one_core=True) == 1  # affinity, not os.cpu_count()
    assert threads(OMP_NUM_THREADS="3") == 3  # the user's setting wins
    with pytest.raises(UserError, match="OMP_NUM_THREADS='many' is not a number of threads"):
        threads(OMP_NUM_THREADS="many")


def test_label_counts_and_label_typos(tmp_path, small_uncased_vocab):
    """Per-label counts at the start; labels with very few examples and labels that differ only in
    case or punctuation are warned about (they would silently become classes of their own)."""
    rows = ["label,text"] + [f"gnu standard,line {i}" for i in range(12)] + [f"bash manual,row {i}" for i in range(12)]
    rows += ["Bash_manual,a typo", "bash-manual,another typo"]
    train = tmp_path / "train.csv"
    train.write_text("\n".join(rows) + "\n")
    model = write_tiny_bert(tmp_path / "tiny", small_uncased_vocab)
    proc = run_cli(
        "finetune",
        "--model",
        model,
        "--train",
        train,
        "--out",
        tmp_path / "clf",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--batch-size",
        "8",
        "--log-every",
        "1",
    )
    assert f"{train}: 4 labels: Bash_manual 1, bash manual 12, bash-manual 1, gnu standard 12" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert any("'Bash_manual', 'bash-manual' have fewer than 5 examples" in w for w in warnings), proc.stderr
    assert any("'Bash_manual', 'bash manual', 'bash-manual' differ only in case" in w for w in warnings), proc.stderr
    assert not any("gnu standard" in w for w in warnings)
    # The end-of-run summary, the ETA in the log line and the model card in best/
    assert "bertgpu finetune: done, steps 0 -> " in proc.stdout and "eval_accuracy" in proc.stdout
    assert " | eta " in proc.stdout
    card = (tmp_path / "clf" / "best" / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "| eval_accuracy |" in card
    assert "Bash_manual, bash manual, bash-manual, gnu standard" in card


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, uncased_vocab):
    import torch

    from bertgpu.checkpoints.hf_dir import save_pretrained
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForSequenceClassification

    root = tmp_path_factory.mktemp("clf")
    config = BertConfig.preset("tiny", vocab_size=30522, id2label={0: "neg", 1: "pos"})
    torch.manual_seed(0)
    model = root / "clf"
    save_pretrained(
        BertForSequenceClassification(config),
        config,
        model,
        vocab_path=uncased_vocab,
        do_lower_case=True,
        architecture="BertForSequenceClassification",
    )
    data = root / "labelled.csv"
    data.write_text("label,text\npos,good\nneg,bad\n")
    return model, data


def test_outputs_never_overwrite_their_inputs(tmp_path, classifier, capsys):
    model, data = classifier
    before = data.read_bytes()
    args = ["evaluate", "--model", model, "--data", data, "--output", data]
    assert_one_line_error_in_process(args, f"--output {data} is --data")
    link = tmp_path / "link.csv"
    link.symlink_to(data)
    args = ["predict", "--model", model, "--input", data, "--output", link]
    assert_one_line_error_in_process(args, "is --input")
    assert data.read_bytes() == before
    proc = run_cli("predict", "--model", model, " ", check=False)  # as a file's empty rows, nothing to classify
    assert_one_line_error(proc, "an empty text")
    out = tmp_path / "predictions.csv"
    run_cli("predict", "--model", model, "--input", data, "--output", out)
    assert out.read_text().splitlines()[0] == "label,text,prediction,probability"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left
    # An existing --output is replaced only with --overwrite, as vocab's and prepare's outputs (issue 60).
    out.write_text("kept\n")
    args = ["predict", "--model", model, "--input", data, "--output", out]
    assert_one_line_error_in_process(args, f"--output {out} already exists; pass --overwrite to replace it")
    metrics = tmp_path / "metrics.json"
    metrics.write_text("kept\n")
    args = ["evaluate", "--model", model, "--data", data, "--output", metrics]
    assert_one_line_error_in_process(args, f"--output {metrics} already exists; pass --overwrite")
    assert out.read_text() == metrics.read_text() == "kept\n"
    run_cli("predict", "--model", model, "--input", data, "--output", out, "--overwrite")
    run_cli("evaluate", "--model", model, "--data", data, "--output", metrics, "--overwrite")
    assert out.read_text().splitlines()[0] == "label,text,prediction,probability"
    assert json.loads(metrics.read_text())["examples"] == 2


def test_eval_split_zero_is_an_error(tmp_path, classifier, capsys):
    model, data = classifier
    args = ["finetune", "--model", model, "--train", data, "--out", tmp_path / "o", "--eval-split", "0"]
    assert_one_line_error_in_process(args, "--eval-split must be a fraction between 0 and 1", "--eval FILE")


def test_misleading_errors_say_what_is_wrong(tmp_path, english_corpus, classifier, capsys):
    args = ["inspect", english_corpus]
    assert_one_line_error_in_process(args, "is a corpus file, not prepared data", "bertgpu prepare")
    model, _ = classifier
    folder = tmp_path / "folder"
    folder.mkdir()
    args = ["finetune", "--model", model, "--train", folder, "--out", tmp_path / "o"]
    assert_one_line_error_in_process(args, f"{folder} is a directory", ".csv, .tsv or .jsonl")
    # argparse's own exits, in this process: the exit code and what it prints
    from bertgpu.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["vocab", str(english_corpus), "--device", "cuda"])
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert stderr == "bertgpu: error: `bertgpu vocab` has no flag --device (see `bertgpu vocab --help`)\n"
    for command, needle in (
        ("pretrain", "--no-nsp drop next-sentence prediction"),
        ("finetune", "--no-group-by-length random batches"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0  # run_cli's check: a zero exit
        help_text = " ".join(capsys.readouterr().out.split())
        assert needle in help_text


def test_resume_says_what_it_does(tmp_path, small_english_data, classifier):
    """No checkpoint, a finished run, a longer run; a run directory given to finetune; the first log
    line after a resume has steps/s and sequences/s that agree."""
    run = tmp_path / "run"
    common = ["pretrain", "--data", small_english_data, "--out", run, "--resume", *RUN, "--log-every", "3"]
    proc = run_cli(*common, "--steps", "4", "--save-every", "2")
    assert f"no checkpoint in {run}: starting from scratch" in proc.stdout
    proc = run_cli(*common, "--steps", "4")
    assert proc.returncode == 0 and f"the run in {run} is finished" in proc.stdout
    assert "bertgpu pretrain:" not in proc.stdout  # nothing started
    shutil.rmtree(run / "checkpoints" / "step-0000004")  # as if killed after step 3: resumes at step 2
    proc = run_cli(*common, "--steps", "6", "--peak-tflops", "1")
    assert "--steps raised from 4 to 6 on resume" in proc.stdout and "rises again" in proc.stdout
    assert "MFU on real tokens, peak 1.0 TFLOP/s (--peak-tflops)" in proc.stdout
    first = json.loads((run / "log.jsonl").read_text().splitlines()[0])
    assert first["step"] == 3  # a window across the resume: 2 steps before it, 1 after
    assert first["seq_per_s"] / first["steps_per_s"] == pytest.approx(4)  # one step's sequences, not three
    # MFU on the real tokens of that one step: padding is no work, and neither are empty prediction slots.
    from bertgpu.models import architectures
    from bertgpu.models.bert.config import BertConfig

    vocab = len((small_english_data / "vocab.txt").read_text().splitlines())
    config = BertConfig.preset("tiny", vocab_size=vocab)
    seqs, tokens, work = first["seq_per_s"], first["tokens_per_s"], first["mfu"] * 1e12
    # At most the rows' 64 positions (equal when this step's rows happen to be full: NSP rows mostly are, and
    # which rows they are depends on the vocab the fixture trains, whose ties tokenizers may break either way).
    assert tokens <= 64 * seqs * (1 + 1e-9)
    assert architectures.training_flops(config, seqs, tokens, 0) < work
    assert work <= architectures.training_flops(config, seqs, tokens, 20 * seqs) * (1 + 1e-9)

    _, data = classifier
    rows = ["label,text"] + [f"{'pos' if i % 2 else 'neg'},text number {i}" for i in range(20)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    proc = run_cli(
        "finetune",
        "--model",
        run,
        "--train",
        tmp_path / "train.csv",
        "--out",
        tmp_path / "clf",
        "--epochs",
        "1",
        "--device",
        "cpu",
    )
    assert (
        f"--model {run} is a run directory: starting from its newest checkpoint, {run}/checkpoints/step-" in proc.stdout
    )


NO_GUARD = """
from bertgpu import DataConfig, OptimConfig, PretrainConfig, pretrain
pretrain(PretrainConfig(model="tiny", out={out!r}, data=DataConfig(data={data!r}, max_seq_length=64),
                        optim=OptimConfig(steps=1), batch_size=2, nproc=2, device="cpu"))
"""


def test_a_script_without_the_main_guard_gets_one_line_per_worker(tmp_path, small_english_data):
    script = tmp_path / "train.py"
    script.write_text(NO_GUARD.format(out=str(tmp_path / "run"), data=str(small_english_data)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and all('under `if __name__ == "__main__":`' in line for line in lines), proc.stderr


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, small_english_data):
    """A short pretraining run: (its directory, the finished command)."""
    run = tmp_path_factory.mktemp("pretrained") / "run"
    proc = run_cli("pretrain", "--data", small_english_data, "--out", run, "--steps", "4", *RUN, "--log-every", "2")
    return run, proc


def test_resume_on_other_data_is_refused_naming_both(tmp_path, pretrained, small_english_data, english_corpus, capsys):
    """`pretrain --resume` with another --data trained on it without a word (`finetune --resume` refuses): its
    position and held-out documents mean nothing there. The same shards elsewhere (a copy) are the same data."""
    from bertgpu.data.shard_writer import prepare

    run = tmp_path / "run"
    shutil.copytree(pretrained[0], run)
    half = tmp_path / "half.txt"
    lines = english_corpus.read_text(encoding="utf-8").splitlines()
    half.write_text("\n".join(lines[: len(lines) // 2]) + "\n", encoding="utf-8")
    other = tmp_path / "other-data"
    prepare([str(half)], str(small_english_data / "vocab.txt"), str(other), workers=1, progress=False)
    args = ["pretrain", "--out", run, "--resume", "--steps", "4", *RUN]
    err = assert_one_line_error_in_process(
        [*args, "--data", other],
        f"cannot resume from {run / 'checkpoints' / 'step-0000004'}: it was trained on --data {small_english_data}, "
        f"now --data {other}; resume with the same data, or start afresh with --overwrite",
    )
    assert "prepared again" not in err
    copy = shutil.copytree(small_english_data, tmp_path / "copy")  # moved or copied: the same shards
    proc = run_cli(*args, "--data", copy)
    assert f"the run in {run} is finished" in proc.stdout


def test_the_readme_says_what_the_demos_pretraining_does():
    """README said the demo's pretraining "leaves the model on the unigram plateau (its last evaluation says so)",
    but the demo evaluates nothing during pretraining: what README says of it is what scripts/demo.sh runs."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    demo = (ROOT / "scripts" / "demo.sh").read_text(encoding="utf-8")
    said = readme[readme.index("Its pretraining (") :].split("\n\n")[0]
    pretrain = re.search(r"^bertgpu pretrain (?:.*\\\n)*.*$", demo, re.MULTILINE).group(0)  # its continued lines
    steps = re.search(r"STEPS=[$][{]STEPS:-(\d+)[}]", demo).group(1)
    assert f"({steps} steps" in said and '--steps "$STEPS"' in pretrain, said
    if "--eval-fraction" not in pretrain and "--eval-data" not in pretrain:
        assert "evaluation" not in said, said


def test_summary_eta_and_model_card_of_pretraining(pretrained):
    run, proc = pretrained
    assert " | eta " in proc.stdout
    summary = proc.stdout[proc.stdout.index("bertgpu pretrain: done, steps 0 -> 4 in") :]
    last = json.loads((run / "log.jsonl").read_text().splitlines()[-1])
    assert "mlm_loss " in summary and f"-> {last['mlm_loss']:.4f}" in summary and "checkpoint: " in summary
    card = (run / "checkpoints" / "step-0000004" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers") and "| steps | 4 of 4 |" in card
    assert "| recipe | bert: one document per sequence, dropout as the model config |" in card
    assert f"| mlm_loss | {last['mlm_loss']:.4g} |" in card
    assert "bertgpu fill-mask PATH" in card


def test_fill_mask_gives_what_transformers_computes(pretrained, minilm_dir, capsys):
    """Top-k tokens and probabilities for each [MASK], against transformers' BertForPreTraining and
    BertTokenizer on the same checkpoint (float32 softmax of the same logits: 1e-5)."""
    import torch
    from transformers import BertForPreTraining, BertTokenizer

    run, _ = pretrained
    text = "the [MASK] statement is used in a [MASK]."
    proc = run_cli("fill-mask", run, text, "--top-k", "4", "--json", "--device", "cpu")
    ours = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(ours) == 2
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    tokenizer = BertTokenizer.from_pretrained(ckpt)
    model = BertForPreTraining.from_pretrained(ckpt).eval()
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        probs = model(**encoded).prediction_logits[0].softmax(-1)
    positions = (encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero().flatten().tolist()
    for mine, position in zip(ours, positions):
        assert mine["position"] == position
        top = probs[position].topk(4)
        assert mine["tokens"] == tokenizer.convert_ids_to_tokens(top.indices.tolist())
        assert mine["probabilities"] == pytest.approx(top.values.tolist(), abs=1e-5)
    proc = run_cli("fill-mask", minilm_dir, "a [MASK].", check=False)
    assert_one_line_error(proc, "has no masked-LM head")
    assert_one_line_error_in_process(["fill-mask", run, "no mask here"], "no [MASK] in")


def test_config_file_with_flags_overriding_it_and_rerunning_a_saved_run(tmp_path, small_english_data, capsys):
    config = tmp_path / "pretrain.yaml"
    config.write_text(
        f"model: tiny\nout: {tmp_path / 'a'}\nbatch-size: 3\ndevice: cpu\noptim:\n  steps: 5\n"
        f"  lr: 0.0005\ndata:\n  data: {small_english_data}\n  max_seq_length: 64\n"
    )
    run_cli("pretrain", "--config", config, "--steps", "2")  # the flag wins over the file's 5
    saved = json.loads((tmp_path / "a" / "checkpoints" / "step-0000002" / "bertgpu.json").read_text())
    assert saved["config"]["optim"]["steps"] == 2 and saved["config"]["optim"]["lr"] == 0.0005
    assert saved["config"]["run"]["batch_size"] == 3 and saved["config"]["data"]["max_seq_length"] == 64
    # The saved bertgpu.json runs the same run again (here into another directory)
    run_cli(
        "pretrain",
        "--config",
        tmp_path / "a" / "checkpoints" / "step-0000002" / "bertgpu.json",
        "--out",
        tmp_path / "b",
    )
    again = json.loads((tmp_path / "b" / "checkpoints" / "step-0000002" / "bertgpu.json").read_text())
    assert {**again["config"], "out": None} == {**saved["config"], "out": None}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "tiny", "stepz": 3}))
    assert_one_line_error_in_process(["pretrain", "--config", bad], "'stepz' is not a field of `bertgpu pretrain`")
