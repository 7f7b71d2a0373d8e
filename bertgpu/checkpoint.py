"""Checkpoints on disk: Hugging Face BERT directories, written atomically.

A directory saved here is what ``transformers`` writes for the same model (``config.json``,
``model.safetensors``, ``vocab.txt``, tokenizer files), so ``from_pretrained`` reads it, and any
Hugging Face BERT directory loads into our models. Weights are read with safetensors only: a
pickle (``pytorch_model.bin``) can run code when loaded. A model whose vocab is padded for speed
(``pad_vocab_multiple``) is saved with its vocab_size real rows and loads such files back.

A training checkpoint is such a directory plus what it takes to continue: the optimizer's
per-parameter state through ``torch.distributed.checkpoint`` (each process writes the shard it
holds, and a resume on another layout reads what it needs), and the plain values of the run
(data position, RNGs, scaler) in ``training_state.pt``. Model and optimizer state are taken
through ``torch.distributed.checkpoint.state_dict`` on every process, which sees through FSDP
shards, DTensors and the wrapper prefixes of DDP, compile and activation checkpointing: this
module is the one place that handles them. Nothing read back can run code: safetensors for the
weights, ``torch.load(weights_only=True)`` for the state, and an allow-list for the metadata pickle
of torch.distributed.checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import re
import secrets
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from . import lora
from .config import ModelConfig
from .errors import UserError

WEIGHTS_NAME = "model.safetensors"
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
# Buffers some transformers versions saved beside the weights; we compute them on the fly.
_IGNORED_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# Tensors with one row per vocabulary word. A model built with pad_vocab_multiple has more rows
# than config.vocab_size; files always hold exactly vocab_size, as transformers expects.
_VOCAB_ROWS = (
    "embeddings.word_embeddings.weight",
    "predictions.bias",
    "predictions.decoder.weight",
    "predictions.decoder.bias",
)


def _is_vocab_rows(name: str) -> bool:
    return name.endswith(_VOCAB_ROWS)


def export_state_dict(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The model's tensors as a Hugging Face BERT stores them: on the CPU, tied aliases dropped
    (safetensors refuses shared tensors; transformers re-ties them), vocab padding cut off.

    ``state`` is the model's full state dict when it was gathered from processes that each hold a
    shard (``full_state_dict``); by default, the model's own.
    """
    model = unwrap(model)
    aliases = getattr(model, "tied_weights", {})
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    if state is None:
        state = _local_state_dict(model)
    if lora.is_lora(model):  # the merged classifier, under the plain model's names
        state = lora.merged_state_dict(model, state)
    tensors = {}
    for name, tensor in state.items():
        if name in aliases:
            continue
        if vocab_size is not None and _is_vocab_rows(name):
            tensor = tensor[:vocab_size]
        tensors[name] = tensor.detach().cpu().contiguous()
    return tensors


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The model's whole state dict on the CPU of rank 0 (``None`` on the other ranks).

    Every process must call it: FSDP and tensor-parallel parameters are gathered from their shards.
    Names are the plain model's, whatever wraps it (DDP, compile, activation checkpointing).
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if lora.is_quantized(unwrap(model)):  # bitsandbytes' weights: never sharded, dequantised here
        return lora.local_state_dict(unwrap(model)) if _is_main() else None
    if not dist.is_initialized():
        return get_model_state_dict(model)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if dist.get_rank() == 0 else None


