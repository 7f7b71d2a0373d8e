"""gpu_check.py's first phases, on the GPU only: tests/test_cuda.py under pytest-xdist (``start_tests``, read by
``tests_result``) beside the warm-ups (``warm_commands``, ``warm_up``), a step or two of every timed run so that
torch.compile's caches on disk hold their graphs before the timed runs."""

from __future__ import annotations

import os
import re
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import common
from common import PY, ROOT
from gpu_check_plan import applies, bench_args, pretrain_args, switch_args, ttq_bertgpu_args, ttq_child_args
from gpu_check_rows import Check, failed

PLUGINS = Path(__file__).resolve().parent / "pytest_plugins"  # per_test_timeout.py


def start_tests(check: Check, pool: ThreadPoolExecutor, until: float, cores: int) -> tuple[Future, Future]:
    """tests/test_cuda.py on ``pool``, ending by ``until`` at the latest, and beside it the collection of the
    tests' names, so that a run cut short can say which have no result: (the run, the collection)."""
    limits = check.plan["limits"]
    # --dist load: the file's tests spread over the workers (the suite's own --dist loadscope would give
    # the whole file to one worker, which ran past its share on the first H100 run).
    n = str(max(2, cores // 4))
    env = {
        "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", str(ROOT))]),
        "TORCHINDUCTOR_COMPILE_THREADS": "2",
    }
    # tests/test_cuda_step.py: issue 59's switches (the whole step as one CUDA graph, FP8 against bf16, ...)
    pytest = [PY, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_cuda.py", "tests/test_cuda_step.py"]
    tests = pool.submit(common.run_limited, [*pytest, "-v", "-n", n, "--dist", "load", "-p", "per_test_timeout",
                                             "--per-test-timeout", str(limits["test"])],
                        check.work / "tests.log", check.allowed("tests", until), env)  # fmt: skip
    collect = pool.submit(common.run_limited, [*pytest, "--collect-only", "-q", "-n", "0"],
                          check.work / "collect.log", 60, env)  # fmt: skip
    return tests, collect


def tests_result(code: int | None, seconds: float, text: str, log: Path, collected: list[str]) -> str:
    """The CUDA tests' cell: pytest's summary, or (cut short) what had finished by then and what had not."""
    summary = re.findall(r"(\d+ (?:passed|failed|skipped|errors?))", text.splitlines()[-1] if text.strip() else "")
    if summary:
        return ", ".join(summary)
    # -v names each test as it ends
    done = {k: len(re.findall(rf" {k} +tests/", text)) for k in ("PASSED", "FAILED", "SKIPPED", "ERROR")}
    result = failed(code, log, seconds) + "; by then " + ", ".join(f"{n} {k.lower()}" for k, n in done.items() if n)
    missing = [name for name in collected if name not in text]
    return result + (f"; no result: {', '.join(n.split('::')[-1] for n in missing)}" if missing else "")


def warm_commands(check: Check, skip: set[str]) -> list[list[str]]:
    """The warm-ups, in the order they start: the acceptance rows' first (the first H100 run's warm-ups last in
    the queue never started)."""
    plan, device, vocab, data, work = check.plan, check.device, check.vocab, check.data, check.work
    p, t = plan["pretrain"], plan["ttq"]
    largest_first = sorted(plan["bench"], key=lambda s: (s[0] != "large", -s[1] * s[2]))
    warm = [bench_args(s, device, vocab, ["--steps", "1", "--warmup", "2"]) for s in largest_first]
    warm = warm if "bench" not in skip else []
    if "pretrain" not in skip:
        warm.insert(1, pretrain_args(p, data, work / "warm-pretrain-bert", device, 3, ["--log-every", "1"]))
        warm.insert(2, pretrain_args(plan["pretrain_512"], data, work / "warm-pretrain-512", device, 3,
                                     ["--log-every", "1"]))  # fmt: skip
    if "ttq" not in skip:
        warm.append(ttq_bertgpu_args(t, check.race_data, work / "warm-ttq", device, 3))
        warm.append(ttq_child_args(t, check.race_data, device, 3))
    if "pretrain" not in skip:
        for arch in plan["archs"][1:]:
            warm.append(pretrain_args(p, data, work / f"warm-pretrain-{arch}", device, 3,
                                      ["--log-every", "1", "--arch", arch]))  # fmt: skip
    if "bench" not in skip and "switches" not in skip:  # issue 59's switch rows, in the order they are timed
        warm += [switch_args(s, device, vocab, ["--steps", "1", "--warmup", "2"], switch)
                 for switch in plan["switches"] for s in plan["switch_shapes"] if applies(switch, s)]  # fmt: skip
    if "bench" not in skip:
        warm += [bench_args(s, device, vocab, ["--steps", "1", "--warmup", "2"]) for s in plan["bench_extra"]]
    return warm


def warm_up(check: Check, warm: list[list[str]], until: float, cores: int) -> None:
    """Run the warm-ups 3 at a time, all ending by ``until``; one that does not finish cleanly is said on stderr."""
    work = check.work
    env = {"TORCHINDUCTOR_COMPILE_THREADS": str(max(1, cores // 4))}
    warmers = ThreadPoolExecutor(max_workers=3)

    def one(i: int, cmd: list[str]):
        left = check.allowed("warm", until)  # when the job starts: the warm-ups end together
        return common.run_limited(cmd, work / f"warm-{i}.log", left, env) if left > 5 else (None, 0.0, "")

    jobs = [warmers.submit(one, i, cmd) for i, cmd in enumerate(warm)]
    for i, job in enumerate(jobs):
        code, _, _ = job.result()
        if code != 0:
            print(f"warm-up {i} did not finish cleanly ({work / f'warm-{i}.log'})", file=sys.stderr)
    warmers.shutdown()
