"""`bertgpu bench` as a user runs it: both sides timed in one run, the table, and the last line; MFU on real
tokens and the peak of each card by its exact model."""

from __future__ import annotations

import functools
import re

import pytest
import torch
from conftest import run_in_process

from bertgpu.config import BenchConfig
from bertgpu.models import architectures
from bertgpu.models.bert.config import BertConfig
from bertgpu.tasks import bench
from bertgpu.training import metrics
from bertgpu.training.precision import card_peak, peak_flops


def test_bench_cli_on_cpu_prints_both_sides_and_ends_with_the_speedup(uncased_vocab):
    # From the test process (run_cli gives bench a process of its own, for its timings): this checks the table, not
    # the speed, and a fresh interpreter would import torch and transformers again (4-5 s of CPU).
    proc = run_in_process(
        "bench",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--vocab",
        str(uncased_vocab),
        "--dropout",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "vocab 30,522" in proc.stdout and "fp32" in proc.stdout
    assert "dropout 0 (hidden and attention, both sides)" in proc.stdout  # the default, printed
    padding = re.search(
        r"^padding ([\d.]+)% of the batch's 512 tokens \(([\d,]+) real; attention mask passed\)", proc.stdout, re.M
    )
    assert padding, proc.stdout
    real = int(padding[2].replace(",", ""))
    assert 0 < real < 512 and abs(float(padding[1]) - 100 * (1 - real / 512)) < 0.051  # NSP pairs leave padding
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith(("bertgpu ", "transformers "))}
    assert set(rows) == {"bertgpu", "transformers"}
    for _name, (ms, seq_s, tokens_s, mfu) in rows.items():
        assert float(ms) > 0 and float(seq_s) > 0 and mfu == "n/a"  # no MFU without a GPU's known peak
        # tokens/s counts the real tokens: a row holds real / 4 of them on average
        assert abs(float(tokens_s.replace(",", "")) - real / 4 * float(seq_s)) <= real / 4 * 0.05 + 1
    speedup = re.fullmatch(r"speedup: (\d+\.\d\d)", lines[-1])
    ratio = float(rows["transformers"][0]) / float(rows["bertgpu"][0])  # of step times printed to 0.1 ms
    # The speedup is printed to 0.01 and the step times to 0.1 ms: both roundings allowed for.
    assert speedup and abs(float(speedup[1]) - ratio) <= 0.005 + 0.02 * ratio


