"""benchmarks/gpu.sh, the whole GPU check in one command, run at a tiny size on the CPU so that it cannot rot:
every phase that runs without a GPU runs (bench, a pretraining run, the time-to-quality race against
transformers), and the table comes out on stdout and in $OUT/gpu-check.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_smoke_on_cpu_writes_one_table_of_every_phase(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the script sets its own: the checkout, as on the GPU machine
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--device", "cpu", "--smoke"],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = (tmp_path / "out" / "gpu-check.md").read_text()
    assert table == proc.stdout
    lines = table.splitlines()
    assert lines[0].startswith("GPU check: CPU | torch ") and lines[0].endswith("| smoke")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ")}
    pretrain = [f"pretrain {arch} tiny 8 x 64, 8 steps" for arch in ("bert", "modernbert")]
    pretrain.append("pretrain bert tiny 2 x 128, 4 steps")  # the 512 row's smoke shape: packed, per document
    pretrain.append("pretrain bert tiny 2 x 128, 4 steps --document-bounds")  # issue 59's switches: the 512 row's
    switches = {"switch --bf16-stream", "switch", "--bf16-stream"}  # a switch's row; the switch table's lines
    assert set(rows) == {"check", "---", "bench tiny 4 x 32", *pretrain, "time to quality tiny 8 x 64, 4 steps",
                         *switches}  # fmt: skip
    assert re.fullmatch(r"\d\.\d\dx the row without it", rows["switch --bf16-stream"][4])
    # the switch table: its speed over the full row, and (one shape measured) not a default to make
    assert re.match(r"\d\.\d\dx \(", rows["--bf16-stream"][1]) and rows["--bf16-stream"][2] == "keep off |"
    bench = rows["bench tiny 4 x 32"]
    assert bench[2].startswith("eager ") and bench[3].startswith("eager ")
    assert re.fullmatch(r"\d+\.\d\dx \(vs transformers\)", bench[4]) and "dropout 0, padding " in bench[1]
    assert "MFU: no MFU on a CPU" in lines
    assert all("seq/s" in rows[name][2] and "waits data" in rows[name][5] for name in pretrain)
    race = rows["time to quality tiny 8 x 64, 4 steps"]
    assert "held-out loss" in race[2] and "held-out loss" in race[3]
    losses = [float(cell.rsplit(" ", 1)[1]) for cell in race[2:4]]
    assert all(5 < loss < 9 for loss in losses)  # a 2,000-token vocab: ln 2000 = 7.6 at the start


def test_a_cuda_test_past_its_own_time_limit_fails_alone(tmp_path):
    """benchmarks/pytest_plugins/per_test_timeout.py, as gpu.sh loads it into pytest-xdist's workers: the slow
    test fails with the reason at its limit, the one beside it still passes, and the run ends long before the
    sleep."""
    (tmp_path / "test_two.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(60)\n\ndef test_fast():\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks" / "pytest_plugins")}
    cmd = [sys.executable, "-m", "pytest", "-p", "per_test_timeout", "--per-test-timeout", "2", "-n", "2", "-v",
           "-p", "no:cacheprovider", "-o", "addopts=", "test_two.py"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED test_two.py::test_slow - Failed: ran past the per-test timeout of 2 s" in proc.stdout
    assert re.search(r"PASSED test_two.py::test_fast", proc.stdout)


def test_cut_short_tests_name_the_ones_without_a_result(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_check

    text = "[gw0] [ 33%] PASSED tests/test_cuda.py::test_a \n[gw1] [ 66%] FAILED tests/test_cuda.py::test_b \n"
    collected = [f"tests/test_cuda.py::test_{x}" for x in "abc"]
    cell = gpu_check.tests_result(None, 200.0, text, tmp_path / "tests.log", collected)
    assert cell.startswith("ran past its 200 s") and cell.endswith("by then 1 passed, 1 failed; no result: test_c")
    done = "=== 2 passed, 1 skipped in 80.1s ==="
    assert gpu_check.tests_result(0, 80.0, text + done, tmp_path / "tests.log", collected) == "2 passed, 1 skipped"
