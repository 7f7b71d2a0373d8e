"""benchmarks/gpu.sh, the whole GPU check in one command, run at a tiny size on the CPU so that it cannot rot:
every phase that runs without a GPU runs (bench, a pretraining run, the time-to-quality race against
transformers), and the table comes out on stdout and in $OUT/gpu-check.md."""

from __future__ import annotations

import os
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
    assert set(rows) == {"check", "---", "bench tiny 4 x 32", *pretrain, "time to quality tiny 8 x 64, 4 steps"}
    bench = rows["bench tiny 4 x 32"]
    assert bench[2].startswith("eager ") and bench[3].startswith("eager ") and bench[4].endswith("x")
    assert all("seq/s" in rows[name][2] and "waits data" in rows[name][5] for name in pretrain)
    race = rows["time to quality tiny 8 x 64, 4 steps"]
    assert "held-out loss" in race[2] and "held-out loss" in race[3]
    losses = [float(cell.rsplit(" ", 1)[1]) for cell in race[2:4]]
    assert all(5 < loss < 9 for loss in losses)  # a 2,000-token vocab: ln 2000 = 7.6 at the start