def _local_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return lora.local_state_dict(model) if lora.is_quantized(model) else model.state_dict()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_directory(final_path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory that becomes ``final_path`` only if the block succeeds.

    A crash or exception at any point leaves ``final_path`` either absent or holding its previous
    complete contents: never a half-written checkpoint that a resume would trust.
    """
    final = Path(final_path)
    tmp = new_temporary(final)
    try:
        yield tmp
        commit(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def new_temporary(final: Path) -> Path:
    """A new, empty, hidden sibling of ``final`` to build it in (``.NAME.tmp-*``: never taken as complete)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


def commit(tmp: Path, final: Path) -> None:
    """Make the complete directory ``tmp`` into ``final``: every file fsynced, then renamed, the
    previous ``final`` (if any) moved aside first and removed last."""
    parent = final.parent
    for root, _dirs, files in os.walk(tmp):
        for name in files:
            _fsync(Path(root, name))
        _fsync(Path(root))
    if final.exists():
        old = parent / f".{final.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(final, old)
        try:
            os.rename(tmp, final)
        except BaseException:
            os.rename(old, final)
            raise
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    _fsync(parent)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DistributedDataParallel (``.module``) and torch.compile (``._orig_mod``)."""
    while True:
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            return model


def save_pretrained(
    model: nn.Module,
    config: ModelConfig,
    out_dir: str | os.PathLike,
    *,
    vocab_path: str | os.PathLike,
    do_lower_case: bool,
    architecture: str | None = None,
) -> Path:
    """Write a Hugging Face BERT directory of a model in this process, atomically; return its path.

    ``architecture`` (config.json's ``architectures``) defaults to the model's class name, which
    is the transformers class with the same parameters. (A model spread over processes is saved
    with ``save_model_dir``, which every process calls.)
    """
    out = Path(out_dir)
    with atomic_directory(out) as tmp:
        write_pretrained(
            model, config, tmp, vocab_path=vocab_path, do_lower_case=do_lower_case, architecture=architecture
        )
    return out


def write_pretrained(
    model: nn.Module,
    config: ModelConfig,
    directory: Path,
    *,
    vocab_path: str | os.PathLike,
    do_lower_case: bool,
    architecture: str | None = None,
    state: dict[str, torch.Tensor] | None = None,
) -> None:
    """The files of a Hugging Face BERT directory, written into ``directory`` (not atomic by itself).
    ``state``: the model's full state dict, when gathered from processes (``full_state_dict``).
    A LoRA model (``bertgpu.lora``) is written merged, with its adapter in PEFT's format in ``adapter/``."""
    model = unwrap(model)
    architecture = architecture or type(model).__name__.removeprefix("FSDP")
    if state is None:
        state = _local_state_dict(model)
    tensors = export_state_dict(model, state)
    if lora.is_lora(model):
        lora.write_adapter(directory / lora.ADAPTER_DIR, model, state)
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": do_lower_case,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": config.max_position_embeddings,
        **SPECIAL_TOKENS,
    }
    save_file(tensors, directory / WEIGHTS_NAME, metadata={"format": "pt"})
    _write_json(directory / "config.json", config.to_hf_dict(architecture))
    shutil.copyfile(vocab_path, directory / "vocab.txt")
    _write_json(directory / "tokenizer_config.json", tokenizer_config)
    _write_json(directory / "special_tokens_map.json", SPECIAL_TOKENS)


# ---------------------------------------------------------------------------------------------
# Training checkpoints: a Hugging Face directory plus the state to continue training from it.

STATE_NAME = "training_state.pt"  # plain values: data position, RNGs, scaler, records (rank 0)
OPTIMIZER_DIR = "optimizer"  # the optimizer's per-parameter tensors: torch.distributed.checkpoint, a file per process
CARD_NAME = "README.md"  # the model card (bertgpu.model_card)
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


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_config: ModelConfig,
    state: dict[str, Any],
    run_config: Any,
    *,
    vocab_path: str | os.PathLike,
    do_lower_case: bool,
    keep: int,
    architecture: str | None = None,
    rank_tensors: dict[str, torch.Tensor] | None = None,
    card: str | None = None,
) -> Path:
    """Write the resumable checkpoint ``run_dir/checkpoints/step-NNNNNNN`` atomically and keep the
    newest ``keep``. Every process calls this, together; ``rank_tensors`` is state of this process's
    own (PowerSGD's error feedback), saved beside its optimizer shard (``load_rank_tensors``).

    The directory is a Hugging Face BERT directory that transformers loads as it is (the weights
    gathered from every process's shard, written by rank 0); beside the weights lie the optimizer
    state (``optimizer/``, each process writing its own shard), the plain training state (``state``:
    tensors and plain values only, read back with ``torch.load(weights_only=True)``) and the run's
    config. If the write fails (a full disk), the previous checkpoint stays the latest and nothing
    half-written remains.
    """
    path = Path(run_dir) / "checkpoints" / f"step-{step:07d}"
    previous = latest_checkpoint(run_dir)

    def write(tmp: Path, weights: dict[str, torch.Tensor]) -> None:
        write_pretrained(
            model,
            model_config,
            tmp,
            vocab_path=vocab_path,
            do_lower_case=do_lower_case,
            architecture=architecture,
            state=weights,
        )
        torch.save({"step": step, **state}, tmp / STATE_NAME)
        _write_json(tmp / RUN_CONFIG_NAME, {"step": step, "config": dataclasses.asdict(run_config)})
        if card:
            (tmp / CARD_NAME).write_text(card, encoding="utf-8")

    kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
    _save_collectively(path, model, write, optimizer, kept, rank_tensors)
    if _is_main():
        for old in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    return path


