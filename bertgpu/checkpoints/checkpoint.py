"""Resumable training checkpoints: a Hugging Face BERT directory (``hf_dir``) plus what it takes to continue,
and the ``Checkpointer`` that decides when a training run writes one.

What it takes to continue is the optimizer's per-parameter state through ``torch.distributed.checkpoint`` (each process
writes the shard it holds, and a resume on another layout reads what it needs), and the plain values
of the run (data position, RNGs, scaler) in ``training_state.pt``. Model and optimizer state are
taken through ``torch.distributed.checkpoint.state_dict`` on every process. Every directory is
written atomically (``atomic``). Nothing read back can run code: safetensors for the weights,
``torch.load(weights_only=True)`` for the state, and an allow-list for the metadata pickle of
torch.distributed.checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import pickle
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from bertgpu import atomic
from bertgpu.checkpoints.hf_dir import full_state_dict, is_main, write_pretrained
from bertgpu.config import RunConfig
from bertgpu.errors import UserError
from bertgpu.models.config import EncoderConfig

STATE_NAME = "training_state.pt"  # plain values: data position, RNGs, scaler, records (rank 0)
OPTIMIZER_DIR = "optimizer"  # the optimizer's per-parameter tensors: torch.distributed.checkpoint, a file per process
CARD_NAME = "README.md"  # the model card (bertgpu.checkpoints.model_card)
RUN_CONFIG_NAME = "bertgpu.json"  # the task's config dataclass, as JSON
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first. Temporary directories of an interrupted write
    (``.step-N.tmp-...``) are never listed: only a renamed directory is complete."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def read_run_record(directory: str | os.PathLike) -> dict[str, Any] | None:
    """A checkpoint's bertgpu.json: its run's config under ``config`` (the sections as dicts) and the notes beside
    it; None where there is none or it is not ours (no file, not JSON, no ``config`` section)."""
    try:
        record = json.loads((Path(directory) / RUN_CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("config"), dict) else None


def open_run_dir(run_dir: Path, start_afresh: bool) -> None:
    """Make the run directory (emptied first when starting afresh) and clean up after a killed write."""
    if start_afresh and run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(run_dir)


def remove_stale_temporaries(run_dir: str | os.PathLike) -> None:
    """Clean up after a killed write, in ``run_dir/checkpoints`` and ``run_dir`` (fine-tuning's best/).

    A temporary directory (``.NAME.tmp-*``) is never complete and goes. A replaced directory moved
    aside (``.NAME.old-*``) is complete: it goes when ``NAME`` is in place, and becomes ``NAME``
    again when the kill fell between the two renames of a replacement. A temporary file
    (``.NAME.tmp``, fine-tuning's metrics.json) goes.
    """
    run_dir = Path(run_dir)
    for root in (run_dir / "checkpoints", run_dir):
        if not root.is_dir():
            continue
        for p in sorted(root.iterdir()):
            if not p.name.startswith("."):
                continue
            if ".tmp-" in p.name:
                shutil.rmtree(p, ignore_errors=True)
            elif ".old-" in p.name:
                final = root / p.name[1:].split(".old-")[0]
                if final.exists():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    os.rename(p, final)
            elif p.name.endswith(".tmp") and p.is_file():
                p.unlink(missing_ok=True)


@dataclass(frozen=True)
class ModelFiles:
    """What a Hugging Face directory holds beside the weights: the model's config (config.json, with the
    ``architecture``'s class name, a fine-tuned model's ``architectures.head_class_name(config, head)``; None: the
    model's own class name) and its vocab, lower-cased or not (vocab.txt and the tokenizer's files)."""

    model_config: EncoderConfig
    vocab_path: str | os.PathLike
    do_lower_case: bool
    architecture: str | None = None


@dataclass
class Snapshot:
    """What a checkpoint holds of a training run at one step, besides the model and optimizer: the plain
    values (``training_state.pt``), this process's own tensors (PowerSGD's), the model card, and the run's config
    as it ran to this step, with what was settled at run time (bertgpu.json)."""

    values: dict[str, Any]
    rank_tensors: dict[str, torch.Tensor] | None = None
    card: str | None = None
    config: Any = None  # None: the config ``Checkpointer.set_contents`` was given
    notes: dict[str, Any] | None = None  # beside the config in bertgpu.json (a --time-budget that planned its steps)


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    files: ModelFiles,
    snapshot: Snapshot,
    keep: int,
    saver: BackgroundSaver | None = None,
) -> Path:
    """Write the resumable checkpoint ``run_dir/checkpoints/step-NNNNNNN`` atomically and keep the
    newest ``keep``. Every process calls this, together; ``snapshot.rank_tensors`` is state of this process's
    own (PowerSGD's error feedback), saved beside its optimizer shard (``load_rank_tensors``). With a
    ``saver`` the state is staged in memory and written in the background while training goes on
    (``BackgroundSaver``): the directory appears when it is complete, as ever.

    The directory is a Hugging Face BERT directory (``files``) that transformers loads as it is (the weights
    gathered from every process's shard, written by rank 0); beside the weights lie the optimizer
    state (``optimizer/``, each process writing its own shard), the plain training state (``snapshot.values``:
    tensors and plain values only, read back with ``torch.load(weights_only=True)``), the run's
    config (bertgpu.json: ``snapshot.config``, the config as the run ran, and its ``notes`` beside it) and the
    model card. If the write fails (a full disk), the previous checkpoint stays the latest and nothing
    half-written remains.
    """
    path = Path(run_dir) / "checkpoints" / f"step-{step:07d}"
    previous = latest_checkpoint(run_dir)
    state, run_config, notes = snapshot.values, snapshot.config, snapshot.notes

    def beside(tmp: Path) -> None:  # reads ``state`` when it runs: the deep copy below, with a saver
        torch.save({"step": step, **state}, tmp / STATE_NAME)
        atomic.write_json(
            tmp / RUN_CONFIG_NAME,
            {"step": step, **(notes or {}), "config": dataclasses.asdict(run_config)},
            sort_keys=True,
        )

    write = _model_dir_writer(model, files, snapshot.card, beside)

    def prune() -> None:
        if is_main():
            for old in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)

    kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
    if saver is not None:
        state = copy.deepcopy(state)  # the loop goes on changing what it handed over
        saver.save(path, model, write, optimizer, kept, snapshot.rank_tensors, prune)
        return path
    _save_collectively(path, model, write, optimizer, kept, snapshot.rank_tensors)
    prune()
    return path


class Checkpointer:
    """When a training run writes its resumable checkpoint, and the writing: torchtitan's CheckpointManager.

    A checkpoint is due after the run's last step, every --save-every steps and every --save-every-minutes
    (by rank 0's clock: ``clock`` is read on every process, the loop shares it through its per-step flags
    and sets ``clock_due`` on all of them alike); with --async-save it is written in the background
    (``BackgroundSaver``), and the newest --keep are kept. Every process asks ``save`` at the same steps,
    with the same answers, and only a due save gathers the run's state (a collective). What every checkpoint
    holds besides that state (model, optimizer, the config and vocab) is set once it exists (``set_contents``).
    """

    def __init__(self, run_dir: Path, run: RunConfig, started: float | None = None) -> None:
        self.run_dir, self.every, self.keep = run_dir, run.save_every, run.keep
        self.every_s = 60 * run.save_every_minutes
        self.saver = BackgroundSaver() if run.async_save else None
        # The run's start (``started``, a time.monotonic() reading) counts as a save for --save-every-minutes.
        self.last_save = time.monotonic() if started is None else started
        self.clock_due = False  # --save-every-minutes said so, heard by every process
        self.latest: Path | None = None  # the newest checkpoint this process saved

    def set_contents(self, model: nn.Module, optimizer: torch.optim.Optimizer, files: ModelFiles, config: Any) -> None:
        """What every checkpoint holds besides the run's state: the model (spread over the processes) and
        its optimizer, the model's config and vocab (``files``), and the task's ``config`` (bertgpu.json)."""
        self.model, self.optimizer, self.files, self.config = model, optimizer, files, config

    def clock(self) -> bool:
        """Whether --save-every-minutes is up by this process's clock (only rank 0's counts)."""
        return is_main() and self.every_s > 0 and time.monotonic() - self.last_save >= self.every_s

    def due(self, step: int, last: bool = False, epoch_end: bool = False) -> bool:
        """Whether a checkpoint follows optimizer step ``step`` (``last``: the run's last): the last step,
        every --save-every steps, or the clock. At the end of an epoch (fine-tuning) none: the epoch's own
        checkpoint follows its evaluation."""
        return not epoch_end and (last or self.clock_due or step % self.every == 0)

    def save(
        self,
        step: int,
        state: Callable[[], Snapshot],
        *,
        last: bool = False,
        epoch_end: bool = False,
        force: bool = False,
    ) -> Path | None:
        """Write the checkpoint of ``step`` if one is ``due`` (or ``force``: a stop, a failing run, an epoch's
        end): ``state()`` gives what it holds besides the model and optimizer. Return its path, or None."""
        return self.write(step, state) if force or self.due(step, last, epoch_end) else None

    def write(self, step: int, state: Callable[[], Snapshot]) -> Path:
        """Write the checkpoint of ``step``, due or not; return its path."""
        snapshot = state()
        self.last_save, self.clock_due = time.monotonic(), False
        if snapshot.config is None:
            snapshot = dataclasses.replace(snapshot, config=self.config)
        self.latest = save_checkpoint(
            self.run_dir, step, self.model, self.optimizer, self.files, snapshot, self.keep, self.saver
        )
        return self.latest

    def wait(self) -> None:
        """Block until the checkpoint written in the background is complete (a failure is a UserError)."""
        if self.saver is not None:
            self.saver.wait()

    def close(self) -> None:
        """The last checkpoint is written before the run ends."""
        if self.saver is not None:
            self.saver.close()


def save_model_dir(
    path: Path,
    model: nn.Module,
    files: ModelFiles,
    *,
    json_files: dict[str, Any] | None = None,
    card: str | None = None,
) -> Path:
    """Write a Hugging Face BERT directory of a model spread over processes, atomically (every
    process calls this; rank 0 writes), with more JSON files beside the weights."""

    def beside(tmp: Path) -> None:
        for name, obj in (json_files or {}).items():
            atomic.write_json(tmp / name, obj)

    write = _model_dir_writer(model, files, card, beside)
    _save_collectively(Path(path), model, write, None, "nothing was replaced")
    return Path(path)


def _model_dir_writer(
    model: nn.Module, files: ModelFiles, card: str | None, beside: Callable[[Path], None]
) -> Callable[[Path, dict[str, torch.Tensor]], None]:
    """What rank 0 writes into the temporary directory of a checkpoint or a model directory: the Hugging Face
    BERT directory of the gathered ``weights`` (``files``: its config and vocab), then ``beside(tmp)``'s files,
    then the model card."""

    def write(tmp: Path, weights: dict[str, torch.Tensor]) -> None:
        write_pretrained(
            model,
            files.model_config,
            tmp,
            vocab_path=files.vocab_path,
            do_lower_case=files.do_lower_case,
            architecture=files.architecture,
            state=weights,
        )
        beside(tmp)
        if card:
            (tmp / CARD_NAME).write_text(card, encoding="utf-8")

    return write


def _save_collectively(
    final: Path,
    model: nn.Module,
    write: Any,
    optimizer: torch.optim.Optimizer | None,
    kept: str,
    rank_tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """Gather the weights, write them (rank 0, through ``write(tmp, weights)``) and the optimizer's
    shards (every rank) into a temporary directory, and rename it to ``final`` once every rank has
    succeeded. A failure anywhere becomes the same UserError on every rank, with nothing left behind."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    weights, tensors, tmp = _stage(final, model, optimizer, rank_tensors)

    def write_shards() -> None:
        if tensors is not None:
            with _single_process_is_meant():
                dcp.save(
                    tensors, storage_writer=dcp.FileSystemWriter(tmp / OPTIMIZER_DIR), no_dist=not dist.is_initialized()
                )

    failed = _finish(final, tmp, weights, write, write_shards, group=None)
    if failed:
        raise UserError(f"could not write checkpoint {final} ({failed}); {kept}")


def _stage(
    final: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, rank_tensors: dict | None
) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None, Path]:
    """What every rank does at the step of a save: the whole weights gathered to rank 0, this rank's
    optimizer tensors, and the temporary directory rank 0 made for them (collectives on the training's
    process group, so they run in the training's order)."""
    import torch.distributed as dist

    from bertgpu.parallel import launch

    weights = full_state_dict(model)
    tensors = optimizer_tensors(model, optimizer) if optimizer is not None else None
    if tensors is not None and rank_tensors:
        tensors["rank"] = {str(dist.get_rank() if dist.is_initialized() else 0): rank_tensors}
    tmp = launch.broadcast_object(atomic.new_temporary(final) if is_main() else None)
    return weights, tensors, tmp


def _finish(final: Path, tmp: Path, weights: Any, write: Any, write_shards: Any, group: Any) -> str:
    """Write the shards (every rank) and rank 0's files into ``tmp``, then rename it to ``final`` once every
    rank has succeeded; on a failure anywhere remove it. Return the first failure ('' for none). The
    collectives run on ``group`` (a background save's own, or the default)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    reason = ""
    try:
        write_shards()
        if is_main():
            write(tmp, weights)
    except UserError as e:  # atomic.write_json names the file it could not write
        reason = str(e)
    except (OSError, SafetensorError, RuntimeError, dcp.api.CheckpointException) as e:
        # safetensors, torch.save and torch.distributed.checkpoint wrap the OS's write errors
        reason = getattr(e, "strerror", None) or (str(e).strip().splitlines() or [type(e).__name__])[-1]
    reasons = [reason]
    if dist.is_initialized():
        reasons = [None] * dist.get_world_size(group)
        dist.all_gather_object(reasons, reason, group=group)
    failed = [r for r in reasons if r]
    if is_main():
        if failed:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            atomic.commit(tmp, final)
    if dist.is_initialized():
        dist.barrier(group=group)
    return failed[0] if failed else ""


class BackgroundSaver:
    """Checkpoints written while training goes on, one at a time, as torchtitan's async checkpointing does.

    At the step of a save every rank stages what it holds (the weights gathered to rank 0 and copied, the
    optimizer's tensors copied by torch.distributed.checkpoint's ``async_save``); the files are then
    written by a background thread, whose collectives run on a gloo process group of their own so that
    they never interleave with training's. The next save, the end of the run and an interruption wait
    for the one in flight. The directory is renamed into place only when every rank has written its
    part, so a crash during a background write leaves the previous checkpoint the latest.
    """

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        # One process saving alone is meant: torch.distributed.checkpoint says otherwise from the writer thread,
        # outside any catch_warnings of ours.
        warnings.filterwarnings("ignore", message="torch.distributed is .*single process")
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertgpu-save")
        self.pending: Any = None  # (future, final path, what is kept on failure)
        self.group: Any = None

    def save(self, final: Path, model: nn.Module, write: Any, optimizer: Any, kept: str, rank_tensors, prune) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        self.wait()
        if dist.is_initialized() and self.group is None:
            self.group = dist.new_group(backend="gloo")  # every rank reaches its first save together
        weights, tensors, tmp = _stage(final, model, optimizer, rank_tensors)
        if weights is not None:
            weights = {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}
        shards = None
        if tensors is not None:
            with _single_process_is_meant():
                shards = dcp.async_save(
                    tensors,
                    storage_writer=dcp.FileSystemWriter(tmp / OPTIMIZER_DIR),
                    process_group=self.group,
                    no_dist=not dist.is_initialized(),
                )

        def job() -> str:
            failed = _finish(final, tmp, weights, write, lambda: shards is not None and shards.result(), self.group)
            if not failed:
                prune()
            return failed

        self.pending = (self.pool.submit(job), final, kept)

    def wait(self) -> None:
        """Block until the save in flight is written; a failed one is a UserError (on every rank)."""
        if self.pending is None:
            return
        future, final, kept = self.pending
        self.pending = None
        failed = future.result()
        if failed:
            raise UserError(f"could not write checkpoint {final} ({failed}); {kept}")

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=True)


@contextlib.contextmanager
def _single_process_is_meant() -> Iterator[None]:
    """torch.distributed.checkpoint warns that it assumes one process when there is no process
    group; a one-process run means exactly that."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*single process")
        yield


def optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's per-parameter tensors (moments, step counts) keyed by parameter name, as this
    process holds them (DTensor shards under FSDP and tensor parallelism). Every process calls it.

    Only tensors: the hyperparameters come from the config and the learning rate from the schedule
    (a function of the step), so a checkpoint holds nothing that unpickling could run.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer)["state"]
    for alias in model.optimizer_aliases:
        state.pop(alias, None)  # a pipeline's copy of a tied tensor: the same state as the original, saved once
    for name, values in state.items():
        for key, value in values.items():
            if not torch.is_tensor(value):
                raise TypeError(f"optimizer state {name}.{key} is a {type(value).__name__}, not a tensor")
        # A new dict: ``values`` is the optimizer's own per-parameter state, which must keep its strided moments.
        state[name] = {key: _unstrided(value) for key, value in values.items()}
    return {"state": state}


def _unstrided(tensor: Any) -> Any:
    """A DTensor strided over a tensor-parallel group (fused weights: parallel.fused_tp),
    made whole over that group: torch.distributed.checkpoint writes and reads contiguous shards only. Any
    other tensor as it is."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(tensor, DTensor) and any(isinstance(p, _StridedShard) for p in tensor.placements):
        placements = [Replicate() if isinstance(p, _StridedShard) else p for p in tensor.placements]
        return tensor.redistribute(placements=placements)
    return tensor


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, path: str | os.PathLike) -> None:
    """Load a checkpoint's optimizer state into ``optimizer``, whatever the layout it was saved from
    (every process calls this and reads the parts of the saved tensors it holds now).

    Refuses state whose shapes do not fit the model's parameters (as after a resume with another
    vocab padding), naming the tensor, instead of failing later in a kernel.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    folder = Path(path) / OPTIMIZER_DIR
    if not (folder / ".metadata").is_file():
        raise UserError(
            f"{folder} is missing: {path} is not a resumable bertgpu checkpoint (written by this "
            f"version); start from its weights with --model {path} instead"
        )
    reader = _safe_reader(folder)
    saved = reader.read_metadata().state_dict_metadata
    template = get_optimizer_state_dict(model, optimizer)  # creates the state tensors to load into
    # A pipeline's copy of a tied tensor reads the state saved under the original's name.
    saved_as = {name: model.optimizer_aliases.get(name, name) for name in template["state"]}
    for name in list(template["state"]):
        keys = {key: f"state.{saved_as[name]}.{key}" for key in template["state"][name]}
        if not any(flat in saved for flat in keys.values()):
            del template["state"][name]  # never stepped when saved (no gradient yet): it stays so
            continue
        for key, flat in keys.items():
            value = template["state"][name][key]
            if flat not in saved:
                raise UserError(
                    f"{folder}: no saved optimizer state {key} for parameter {name}: the checkpoint is "
                    "of another model or optimizer"
                )
            if list(saved[flat].size) != list(value.shape):
                raise UserError(
                    f"{folder}: the saved optimizer state ({key} of {name}) has shape "
                    f"{list(saved[flat].size)}, the model's parameter {list(value.shape)}: resume with "
                    "the model settings the run was started with (such as the vocab padding)"
                )
    strided = {}  # whole over the tensor-parallel group to load, strided again after (_unstrided)
    for name, values in template["state"].items():
        for key, value in values.items():
            whole = _unstrided(value)
            if whole is not value:
                strided[name, key], values[key] = value.placements, whole
    try:
        with _single_process_is_meant():
            dcp.load(
                {"state": {saved_as[name]: values for name, values in template["state"].items()}},
                storage_reader=reader,
                no_dist=not dist.is_initialized(),
            )
    except (OSError, RuntimeError, ValueError, dcp.api.CheckpointException) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise UserError(
            f"{folder}: cannot load the optimizer state, the files are damaged ({reason}); "
            f"delete {path} to resume from the checkpoint before it"
        ) from None
    for (name, key), placements in strided.items():
        template["state"][name][key] = template["state"][name][key].redistribute(placements=placements)
    # strict=False: parameters that had no state when saved (no gradient yet) have none now either.
    set_optimizer_state_dict(model, optimizer, template, options=StateDictOptions(strict=False))


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles torch.distributed.checkpoint's metadata and nothing else: only the classes such
    metadata is made of may be named, so a crafted file raises instead of running code."""

    ALLOWED = {
        "torch.distributed.checkpoint.metadata": {
            "Metadata",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
            "MetadataIndex",
            "StorageMeta",
            "BytesStorageMetadata",
        },
        "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
        "torch.serialization": {"_get_layout"},
        "torch": {"Size"},
        "pathlib": {"PosixPath", "WindowsPath", "Path"},
        "collections": {"OrderedDict"},
    }

    def find_class(self, module: str, name: str) -> Any:
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if name in self.ALLOWED.get(module, ()) or is_dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


def load_rank_tensors(path: str | os.PathLike, rank: int) -> dict[str, torch.Tensor] | None:
    """The tensors process ``rank`` saved of its own (``save_checkpoint(rank_tensors=...)``), or None if
    it saved none. Every process calls this, together."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    folder = Path(path) / OPTIMIZER_DIR
    reader = _safe_reader(folder)
    prefix = f"rank.{rank}."
    saved = {
        key[len(prefix) :]: meta
        for key, meta in reader.read_metadata().state_dict_metadata.items()
        if key.startswith(prefix)
    }
    template = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype) for key, meta in saved.items()}
    try:
        with _single_process_is_meant():
            dcp.load(
                {"rank": {str(rank): template}} if template else {},
                storage_reader=reader,
                no_dist=not dist.is_initialized(),
            )
    except (OSError, RuntimeError, ValueError, dcp.api.CheckpointException) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise UserError(f"{folder}: cannot load process {rank}'s state, the files are damaged ({reason})") from None
    return template or None


