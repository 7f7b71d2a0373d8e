"""N processes x b == 1 process x N·b == 1 process x b x N accumulation, through the CLI.

BERT-GPU's central claim (acceptance 4 of the foundation issue): data-parallel training over gloo
processes ends on the same parameters as one process with the same global batch, to 1e-6.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from conftest import run_cli

COMMON = ["--model", "tiny", "--precision", "fp32", "--dropout", "0", "--seed", "7", "--steps", "3",
          "--lr", "1e-4", "--warmup", "1", "--log-every", "1", "--save-every", "100", "--device", "cpu",
          "--loader-workers", "0"]


def final_weights(run_dir):
    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    assert ckpt.name == "step-0000003"
    return load_file(ckpt / "model.safetensors")


def losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, small_english_data):
    out = tmp_path_factory.mktemp("runs") / "one-by-8"
    run_cli("pretrain", "--data", small_english_data, "--out", out, "--nproc", "1", "--batch-size", "8", *COMMON)
    return out


@pytest.mark.parametrize("layout", [["--nproc", "2", "--batch-size", "4"],
                                    ["--nproc", "1", "--batch-size", "4", "--grad-accum", "2"]],
                         ids=["2procs-x-4", "1proc-x-4-x-accum2"])
def test_same_parameters_as_one_process_with_the_global_batch(tmp_path, small_english_data, reference, layout):
    out = tmp_path / "run"
    proc = run_cli("pretrain", "--data", small_english_data, "--out", out, *layout, *COMMON)
    assert "global batch 8" in proc.stdout
    ref, got = final_weights(reference), final_weights(out)
    assert ref.keys() == got.keys()
    worst = max((ref[k] - got[k]).abs().max().item() for k in ref)
    assert worst <= 1e-6, f"max abs parameter difference {worst:.3g}"
    assert losses(out) == pytest.approx(losses(reference), abs=1e-5)
    # The comparison means something only if training changed the weights.
    first = losses(reference)
    assert len(first) == 3 and first[0] != first[-1]