def save_model_dir(
    path: Path,
    model: nn.Module,
    model_config: ModelConfig,
    *,
    vocab_path: str | os.PathLike,
    do_lower_case: bool,
    architecture: str | None = None,
    json_files: dict[str, Any] | None = None,
    card: str | None = None,
) -> Path:
    """Write a Hugging Face BERT directory of a model spread over processes, atomically (every
    process calls this; rank 0 writes), with more JSON files beside the weights."""

    def write(tmp: Path, weights: dict[str, torch.Tensor]) -> None:
        write_pretrained(
            model,
            model_config,
            tmp,
            vocab_path=vocab_path,
            do_lower_case=do_lower_case,
            architecture=architecture,
            state=weights,
        )
        for name, obj in (json_files or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        if card:
            (tmp / CARD_NAME).write_text(card, encoding="utf-8")

    _save_collectively(Path(path), model, write, None, "nothing was replaced")
    return Path(path)


def _is_main() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


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

    from .parallel import launch

    weights = full_state_dict(model)
    tensors = optimizer_tensors(model, optimizer) if optimizer is not None else None
    if tensors is not None and rank_tensors:
        tensors["rank"] = {str(dist.get_rank() if dist.is_initialized() else 0): rank_tensors}
    is_main = _is_main()
    reason = ""
    tmp = new_temporary(final) if is_main else None
    tmp = launch.broadcast_object(tmp)
    try:
        if tensors is not None:
            with _single_process_is_meant():
                dcp.save(
                    tensors, storage_writer=dcp.FileSystemWriter(tmp / OPTIMIZER_DIR), no_dist=not dist.is_initialized()
                )
        if is_main:
            write(tmp, weights)
    except (OSError, SafetensorError, RuntimeError, dcp.api.CheckpointException) as e:
        # safetensors, torch.save and torch.distributed.checkpoint wrap the OS's write errors
        reason = getattr(e, "strerror", None) or (str(e).strip().splitlines() or [type(e).__name__])[-1]
    reasons = launch.all_gather_object(reason) if dist.is_initialized() else [reason]
    failed = [r for r in reasons if r]
    if is_main:
        if failed:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            commit(tmp, final)
    launch.barrier()
    if failed:
        raise UserError(f"could not write checkpoint {final} ({failed[0]}); {kept}")


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
    for name, values in state.items():
        for key, value in values.items():
            if not torch.is_tensor(value):
                raise TypeError(f"optimizer state {name}.{key} is a {type(value).__name__}, not a tensor")
    return {"state": state}


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
    for name in list(template["state"]):
        keys = {key: f"state.{name}.{key}" for key in template["state"][name]}
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
    try:
        with _single_process_is_meant():
            dcp.load({"state": template["state"]}, storage_reader=reader, no_dist=not dist.is_initialized())
    except (OSError, RuntimeError, ValueError, dcp.api.CheckpointException) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise UserError(
            f"{folder}: cannot load the optimizer state, the files are damaged ({reason}); "
            f"delete {path} to resume from the checkpoint before it"
        ) from None
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


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _map_key(key: str, target_has_bert: bool) -> str:
    """A checkpoint key as our model names it: fix the ``bert.`` prefix and TF-era LayerNorm names."""
    if key.endswith(".gamma"):
        key = key[: -len("gamma")] + "weight"
    elif key.endswith(".beta"):
        key = key[: -len("beta")] + "bias"
    has_bert = key.startswith("bert.")
    if target_has_bert and not has_bert and key.startswith(("embeddings.", "encoder.", "pooler.")):
        return "bert." + key
    if not target_has_bert and has_bert:
        return key[len("bert.") :]
    return key


def load_weights(model: nn.Module, path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Load a Hugging Face BERT checkpoint (directory or .safetensors file) into ``model``.

    Any BERT checkpoint fits any of our models: a bare encoder into a pretraining or classification
    model, or the encoder of one of those into a bare ``BertModel``. Return ``(missing,
    unexpected)``: missing parameters (heads and pooler only) keep their initialisation;
    unexpected tensors are ignored. Raise UserError when the encoder is incomplete or a shape
    differs. A model with a padded vocab takes the file's vocab_size rows; its padded rows are zero.
    """
    model = unwrap(model)
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    path = Path(path)
    file = path / WEIGHTS_NAME if path.is_dir() else path
    if not file.is_file():
        if (path / "pytorch_model.bin").is_file():
            raise UserError(
                f"{path} holds only pytorch_model.bin, a pickle that can run code when loaded; "
                "convert it to model.safetensors first (in transformers: from_pretrained, then save_pretrained)"
            )
        raise UserError(f"no {WEIGHTS_NAME} in {path}")
    try:
        loaded = load_file(file)
    except (SafetensorError, OSError) as e:
        raise UserError(f"{file}: cannot read safetensors weights ({e})") from None

    target_has_bert = isinstance(getattr(model, "bert", None), nn.Module)
    named = {_map_key(key, target_has_bert): key for key in loaded}
    # A tied alias stands for its source: it fills the source only when the file lacks it.
    aliases: dict[str, str] = getattr(model, "tied_weights", {})
    for alias, source in aliases.items():
        if alias in named:
            key = named.pop(alias)
            named.setdefault(source, key)
    own = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    unexpected = []
    for name, key in named.items():
        if name.endswith(_IGNORED_BUFFERS):
            continue
        if name not in own:
            unexpected.append(key)
            continue
        tensor = loaded[key]
        if _is_vocab_rows(name) and _fills_padded_rows(tensor, own[name], vocab_size):
            padded = torch.zeros(own[name].shape, dtype=tensor.dtype)  # padded rows stay zero
            padded[:vocab_size] = tensor
            tensor = padded
        if tensor.shape != own[name].shape:
            raise UserError(
                f"{file}: tensor {key} has shape {list(tensor.shape)}, the model expects {list(own[name].shape)} "
                f"for {name} (does config.json match these weights?)"
            )
        state[name] = tensor

    missing = [k for k in own if k not in state and k not in aliases]
    encoder_prefix = "bert." if target_has_bert else ""
    required = [k for k in missing if k.startswith((encoder_prefix + "embeddings.", encoder_prefix + "encoder."))]
    if required:
        raise UserError(
            f"{file}: not a checkpoint for this model, {len(required)} encoder weights missing (first: {required[0]})"
        )
    # Copies in place, so tied parameters stay one tensor.
    model.load_state_dict(state, strict=False)
    return missing, unexpected


def _fills_padded_rows(tensor: torch.Tensor, own: torch.Tensor, vocab_size: int | None) -> bool:
    """A file's vocab_size rows for a model whose vocab is padded past vocab_size."""
    return vocab_size is not None and tensor.shape[0] == vocab_size < own.shape[0] and tensor.shape[1:] == own.shape[1:]


def load_pretrained(
    path: str | os.PathLike, model_cls: type[nn.Module], config_overrides: dict[str, Any] | None = None
) -> nn.Module:
    """Build ``model_cls`` from the directory's config.json (with overrides) and load its weights."""
    config = ModelConfig.load(path)
    if config_overrides:
        config = dataclasses.replace(config, **config_overrides)
    model = model_cls(config)
    load_weights(model, path)
    return model
