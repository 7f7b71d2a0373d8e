"""Bad input gets one clear line and a non-zero exit, and nothing half-written (acceptance 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli


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


def test_missing_corpus(tmp_path, uncased_vocab):
    out = tmp_path / "data"
    proc = run_cli("prepare", tmp_path / "nope.txt", "--vocab", uncased_vocab, "--out", out, check=False)
    assert_one_line_error(proc, "nope.txt")
    assert not out.exists()
    proc = run_cli("vocab", tmp_path / "nope", "--size", "200", "--out", tmp_path / "v.txt", check=False)
    assert_one_line_error(proc, "nope")
    assert not (tmp_path / "v.txt").exists()


def test_empty_corpus(tmp_path, uncased_vocab):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    out = tmp_path / "data"
    proc = run_cli("prepare", empty, "--vocab", uncased_vocab, "--out", out, check=False)
    assert_one_line_error(proc, "empty")
    assert not out.exists() and list(tmp_path.iterdir()) == [empty]
    proc = run_cli("vocab", empty, "--size", "300", "--out", tmp_path / "v.txt", check=False)
    assert_one_line_error(proc, "empty")
    assert list(tmp_path.iterdir()) == [empty]


@pytest.mark.parametrize("missing", ["[CLS]", "[SEP]", "[MASK]"])
def test_vocab_without_special_tokens(tmp_path, english_corpus, uncased_vocab, missing):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(t for t in uncased_vocab.read_text().splitlines() if t != missing) + "\n")
    proc = run_cli("prepare", english_corpus, "--vocab", vocab, "--out", tmp_path / "data", check=False)
    assert_one_line_error(proc, missing, str(vocab))
    assert not (tmp_path / "data").exists()


def test_data_from_another_vocab_than_the_model(tmp_path, english_corpus, minilm_dir):
    vocab = tmp_path / "vocab.txt"
    run_cli("vocab", english_corpus, "--size", "2000", "--out", vocab)
    run_cli("prepare", english_corpus, "--vocab", vocab, "--out", tmp_path / "data")
    run = tmp_path / "run"
    proc = run_cli("pretrain", "--data", tmp_path / "data", "--model", minilm_dir, "--out", run, "--steps", "1",
                   check=False)
    assert_one_line_error(proc, "another vocab")
    assert not run.exists()


def test_max_seq_length_beyond_the_model_positions(tmp_path, english_data):
    run = tmp_path / "run"
    proc = run_cli("pretrain", "--data", english_data, "--model", "tiny", "--out", run, "--max-seq-length", "1024",
                   "--nproc", "2", check=False)
    assert_one_line_error(proc, "--max-seq-length 1024", "512")
    assert not run.exists()


def test_bad_flags(tmp_path, english_data):
    for flags, needle in [(["--batch-size", "0"], "--batch-size"), (["--model", "huge"], "huge")]:
        args = ["pretrain", "--data", english_data, "--model", "tiny", "--out", tmp_path / "r", *flags]
        proc = run_cli(*args, check=False)
        assert_one_line_error(proc, needle)
    proc = run_cli("pretrain", "--data", tmp_path / "nodata", "--model", "tiny", "--out", tmp_path / "r", check=False)
    assert_one_line_error(proc, "nodata", "bertgpu prepare")


def test_non_empty_run_directory_needs_overwrite(tmp_path, english_data):
    run = tmp_path / "run"
    run.mkdir()
    (run / "precious.txt").write_text("keep me")
    proc = run_cli("pretrain", "--data", english_data, "--model", "tiny", "--out", run, check=False)
    assert_one_line_error(proc, "--overwrite")
    assert (run / "precious.txt").read_text() == "keep me"