def _safe_reader(folder: Path) -> Any:
    """torch.distributed.checkpoint's FileSystemReader for ``folder``, except that its metadata pickle
    is read through ``_MetadataUnpickler`` and only tensor entries are accepted (a non-tensor entry
    would be unpickled whole by torch). The tensors themselves torch reads with ``weights_only=True``.
    (Made on use: torch.distributed.checkpoint takes most of a second to import.)"""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            file = Path(self.path) / ".metadata"
            try:
                with open(file, "rb") as f:
                    metadata = _MetadataUnpickler(f).load()
            except Exception as e:  # noqa: BLE001 - damaged or crafted: either way one line naming the file
                raise UserError(
                    f"{file}: cannot read the checkpoint metadata, the file is damaged or not ours ({e})"
                ) from None
            if not all(isinstance(m, TensorStorageMetadata) for m in metadata.state_dict_metadata.values()):
                raise UserError(f"{file}: the checkpoint holds entries that are not tensors; it is not ours")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(folder)


def load_training_state(path: str | os.PathLike) -> dict[str, Any]:
    """The training state of a checkpoint directory. Never unpickles code: ``weights_only=True``
    admits tensors and plain containers only, so a crafted file raises instead of running."""
    file = Path(path) / STATE_NAME
    if not file.is_file():
        raise UserError(f"{file} is missing: {path} is not a bertgpu training checkpoint")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated zip, a crafted pickle: the message names the file either way
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"{file}: cannot load the training state, the file is damaged or not ours ({reason}); "
            f"delete {path} to resume from the checkpoint before it"
        ) from None
