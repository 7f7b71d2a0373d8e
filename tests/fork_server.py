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
