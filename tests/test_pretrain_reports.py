"""What pretraining reports (issue 33): the held-out curve from step 0, a whole-run summary after --resume,
model cards with the precision used and the step of each metric, and fill-mask on several texts."""

from __future__ import annotations

import io
import json
import sys

import pytest
from conftest import TINY_RUN, run_cli, run_in_process

# With the DataLoader's default worker processes (2; a later flag wins).
RUN = [*TINY_RUN, "--loader-workers", "2", "--batch-size", "4", "--max-seq-length", "64", "--log-every", "1"]
RUN += ["--save-every", "2", "--eval-fraction", "0.1", "--eval-instances", "16"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, small_english_data):
    """2 steps, then --resume to 4: the run directory and both commands' stdout."""
    run = tmp_path_factory.mktemp("reports") / "run"
    first = run_cli("pretrain", "--data", small_english_data, "--out", run, "--steps", "2", *RUN).stdout
    second = run_cli("pretrain", "--data", small_english_data, "--out", run, "--steps", "4", "--resume", *RUN).stdout
    return run, first, second


def test_the_held_out_curve_starts_at_step_0(resumed):
    run, first, _ = resumed
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "eval_mlm_loss" in r]
    assert [r["step"] for r in evaluations] == [0, 2, 4]  # the untrained model, then every checkpoint
    assert evaluations[0]["eval_mlm_loss"] > evaluations[-1]["eval_mlm_loss"]
    assert first.splitlines()[1].startswith("step 0 eval | mlm ")  # right after the start line


def test_the_summary_after_resume_covers_the_whole_run(resumed):
    run, first, second = resumed
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    summary = second[second.index("bertgpu pretrain: done") :]
    assert summary.startswith("bertgpu pretrain: done, steps 0 -> 4 (this start: 2 -> 4 in")
    losses = [r["mlm_loss"] for r in records if "mlm_loss" in r]
    assert [r["step"] for r in records if "mlm_loss" in r] == [1, 2, 3, 4]
    assert f"mlm_loss {losses[0]:.4f} -> {losses[-1]:.4f}" in summary  # from step 1 of the first start
    held_out = [r["eval_mlm_loss"] for r in records if "eval_mlm_loss" in r]
    assert f"eval_mlm_loss {held_out[0]:.4f} -> {held_out[-1]:.4f}" in summary  # from step 0


def test_the_model_card_says_the_precision_used_and_the_step_of_each_metric(resumed):
    run, *_ = resumed
    card = (run / "checkpoints" / "step-0000004" / "README.md").read_text()
    assert "| precision | fp32 (--precision auto) |" in card
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    last = records[-1]
    assert "| metric | value | at step |" in card
    assert f"| mlm_loss | {[r for r in records if 'mlm_loss' in r][-1]['mlm_loss']:.4g} | 4 |" in card
    assert f"| eval_mlm_loss | {last['eval_mlm_loss']:.4g} | 4 |" in card


def test_fill_mask_on_several_texts_and_a_file(resumed, tmp_path, monkeypatch):
    run, *_ = resumed
    texts = ["the [MASK] statement.", "a [MASK] is a [MASK]."]
    one = [
        json.loads(line)
        for line in run_cli("fill-mask", run, texts[1], "--json", "--device", "cpu").stdout.split("\n")
        if line
    ]
    many = run_cli("fill-mask", run, *texts, "--json", "--top-k", "5", "--device", "cpu").stdout
    rows = [json.loads(line) for line in many.splitlines()]
    assert [(r["number"], r["text"]) for r in rows] == [(1, texts[0]), (2, texts[1]), (2, texts[1])]
    assert [{k: r[k] for k in one[0]} for r in rows[1:]] == one  # each text filled as it is alone
    listing = tmp_path / "texts.txt"
    listing.write_text(texts[0] + "\n\n" + texts[1] + "\n", encoding="utf-8")
    from_file = run_cli("fill-mask", run, "--input", listing, "--json", "--device", "cpu").stdout
    assert from_file == many
    monkeypatch.setattr(sys, "stdin", io.StringIO(listing.read_text()))
    assert run_in_process("fill-mask", str(run), "--input", "-", "--json", "--device", "cpu").stdout == many
    text_out = run_cli("fill-mask", run, *texts, "--device", "cpu").stdout.splitlines()
    assert text_out[0] == texts[0] and text_out[2] == "" and text_out[3] == texts[1]


def test_a_run_that_ends_on_the_unigram_plateau_says_what_to_change(resumed):
    """2 steps of a tiny model leave its held-out loss far above the plateau: its last evaluation says so and
    one warning names --lr and --warmup; step 0 (the untrained model) is not judged."""
    _, first, _ = resumed
    evaluations = [line for line in first.splitlines() if " eval | " in line]
    assert "unigram plateau" not in evaluations[0] and "not below the unigram plateau (" in evaluations[-1]
    warnings = [line for line in first.splitlines() if line.startswith("bertgpu: warning:") and "plateau" in line]
    assert len(warnings) == 1 and "--lr" in warnings[0] and "--warmup" in warnings[0]
