"""Workers import the bertgpu that launched them, whatever the working directory holds (issue 40).

The fork server the workers come from is a ``python -c`` process: the working directory heads its sys.path, and a
``bertgpu/`` folder there (the directory holding a clone) was imported as an empty namespace package instead of
the installed one, so every worker failed on ``cannot import name '__version__'``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_RUN

from bertgpu.parallel import launch

BERTGPU = Path(sys.executable).with_name("bertgpu")  # the console script pip writes, as a user runs it


def test_a_two_process_run_from_a_directory_holding_a_bertgpu_folder(tmp_path, small_english_data):
    """`bertgpu pretrain --nproc 2` started from a directory with a stray `bertgpu/` folder (no __init__.py, a
    module of its own): both workers import the launching package and the run finishes."""
    here = tmp_path / "home"
    (here / "bertgpu").mkdir(parents=True)
    (here / "bertgpu" / "notes.py").write_text("raise SystemExit('the stray folder was imported')\n")
    args = ["pretrain", "--data", str(small_english_data), "--out", "run", *TINY_RUN, "--nproc", "2"]
    args += ["--steps", "1", "--batch-size", "2", "--max-seq-length", "32", "--no-nsp"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([str(BERTGPU), *args], capture_output=True, text=True, cwd=here, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "unknown location" not in proc.stderr
    assert (here / "run" / "checkpoints" / "step-0000001" / "model.safetensors").exists()  # --out is the cwd's


def _imported_from(cwd: Path, env: dict[str, str]) -> str:
    """Where a `python -c` started in ``cwd`` with ``env`` (as the fork server starts) finds bertgpu."""
    code = "import bertgpu, sys; print(getattr(bertgpu, '__file__', None) or 'namespace')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=60)
    return proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]


def test_the_workers_interpreter_finds_this_package_before_the_working_directory(tmp_path):
    """What the fork server's interpreter imports, with the variables launch gives it: this package, past a bare
    `bertgpu/` folder on any Python (3.10 has no PYTHONSAFEPATH, dropped here), and past a regular package of that
    name in the working directory where PYTHONSAFEPATH exists."""
    ours = str(Path(launch.__file__).parents[1] / "__init__.py")
    bare, regular = tmp_path / "bare", tmp_path / "regular"
    (bare / "bertgpu").mkdir(parents=True)
    (regular / "bertgpu").mkdir(parents=True)
    (regular / "bertgpu" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in launch.WORKER_IMPORT_ENV}
    workers = {**env, **launch.worker_import_env()}
    without_safe_path = {k: v for k, v in workers.items() if k != "PYTHONSAFEPATH"}
    assert _imported_from(bare, without_safe_path) == ours
    assert _imported_from(bare, workers) == ours
    if sys.version_info < (3, 11):
        pytest.skip("PYTHONSAFEPATH is Python 3.11's")
    assert _imported_from(regular, workers) == ours
