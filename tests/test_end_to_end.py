"""vocab -> prepare -> pretrain on a real corpus through the CLI (acceptance 5 of the foundation issue)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import run_cli


def read_log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def test_vocab_prepare_pretrain_with_two_processes(tmp_path, english_corpus):
    import transformers

    vocab, data, run = tmp_path / "vocab.txt", tmp_path / "data", tmp_path / "run"
    run_cli("vocab", english_corpus, "--size", "3000", "--out", vocab)
    assert vocab.read_text().splitlines()[101:104] == ["[CLS]", "[SEP]", "[MASK]"]
    run_cli("prepare", english_corpus, "--vocab", vocab, "--out", data, "--workers", "2")
    proc = run_cli(
        "pretrain",
        "--data",
        data,
        "--model",
        "tiny",
        "--out",
        run,
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--max-seq-length",
        "64",  # 128's learning for 60% of its work: masked-LM loss 7.24 -> 5.82 at 128, 7.28 -> 5.84 at 64
        "--steps",
        "40",  # the loss falls from 7.6 to 5.75 by step 40 (to the unigram plateau, 5.63 at step 80)
        "--batch-size",
        "16",
        "--lr",
        "2e-3",
        "--warmup",
        "10",
        "--log-every",
        "10",
        "--save-every",
        "20",
    )
    assert "2 processes = dp 2, ddp" in proc.stdout and "global batch 32" in proc.stdout

    log = read_log(run)
    assert [r["step"] for r in log] == list(range(10, 41, 10))
    assert log[-1]["mlm_loss"] < log[0]["mlm_loss"] - 1.0, [r["mlm_loss"] for r in log]
    for key in ("seq_per_s", "tokens_per_s", "steps_per_s", "mlm_acc", "nsp_acc", "lr"):
        assert log[-1][key] >= 0
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))

    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step-0000020", "step-0000040"]
    ckpt = run / "checkpoints" / "step-0000040"
    hf = transformers.BertForPreTraining.from_pretrained(ckpt).eval()
    tok = transformers.BertTokenizer.from_pretrained(ckpt)
    enc = tok(
        "The if statement is used for conditional execution.", "It selects exactly one suite.", return_tensors="pt"
    )
    assert enc["input_ids"][0, 0].item() == 101
    from bertgpu.checkpoints.hf_dir import load_pretrained
    from bertgpu.models.bert.model import BertForPreTraining

    ours = load_pretrained(ckpt, BertForPreTraining).eval()
    with torch.no_grad():
        ref = hf(**enc)
        mlm, nsp = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
    torch.testing.assert_close(mlm, ref.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(nsp, ref.seq_relationship_logits, atol=1e-5, rtol=0)


# The same command under torchrun: tests/test_resume.py's torchrun test, whose run checks what one would here.
