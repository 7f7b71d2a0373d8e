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


def run_command(
    argv: list[str],
    env: dict[str, str],
    stdout: str | None,
    stderr: str | None,
    file_size: int | None = None,
    unbuffered: bool = False,
) -> None:
    """A fork server's child running `python -m bertgpu ARGV[1:]` (ARGV[0] "bertgpu"), `python tests/slow_rank.py
    ARGV[1:]` (ARGV[0] "slow_rank"), `torchrun ARGV[1:]` (ARGV[0] "torchrun") or `python -c CODE ARGS` (ARGV "-c",
    CODE, ARGS), as a fresh interpreter would:
    a session of its own, ``env`` as its whole environment, the checkout as working directory, output to the files
    ``stdout`` and ``stderr`` (the same path: one file; None: the server's, as a Popen child inherits its parent's),
    its exit status its own. Only torch and bertgpu's imports are skipped, already done in the server.
    ``file_size``: the most bytes it (and every process it starts) may write to a file, as a full disk would allow
    (a write past it fails with EFBIG); ``unbuffered``: as `python -u`."""
    import os
    import runpy
    import sys
    from pathlib import Path

    os.setsid()
    limit_file_size(file_size)
    for fd, path in ((1, stdout), (2, stderr)):
        if path is None:
            continue
        if fd == 2 and path == stdout:
            os.dup2(1, 2)  # one file, one offset: as stderr=subprocess.STDOUT
            break
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    if unbuffered or env.get("PYTHONUNBUFFERED"):  # read at an interpreter's start: this one started as the server
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    root = Path(__file__).resolve().parents[1]
    os.chdir(root)
    os.environ.clear()
    os.environ.update(env)
    serve_workers_from_here()
    if argv[0] == "torchrun":
        fork_torchruns_workers()
        sys.argv = ["torchrun", *argv[1:]]
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
        return
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    elif argv[0] == "slow_rank":
        sys.argv = [str(root / "tests" / "slow_rank.py"), *argv[1:]]
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        sys.argv = ["bertgpu", *argv[1:]]
        runpy.run_module("bertgpu", run_name="__main__", alter_sys=True)


def limit_file_size(size: int | None) -> None:
    """At most ``size`` bytes to a file for this process and every one it starts (None: no limit), as a full disk
    would allow: a write past it fails with EFBIG instead of ending the process with SIGXFSZ."""
    if size is not None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def serve_workers_from_here() -> None:
    """Make this process's multiprocessing fork server a fork of this process, started now, while it has one thread:
    its workers then have torch, torch._dynamo, DCP and bertgpu imported already (the server multiprocessing execs
    imports them again: 4.3 s of CPU for each launcher a test kills), and it lives in this process's session, so that
    killing that kills them too. What ``ForkServer.ensure_running`` does, with os.fork instead of a new interpreter;
    left to it where its internals differ (Python 3.14 authenticates its clients)."""
    import os
    import socket
    from multiprocessing import connection, forkserver, resource_tracker, util

    server = forkserver._forkserver
    if server._forkserver_pid is not None or hasattr(server, "_forkserver_authkey"):
        return
    resource_tracker.ensure_running()
    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    if not util.is_abstract_socket_namespace(address):
        os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()  # the server ends when every process holding alive_w has
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        try:
            forkserver.main(listener.fileno(), alive_r, [])
        finally:
            os._exit(0)
    os.close(alive_r)
    listener.close()
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


class ForkedProcess:
    """A multiprocessing Process (forked from a fork server) as the part of subprocess.Popen that tests and torch's
    elastic agent use: args (the command it stands for), pid, poll, wait (TimeoutExpired past ``timeout``),
    returncode (negative: the signal)."""

    def __init__(self, process, args) -> None:
        import multiprocessing

        process.start()
        # Not joined at its parent's exit as multiprocessing joins its children: whoever started it ends it.
        multiprocessing.process._children.discard(process)
        self._process, self.args, self.pid, self.returncode = process, args, process.pid, None

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


def fork_torchruns_workers() -> None:
    """In a torchrun agent forked by ``run_command``: its workers (`python -u -m bertgpu ARGS`) forked from this
    process's fork server (``serve_workers_from_here``, made while it had one thread) instead of the fresh
    interpreters its ``SubprocessHandler`` starts, which import torch, torch._dynamo and bertgpu again (about 4 s of
    CPU each, four in a killed-and-restarted run). Everything else is torchrun's own: rendezvous, monitoring,
    signals to the worker's session, restarts. Each worker's pid and local rank are appended to the file
    BERTGPU_TEST_WORKER_PIDS names, for a test that kills one (its /proc environ is the fork server's, without
    torchrun's variables). The SLURM test runs torchrun's command with its fresh workers."""
    import multiprocessing
    import os

    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    fresh = subprocess_handler.SubprocessHandler._popen

    def forked(handler, args: tuple, env: dict[str, str]):
        flags = list(args[1:])
        unbuffered = flags[:1] == ["-u"]
        flags = flags[unbuffered:]
        if flags[:2] != ["-m", "bertgpu"]:
            return fresh(handler, args, env)
        streams = [getattr(f, "name", None) for f in (handler._stdout, handler._stderr)]
        worker = ForkedProcess(
            multiprocessing.get_context("forkserver").Process(
                target=run_command, args=(["bertgpu", *flags[2:]], env, *streams, None, unbuffered)
            ),
            args,
        )
        if os.environ.get("BERTGPU_TEST_WORKER_PIDS"):
            with open(os.environ["BERTGPU_TEST_WORKER_PIDS"], "a") as pids:
                pids.write(f"{worker.pid} {handler.local_rank_id}\n")
        return worker

    subprocess_handler.SubprocessHandler._popen = forked
