"""Workers forked from a fork server that has imported what they import, for runs whose main program is not bertgpu's
command line (the test process, tests/slow_rank.py): the product would spawn them, each importing torch afresh (2.5 s
of CPU a worker, again at every elastic restart). It imports this folder's slow_rank too, so that its forward passes
are those the run's workers have."""

from __future__ import annotations

# Beside what the product's fork server imports (launch.worker_preload): TensorBoard (rank 0's run log) and the
# pipeline schedules, which the tests' runs use often.
PRELOAD = ("torch.utils.tensorboard", "torch.distributed.pipelining")


def start_method(fn, args, *extra: str) -> str:
    """launch._start_method for these runs: "forkserver", with launch.worker_preload's modules, PRELOAD, ``extra`` and
    slow_rank preloaded (one that is missing is skipped)."""
    import multiprocessing

    from bertgpu.parallel.launch import worker_preload

    multiprocessing.set_forkserver_preload([*worker_preload(fn, args), *PRELOAD, *extra, "slow_rank"])
    return "forkserver"


def run_command(argv: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """A fork server's child running `python -m bertgpu ARGV[1:]` (ARGV[0] "bertgpu"), or `python tests/slow_rank.py
    ARGV[1:]` (ARGV[0] "slow_rank"), as a fresh interpreter would: a session of its own, ``env`` as its whole
    environment, the checkout as working directory, output to the files ``stdout`` and ``stderr`` (the same path:
    one file), its exit status its own. Only torch and bertgpu's imports are skipped, already done in the server."""
    import os
    import runpy
    import sys
    from pathlib import Path

    os.setsid()
    for fd, path in ((1, stdout), (2, stderr)):
        if fd == 2 and path == stdout:
            os.dup2(1, 2)  # one file, one offset: as stderr=subprocess.STDOUT
            break
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    if env.get("PYTHONUNBUFFERED"):  # read at an interpreter's start: this one started as the fork server
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    root = Path(__file__).resolve().parents[1]
    os.chdir(root)
    os.environ.clear()
    os.environ.update(env)
    if argv[0] == "slow_rank":
        sys.argv = [str(root / "tests" / "slow_rank.py"), *argv[1:]]
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        sys.argv = ["bertgpu", *argv[1:]]
        runpy.run_module("bertgpu", run_name="__main__", alter_sys=True)
