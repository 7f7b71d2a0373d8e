"""Processes: starting them, joining them into one group, and their exits.

PyTorch's own stack is the engine: ``launch`` starts local workers through torch's elastic launcher
(the machinery behind ``torchrun``), and every worker, whether started by us or by ``torchrun``
(single or multi-node), reads RANK / WORLD_SIZE / LOCAL_RANK from the environment and joins one
process group: NCCL on CUDA, gloo on CPU. How the model and the data are spread over these
processes is ``dims.py``'s and ``parallelize.py``'s business.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import site
import sys
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bertgpu.errors import UserError

# A worker exits with one of these after printing its own one-line message, so the launcher adds none.
USER_ERROR_EXIT = 3
INTERRUPTED_EXIT = 4


class Interrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after writing a checkpoint; the message says how to resume."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_generation: int | None = None


def restart_count() -> int:
    """How many times torchrun (or our launcher) has started this job's worker group before this one:
    0 for the first, more after a worker died and the group was restarted (which resumes).

    torchrun's TORCHELASTIC_RESTART_COUNT does not count the restarts of a node whose group was
    restarted because another node's failed (a membership change, free of --max-restarts), and such
    a node's workers would take themselves for a fresh start. So every worker counts itself in the
    job's own store, which the elastic agents keep for the whole job: the first group's workers bring
    the count to WORLD_SIZE, the next group's to twice that, and so on.
    """
    global _generation
    if _generation is None:
        _generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and "MASTER_ADDR" in os.environ:
            world = int(os.environ["WORLD_SIZE"])
            starts = _job_store().add("bertgpu/worker-starts", 1)
            _generation = max(_generation, (starts - 1) // world)
    return _generation


JOB_FILE = ".bertgpu-job"  # in the run directory: the elastic run id of the job training there


def job_started(out: str | os.PathLike) -> bool:
    """Whether this worker's job has already trained in ``out``: a worker group started again by an elastic
    agent, after a failure or because machines left or joined, which must resume. The agents' restart
    counts cannot tell: a machine whose group restarts because another's failed does not count it, and a
    machine that joins late counts from 0; the run directory, shared by all machines, can."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    try:
        return bool(run_id) and (Path(out) / JOB_FILE).read_text() == run_id
    except OSError:
        return False


def restarted(out: str | os.PathLike) -> bool:
    """Whether this worker group is a restart of a job that has trained in ``out`` (it resumes)."""
    return restart_count() > 0 or job_started(out)


def mark_job(out: str | os.PathLike) -> None:
    """Record this worker group's job in ``out`` (rank 0, once the run directory is open)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        (Path(out) / JOB_FILE).write_text(run_id)


def _job_store() -> dist.TCPStore:
    """The elastic agents' store, kept for the whole job (across restarts of the worker group)."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,
        timeout=timedelta(minutes=10),
    )


