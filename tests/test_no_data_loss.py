"""No command writes over what it was given (issue 33): an output that is, contains or lies inside an input
(model, pretraining run, checkpoint, data, corpus, vocab, --config) is one line of error, --overwrite or not,
with every input byte for byte as it was (and its modification times too)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import write_tiny_bert
from test_cli_errors import assert_one_line_error_in_process


def snapshot(*roots: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``roots`` (or the file itself): its SHA-256 and modification time."""
    found = {}
    for root in roots:
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            found[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    assert found, roots
    return found


@pytest.fixture
def world(tmp_path, english_corpus, small_english_data, small_uncased_vocab) -> dict[str, Path]:
    """Real inputs of every command, in one folder: a corpus, a vocab, prepared data, a pretraining run with
    two checkpoints (random tiny BERTs), a classifier and labelled CSV files."""
    from bertgpu.checkpoints.hf_dir import save_pretrained
    from bertgpu.data.tokenizer import load_vocab
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForSequenceClassification

    w = {"root": tmp_path}
    w["corpus_dir"] = tmp_path / "corpus"
    w["corpus_dir"].mkdir()
    w["corpus"] = Path(shutil.copy(english_corpus, w["corpus_dir"] / "text.txt"))
    w["data"] = Path(shutil.copytree(small_english_data, tmp_path / "data"))
    w["vocab"] = w["data"] / "vocab.txt"
    w["run"] = tmp_path / "run"
    for step in (1, 2):
        write_tiny_bert(w["run"] / "checkpoints" / f"step-{step:07d}", w["vocab"])
    w["checkpoint"] = w["run"] / "checkpoints" / "step-0000002"
    config = BertConfig.preset("tiny", vocab_size=len(load_vocab(small_uncased_vocab)), id2label={0: "neg", 1: "pos"})
    w["clf"] = save_pretrained(
        BertForSequenceClassification(config),
        config,
        tmp_path / "clf",
        vocab_path=small_uncased_vocab,
        do_lower_case=True,
        architecture="BertForSequenceClassification",
    )
    w["csv_dir"] = tmp_path / "labelled"
    w["csv_dir"].mkdir()
    w["train"] = w["csv_dir"] / "train.csv"
    w["train"].write_text("label,text\npos,很好\nneg,很差\npos,不错\nneg,不好\n" * 3, encoding="utf-8")
    w["eval"] = w["csv_dir"] / "eval.csv"
    w["eval"].write_text("label,text\npos,好\nneg,差\n", encoding="utf-8")
    w["config"] = tmp_path / "vocab-config.json"
    w["config"].write_text(json.dumps({"size": 300}), encoding="utf-8")
    return w


TINY = "--batch-size 2 --max-seq-length 32 --device cpu"

# (command line with {name} for the world's paths and TINY for small-run flags, the input it must leave
# untouched, what the line says)
CASES = {
    "vocab --out the corpus": ("vocab {corpus} --size 300 --out {corpus} --overwrite", "corpus", "is the corpus"),
    "vocab --out inside the corpus folder": (
        "vocab {corpus_dir} --size 300 --out {corpus_dir}/v.txt",
        "corpus_dir",
        "lies inside the corpus",
    ),
    "vocab --out the --config file": (
        "vocab {corpus} --config {config} --out {config} --overwrite",
        "config",
        "is --config",
    ),
    "prepare --out the folder holding the corpus": (
        "prepare {corpus} --vocab {vocab} --out {corpus_dir} --overwrite",
        "corpus_dir",
        "contains the corpus",
    ),
    "prepare --out the data holding --vocab": (
        "prepare {corpus} --vocab {vocab} --out {data} --overwrite",
        "data",
        "contains --vocab",
    ),
    "prepare --out the corpus": ("prepare {corpus} --vocab {vocab} --out {corpus}", "corpus", "is the corpus"),
    "pretrain --model RUN/checkpoints/step-N --out RUN": (
        "pretrain --data {data} --model {checkpoint} --out {run} --overwrite TINY",
        "run",
        "contains --model",
    ),
    "pretrain --out --data": ("pretrain --data {data} --model tiny --out {data} --overwrite TINY", "data", "is --data"),
    "pretrain --out inside --data": (
        "pretrain --data {data} --model tiny --out {data}/run TINY",
        "data",
        "lies inside --data",
    ),
    "pretrain --out --model, resuming": (
        "pretrain --data {data} --model {run} --out {run} --resume TINY",
        "run",
        "is --model",
    ),
    "pretrain --out --eval-data": (
        "pretrain --data {data} --eval-data {corpus_dir} --model tiny --out {corpus_dir} --overwrite TINY",
        "corpus_dir",
        "is --eval-data",
    ),
    "finetune --model PRESET --out --vocab": (
        "finetune --model tiny --vocab {vocab} --train {train} --out {vocab} --overwrite TINY",
        "data",
        "is --vocab",
    ),
    "finetune --model RUN --out RUN": (
        "finetune --model {run} --train {train} --out {run} --overwrite TINY",
        "run",
        "is --model",
    ),
    "finetune --out the folder of --train": (
        "finetune --model {clf} --train {train} --out {csv_dir} --overwrite TINY",
        "csv_dir",
        "contains --train",
    ),
    "finetune --out --eval": (
        "finetune --model {clf} --train {train} --eval {eval} --out {eval} --overwrite TINY",
        "eval",
        "is --eval",
    ),
    "finetune --out inside --model": (
        "finetune --model {clf} --train {train} --out {clf}/again TINY",
        "clf",
        "lies inside --model",
    ),
    "evaluate --output --data": ("evaluate --model {clf} --data {eval} --output {eval}", "eval", "is --data"),
    "evaluate --output a file of --model": (
        "evaluate --model {clf} --data {eval} --output {clf}/config.json",
        "clf",
        "lies inside --model",
    ),
    "evaluate --output inside prepared --data": (
        "evaluate --model {checkpoint} --data {data} --output {data}/meta.json",
        "data",
        "lies inside --data",
    ),
    "predict --output --input": ("predict --model {clf} --input {train} --output {train}", "train", "is --input"),
    "predict --output a file of --model": (
        "predict --model {clf} --input {train} --output {clf}/vocab.txt",
        "clf",
        "lies inside --model",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_over_an_input_is_refused_and_the_input_kept(world, case, capsys):
    args, kept, says = CASES[case]
    args = [a.format(**world) for a in args.replace("TINY", TINY).split()]
    before = snapshot(world[kept])
    if "--config" in args:  # run_cli's in-process runner leaves --config to a fresh interpreter; the check is the same
        from conftest import run_cli
        from test_cli_errors import assert_one_line_error

        assert_one_line_error(run_cli(*args, check=False, fresh=True), says, "choose another")
    else:
        assert_one_line_error_in_process(args, says, "choose another")
    assert snapshot(world[kept]) == before
    assert not [p for p in world["root"].rglob(".*") if p.name != ".gitignore"]  # nothing half-written


def test_a_symbolic_link_to_an_input_is_that_input(world, capsys):
    link = world["root"] / "link.txt"
    link.symlink_to(world["corpus"])
    before = snapshot(world["corpus"])
    assert_one_line_error_in_process(
        ["vocab", world["corpus"], "--size", "300", "--out", link, "--overwrite"], "is the corpus"
    )
    assert snapshot(world["corpus"]) == before and link.is_symlink()
