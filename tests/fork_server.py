"""Workers forked from a fork server that has imported what they import, for runs whose main program is not bertgpu's
command line (the test process, tests/slow_rank.py): the product would spawn them, each importing torch afresh (2.5 s
of CPU a worker, again at every elastic restart). It imports this folder's slow_rank too, so that its forward passes
are those the run's workers have."""

from __future__ import annotations

# Beside the task's module: what every worker imports at its first step or save (torch._dynamo through its
# optimizer, TensorBoard on rank 0, distributed checkpoints), the pipeline schedules, and the tests' slow_rank.
PRELOAD = ("torch._dynamo", "torch.utils.tensorboard", "torch.distributed.checkpoint", "torch.distributed.pipelining")


def start_method(fn, args, *extra: str) -> str:
    """launch._start_method for these runs: "forkserver", with the modules of ``fn`` and ``args``, PRELOAD,
    ``extra`` and slow_rank preloaded (one that is missing is skipped)."""
    import multiprocessing

    modules = {f.__module__ for f in (fn, *args) if callable(f) and getattr(f, "__module__", "").startswith("bertgpu")}
    multiprocessing.set_forkserver_preload([*sorted(modules), *PRELOAD, *extra, "slow_rank"])
    return "forkserver"