def launched_externally() -> bool:
    """True inside a worker of torchrun (or of our own launcher)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is available here")
    return device


def resolve_nproc(nproc: int, device: str) -> int:
    """How many local processes to start: one per GPU by default, 1 on CPU."""
    if device == "cuda":
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise UserError(f"--nproc {nproc} is more than the {gpus} GPU(s) present")
        return nproc or gpus
    return nproc or 1


@dataclass(frozen=True)
class Elastic:
    """How torch's elastic launcher runs a group of workers (``launch``): restarted ``max_restarts`` times after a
    failure (the workers resume from the latest checkpoint); with ``nnodes`` (min, max) above 1, one machine's
    agent of a multi-machine run, as torchrun is: the agents meet at ``rdzv_endpoint`` (c10d rendezvous) under
    ``run_id``, waiting ``last_call`` seconds for late machines and beating every ``heartbeat`` seconds."""

    max_restarts: int = 0
    nnodes: tuple[int, int] = (1, 1)
    rdzv_endpoint: str = ""
    run_id: str = ""
    last_call: int = 30
    heartbeat: int = 5


def launch(
    fn: Callable[..., Any],
    args: tuple,
    nproc: int,
    elastic: Elastic = Elastic(),
    preload: tuple[str, ...] = (),
) -> None:
    """Run ``fn(*args)`` in ``nproc`` local worker processes with torch's elastic launcher. ``preload``: optional
    libraries every worker imports (peft for LoRA), which the fork server imports once for them all.

    A worker that failed on a user error, or stopped on a signal, has already printed its one line;
    any other failure is reported with the failing rank and its exit code. With ``elastic.max_restarts``
    the whole group is restarted after a failure (the workers resume from the latest checkpoint).

    With ``elastic.nnodes`` (min, max) above 1 this is one machine's agent of a multi-machine run: when a
    machine is lost the others restart their workers on the smaller world, and when one joins the next restart
    takes it in (elastic membership, torch's own).
    """
    nnodes, rdzv_endpoint = elastic.nnodes, elastic.rdzv_endpoint
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if getattr(dynamic_rendezvous, "get_method_name", None) is not None:
        # The rendezvous names each event it records after its caller through inspect.stack(), which reads the
        # source of every frame: about 1 s of CPU per start on 2 cores. The same name, from the frame itself.
        dynamic_rendezvous.get_method_name = _caller_name

    # After SIGTERM, give the workers time to finish their step and write a checkpoint (newer torch).
    extra = (
        {"shutdown_timeout": 120} if "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)} else {}
    )
    if nnodes[1] > 1:
        # A store of its own for every worker group (rank 0's worker hosts it), instead of one the agents keep:
        # that one has no per-group prefix for a world that changes size, and a machine joining a later round
        # would wait for its address forever.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    config = LaunchConfig(
        min_nodes=nnodes[0],
        max_nodes=nnodes[1],
        nproc_per_node=nproc,
        run_id=elastic.run_id or f"bertgpu-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or "localhost:0",  # like torchrun --standalone: a free port on this machine
        max_restarts=elastic.max_restarts,
        rdzv_configs={"last_call_timeout": elastic.last_call, "keep_alive_interval": elastic.heartbeat},
        monitor_interval=0.1,
        start_method=_start_method(fn, args, *preload),
        **extra,
    )
    # torch's elastic agent logs a worker's exit (with a traceback of its own) and each signal it passes
    # on; bertgpu's workers and the lines below already say what happened, in one line.
    quiet = [
        logging.getLogger(name)
        for name in list(logging.Logger.manager.loggerDict)  # each has its own level
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing"))
    ]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.CRITICAL)
    environ = {name: os.environ.get(name) for name in WORKER_IMPORT_ENV}
    os.environ.update(worker_import_env())
    try:
        elastic_launch(config, fn)(*args)
    except SignalException as e:  # Ctrl-C or SIGTERM reached the launcher: the workers checkpoint and say so
        raise SystemExit(128 + int(e.sigval)) from None
    except UnboundLocalError as e:
        # The same signal, landed on `start = time.time()` in torch's metrics wrapper (elastic.metrics.prof), whose
        # `finally` then reads `start`: the SignalException is this error's context (seen once in about ten suite runs).
        if not isinstance(e.__context__, SignalException):
            raise
        raise SystemExit(128 + int(e.__context__.sigval)) from None
    except RendezvousConnectionError:
        # Another machine hosted the rendezvous and has stopped (after an error of its own, which it printed,
        # or lost): this agent cannot go on, and torch's traceback would bury the other machine's one line.
        raise SystemExit(
            f"bertgpu: error: lost the rendezvous at {rdzv_endpoint}: the machine hosting it has stopped "
            "(its output says why)"
        ) from None
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        if USER_ERROR_EXIT in codes:
            raise SystemExit(2) from None
        if INTERRUPTED_EXIT in codes:
            raise SystemExit(130) from None
        rank, failure = e.get_first_failure()
        raise SystemExit(
            f"bertgpu: error: worker rank {rank} failed with exit code {failure.exitcode} "
            f"(its traceback is printed above)"
        ) from None
    finally:
        for log, level in zip(quiet, levels):
            log.setLevel(level)
        for name, value in environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


WORKER_IMPORT_ENV = ("PYTHONSAFEPATH", "PYTHONPATH")


def worker_import_env() -> dict[str, str]:
    """The variables the workers' interpreters start with, so that they import this bertgpu whatever the working
    directory holds.

    The fork server the workers come from is a ``python -c`` process, whose sys.path begins with the working
    directory: a ``bertgpu/`` folder there (the directory holding a clone, say) is imported as an empty namespace
    package before an editable install's finder is asked, and every worker forked from it inherits that broken
    module. PYTHONSAFEPATH (Python 3.11+) leaves the working directory off the path. The parent of this package on
    PYTHONPATH finds it by path on every version (a regular package wins over a namespace folder met earlier on the
    path) and finds an uninstalled clone run as ``python -m bertgpu``; a site-packages directory is on the path
    already, and is not put before the standard library."""
    parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    site_dirs = [*getattr(site, "getsitepackages", list)(), getattr(site, "getusersitepackages", str)()]
    if os.path.realpath(parent) not in {os.path.realpath(d) for d in site_dirs if d} | set(
        map(os.path.realpath, entries)
    ):
        entries.insert(0, parent)
    return {"PYTHONSAFEPATH": "1", **({"PYTHONPATH": os.pathsep.join(entries)} if entries else {})}


def _start_method(fn: Callable[..., Any], args: tuple, *preload: str) -> str:
    """How the workers start: from a fork server when bertgpu's own command line is the main program, else spawned.

    A fork server imports torch and the task once and forks every worker (and every restart) from it, instead of
    each spawned worker importing them afresh (2 s of CPU per worker). It does not re-run ``__main__``, so it
    serves only our own entry point: a user's script (or a test's wrapper) may patch things at its top level
    that the workers must see, and spawning re-runs it (see ``refuse_when_reimported``)."""
    import multiprocessing

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        ours = spec.name == "bertgpu.__main__"  # python -m bertgpu
    else:
        ours = Path(getattr(main, "__file__", "") or "").name == "bertgpu"  # the console script pip writes
    if not ours or "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload([*worker_preload(fn, args), *preload])  # one not installed is skipped
    return "forkserver"


def worker_preload(fn: Callable[..., Any], args: tuple) -> list[str]:
    """What a fork server imports before it forks the workers of ``fn(*args)``: the bertgpu modules of ``fn`` and
    ``args``, and what every worker imports besides, 1 s of CPU each: torch._dynamo (torch.optim wraps an
    optimizer's methods in it) and distributed checkpoints (with DTensor), which the launcher leaves out."""
    modules = {f.__module__ for f in (fn, *args) if callable(f) and getattr(f, "__module__", "").startswith("bertgpu")}
    return [*sorted(modules), "torch._dynamo", "torch.distributed.checkpoint"]


def _caller_name(depth: int = 2) -> str:
    frame = sys._getframe(depth)  # as inspect.stack()[depth] with this function as frame 0
    return frame.f_code.co_name if frame is not None else "no_method_name"


def elastic_run_id(out: str) -> str:
    """The rendezvous id of a multi-machine run: the same on every machine that runs the same command."""
    return f"bertgpu-{zlib.crc32(os.path.normpath(out).encode()):08x}"


def refuse_when_reimported() -> None:
    """Stop a worker process that is re-running the user's script instead of starting its work.

    Our workers are spawned (a fresh interpreter that imports the parent's ``__main__`` first), so a
    script that calls bertgpu at its top level, without ``if __name__ == "__main__":``, would call it
    again in every worker: one line per worker instead of a traceback per worker."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # Every worker says it: none knows its rank yet (the launcher sets it after this import).
        print(
            "bertgpu: error: bertgpu starts worker processes, which import your script again: put the calls "
            'to bertgpu under `if __name__ == "__main__":` (see docs/python.md)',
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(USER_ERROR_EXIT)


def cpu_threads(local_world: int) -> int:
    """Threads per process on CPU: ``OMP_NUM_THREADS`` when the user (or torchrun) set it, else the cores
    this process may run on (its affinity: a container's or taskset's share, not the machine's count)
    shared between the local processes, so they do not oversubscribe the cores (BENCHMARKS.md: threads)."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given:
        try:
            return max(1, int(given))
        except ValueError:
            raise UserError(f"OMP_NUM_THREADS={given!r} is not a number of threads") from None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // local_world)


def init(device: str) -> DistEnv:
    """Join the process group if there is more than one process; pick this process's device."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(cpu_threads(local_world))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"device_id": dev} if device == "cuda" else {}
        if restart_count() > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # The elastic agent keeps one store across restarts and torch adds no per-attempt prefix
            # (it assumes a new store per retry), so a restarted group would read the dead group's
            # addresses and fail to connect. Join through a prefix of this attempt's own.
            kwargs.update(
                store=dist.PrefixStore(f"bertgpu/restart-{restart_count()}", _job_store()), rank=rank, world_size=world
            )
        dist.init_process_group(backend, **kwargs)
    return DistEnv(rank, world, local_rank, local_world, dev)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all processes, in place (no-op with one process)."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """The maximum of a tensor over all processes, in place (no-op with one process)."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` with one process)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (``obj`` itself with one process)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def world_size(nproc: int, device: str) -> int:
    """The number of processes a run will have, known before they start: torchrun's WORLD_SIZE inside
    one of its workers, else the local processes we would start."""
    if launched_externally():
        return int(os.environ["WORLD_SIZE"])
    return resolve_nproc(nproc, device)


def worker_main(fn: Callable[..., Any], *args: Any) -> Any:
    """Entry point of every worker: a UserError or an interruption becomes one line (from rank 0)
    and a non-zero exit, never a traceback."""
    try:
        return fn(*args)
    except UserError as e:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"bertgpu: error: {e}", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR_EXIT if launched_externally() else 2)
    except Interrupted as e:
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"bertgpu: {e}", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED_EXIT if launched_externally() else 128 + e.signum)
    finally:
        shutdown()
