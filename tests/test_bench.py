"""`bertgpu bench` as a user runs it: both sides timed in one run, the table, and the last line."""

from __future__ import annotations

import re

from conftest import run_cli


def test_bench_cli_on_cpu_prints_both_sides_and_ends_with_the_speedup(uncased_vocab):
    proc = run_cli(
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
        uncased_vocab,
    )
    lines = proc.stdout.strip().splitlines()
    assert "vocab 30,522" in proc.stdout and "fp32" in proc.stdout
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith(("bertgpu ", "transformers "))}
    assert set(rows) == {"bertgpu", "transformers"}
    for _name, (ms, seq_s, tokens_s, mfu) in rows.items():
        assert float(ms) > 0 and float(seq_s) > 0 and mfu == "n/a"  # no MFU without a GPU's known peak
        assert abs(float(tokens_s.replace(",", "")) - 128 * float(seq_s)) <= 128 * 0.05 + 1  # seq 128
    speedup = re.fullmatch(r"speedup: (\d+\.\d\d)", lines[-1])
    ratio = float(rows["transformers"][0]) / float(rows["bertgpu"][0])  # of step times printed to 0.1 ms
    # The speedup is printed to 0.01 and the step times to 0.1 ms: both roundings allowed for.
    assert speedup and abs(float(speedup[1]) - ratio) <= 0.005 + 0.02 * ratio


def test_bench_with_a_missing_vocab_is_one_clear_line(tmp_path):
    proc = run_cli("bench", "--model", "tiny", "--device", "cpu", "--vocab", tmp_path / "nope.txt", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"vocab file {tmp_path / 'nope.txt'} does not exist" in proc.stderr
