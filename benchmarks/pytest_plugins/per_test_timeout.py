"""A pytest plugin for ``benchmarks/gpu.sh``'s CUDA tests: ``--per-test-timeout N`` ends a test that runs
longer than N seconds, so that one stuck or slow test costs its own result and not the rest's (the GPU
machine has no pytest-timeout, and nothing may be installed there).

In the process's main thread (pytest-xdist workers run tests there) SIGALRM fails the test cleanly at N
seconds. A watchdog thread (``faulthandler.dump_traceback_later``) ends the whole process 30 s later if that
did not work (a call that never returns to Python): xdist reports the test as crashed and starts a new worker.
Loaded with ``-p per_test_timeout`` and benchmarks/pytest_plugins/ on PYTHONPATH.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading

import pytest

GRACE = 30.0  # seconds after the clean failure before the watchdog ends the process


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--per-test-timeout", type=float, default=0.0, help="fail a test after this many seconds")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    limit = item.config.getoption("--per-test-timeout")
    if limit <= 0:
        yield
        return
    main = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")
    if main:

        def expire(signum, frame):
            pytest.fail(f"ran past the per-test timeout of {limit:.0f} s", pytrace=False)

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, limit)
    faulthandler.dump_traceback_later(limit + GRACE, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