def test_bench_with_a_missing_vocab_is_one_clear_line(tmp_path):
    # from the test process: nothing is timed before the refusal, so no process of its own is needed (run_cli's)
    proc = run_in_process("bench", "--model", "tiny", "--device", "cpu", "--vocab", str(tmp_path / "nope.txt"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"vocab file {tmp_path / 'nope.txt'} does not exist" in proc.stderr


def test_bench_times_transformers_eager_and_compiled_and_says_why_cuda_graphs_are_left_out(
    uncased_vocab, monkeypatch, capsys
):
    """bench's own logic on the CPU: every transformers mode a CPU has (eager, torch.compile) is timed and
    the ratio is taken against the fastest; reduce-overhead is named as left out. torch.compile runs with
    the aot_eager backend here (the same tracing of both models, forward and backward, without Inductor's
    C++ code generation, minutes on a shared CPU): what runs fast is not this test's question."""
    compiled: list[dict] = []
    real_compile = torch.compile

    def traced(*args, **kwargs):
        compiled.append(kwargs)
        return real_compile(*args, **{**kwargs, "backend": "aot_eager", "mode": None})

    monkeypatch.setattr(torch, "compile", traced)
    cfg = BenchConfig(
        model="tiny", device="cpu", batch_size=2, seq_len=32, max_predictions=4, steps=1, warmup=1,
        compile=True, vocab=str(uncased_vocab), dropout=0.1,
    )  # fmt: skip
    result = bench.run(cfg)
    out = capsys.readouterr().out
    assert "dropout 0.1 (hidden and attention, both sides)" in out
    assert "transformers+graphs (torch.compile mode=reduce-overhead) left out: CUDA graphs need a GPU" in out
    names = {"bertgpu", "bertgpu+compile", "transformers", "transformers+compile"}
    assert {k.removesuffix("_seq_per_s") for k in result if k.endswith("_seq_per_s")} == names
    assert len(compiled) == 2  # bertgpu's step and transformers' model, each once
    theirs = max(result["transformers_seq_per_s"], result["transformers+compile_seq_per_s"])
    ours = max(result["bertgpu_seq_per_s"], result["bertgpu+compile_seq_per_s"])
    assert result["speedup"] == pytest.approx(ours / theirs)
    assert re.search(r"over transformers' best \(transformers(\+compile)?\)", out)


def test_transformers_modes_on_a_gpu_include_cuda_graphs():
    modes, note = bench.transformers_modes(torch.device("cuda"), compiled=True)
    assert modes == {"transformers": None, "transformers+compile": "default", "transformers+graphs": "reduce-overhead"}
    assert note == ""
    assert bench.transformers_modes(torch.device("cuda"), compiled=False)[0] == {"transformers": None}


def test_training_flops_count_the_real_tokens_and_scored_slots_only():
    """A hand-computed batch: 2 rows of 4 slots, 4 and 2 real tokens (25% padding), 1 masked slot scored each.
    With h = 4, i = 8, one layer and V = 10, a row of L tokens and P predictions costs (model.py's count)
    3 x [L(8h² + 4hi + 4Lh) + 2h² + 4h + P(2h² + 2hV)] = 3 x [256L + 16L² + 48 + 112P]."""
    config = BertConfig(vocab_size=10, hidden_size=4, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8)
    assert architectures.training_flops_per_sequence(config, 4, 1) == 3 * (256 * 4 + 16 * 16 + 48 + 112)
    # The mean row: 3 real tokens, 1 prediction; two of them.
    assert architectures.training_flops(config, 2, 6, 2) == 2 * 3 * (256 * 3 + 16 * 9 + 48 + 112) == 6432
    padded = 2 * architectures.training_flops_per_sequence(config, 4, 1)  # what charging the padding counted
    assert padded == 8640 and architectures.training_flops(config, 0, 0, 0) == 0

    class Clock:
        now = 100.0

        def perf_counter(self):
            return self.now

    clock = Clock()
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(metrics, "time", clock)
    try:
        meter = metrics.Throughput(functools.partial(architectures.training_flops, config), 1000.0, 1)
        clock.now = 102.0  # a 2-second window of one step
        rates = meter.rates(1, 2, 6, 2)
    finally:
        monkeypatch.undo()
    assert rates["tokens_per_s"] == 3 and rates["seq_per_s"] == 1
    assert rates["mfu"] == pytest.approx(6432 / 2 / 1000)  # real work / time / peak, not 8640's


@pytest.mark.parametrize(
    "name,precision,tflops,card",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "fp32", 494.7, "H100 SXM"),
        ("NVIDIA H100 PCIe", "bf16", 756, "H100 PCIe"),
        ("NVIDIA H100 NVL", "bf16", 835, "H100 NVL"),
        ("NVIDIA H200", "bf16", 989.4, "H200 SXM"),
        ("NVIDIA H200 NVL", "fp16", 835, "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312, "A100"),
        ("NVIDIA A100-SXM4-40GB", "bf16", 312, "A100"),
        ("NVIDIA A100-PCIE-40GB", "fp32", 156, "A100"),
        ("NVIDIA A100 80GB PCIe", "bf16", 312, "A100"),
        ("NVIDIA L4", "bf16", 121, "L4"),
        ("NVIDIA L40S", "bf16", 362.05, "L40S"),
        ("NVIDIA L40", "bf16", 181, "L40"),
        ("NVIDIA A10", "bf16", 125, "A10"),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2, "RTX 4090"),
        ("Tesla V100-SXM2-16GB", "fp16", 125, "V100 SXM2"),
    ],
)
def test_peak_comes_from_the_cards_exact_model(name, precision, tflops, card):
    peak, note = card_peak(name, precision)
    assert peak == pytest.approx(tflops * 1e12) and card in note and "dense" in note


@pytest.mark.parametrize("name", ["NVIDIA H100", "NVIDIA A10G", "NVIDIA GeForce RTX 4090 D", "NVIDIA B200", "AMD"])
def test_an_unknown_card_gets_no_peak_and_says_so(name):
    peak, note = card_peak(name, "bf16")
    assert peak is None and "MFU not shown" in note and "--peak-tflops" in note


def test_peak_tflops_given_wins_everywhere():
    assert peak_flops(torch.device("cpu"), "bf16", 400.0) == (400e12, "peak 400.0 TFLOP/s (--peak-tflops)")
    assert peak_flops(torch.device("cpu"), "bf16")[0] is None
