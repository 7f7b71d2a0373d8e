"""Checkpoints on disk: Hugging Face BERT directories, written atomically.

A directory saved here is what ``transformers`` writes for the same model (``config.json``,
``model.safetensors``, ``vocab.txt``, tokenizer files), so ``from_pretrained`` reads it, and any
Hugging Face BERT directory loads into our models. Weights are read with safetensors only: a
pickle (``pytorch_model.bin``) can run code when loaded. A model whose vocab is padded for speed
(``pad_vocab_multiple``) is saved with its vocab_size real rows and loads such files back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

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
_VOCAB_ROWS = ("embeddings.word_embeddings.weight", "predictions.bias", "predictions.decoder.weight",
               "predictions.decoder.bias")


def _is_vocab_rows(name: str) -> bool:
    return name.endswith(_VOCAB_ROWS)


def export_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors as a Hugging Face BERT stores them: on the CPU, tied aliases dropped
    (safetensors refuses shared tensors; transformers re-ties them), vocab padding cut off."""
    model = unwrap(model)
    aliases = getattr(model, "tied_weights", {})
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name in aliases:
            continue
        if vocab_size is not None and _is_vocab_rows(name):
            tensor = tensor[:vocab_size]
        tensors[name] = tensor.detach().cpu().contiguous()
    return tensors


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
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        for root, dirs, files in os.walk(tmp):
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
    """Write a Hugging Face BERT directory, atomically; return its path.

    ``architecture`` (config.json's ``architectures``) defaults to the model's class name, which
    is the transformers class with the same parameters.
    """
    out = Path(out_dir)
    with atomic_directory(out) as tmp:
        write_pretrained(model, config, tmp, vocab_path=vocab_path, do_lower_case=do_lower_case,
                         architecture=architecture)
    return out


def write_pretrained(
    model: nn.Module,
    config: ModelConfig,
    directory: Path,
    *,
    vocab_path: str | os.PathLike,
    do_lower_case: bool,
    architecture: str | None = None,
) -> None:
    """The files of a Hugging Face BERT directory, written into ``directory`` (not atomic by itself)."""
    model = unwrap(model)
    architecture = architecture or type(model).__name__
    tensors = export_state_dict(model)
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

STATE_NAME = "training_state.pt"  # optimizer, schedule, scaler, RNGs, data position: tensors and plain values
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
    model_config: ModelConfig,
    state: dict[str, Any],
    run_config: Any,
    *,
    vocab_path: str | os.PathLike,
    do_lower_case: bool,
    keep: int,
) -> Path:
    """Write ``run_dir/checkpoints/step-NNNNNNN`` atomically and keep the newest ``keep``.

    The directory is a Hugging Face BERT directory that transformers loads as it is; beside the
    weights lie the training state (``state``: tensors and plain values only, read back with
    ``torch.load(weights_only=True)``) and the run's config. If the write fails (a full disk), the
    previous checkpoint stays the latest and nothing half-written remains.
    """
    path = Path(run_dir) / "checkpoints" / f"step-{step:07d}"
    previous = latest_checkpoint(run_dir)
    try:
        with atomic_directory(path) as tmp:
            write_pretrained(model, model_config, tmp, vocab_path=vocab_path, do_lower_case=do_lower_case)
            torch.save({"step": step, **state}, tmp / STATE_NAME)
            _write_json(tmp / RUN_CONFIG_NAME, {"step": step, "config": dataclasses.asdict(run_config)})
    except (OSError, SafetensorError, RuntimeError) as e:  # safetensors and torch.save wrap write errors
        reason = getattr(e, "strerror", None) or str(e).strip().splitlines()[-1]
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        raise UserError(f"could not write checkpoint {path} ({reason}); {kept}") from None
    for old in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return path


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
        raise UserError(f"{file}: cannot load the training state, the file is damaged or not ours ({reason}); "
                        f"delete {path} to resume from the checkpoint before it") from None


def check_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any], path: str | os.PathLike) -> None:
    """Refuse a saved optimizer state whose tensors do not fit the model's parameters, as after a
    resume with another vocab padding: torch's ``load_state_dict`` does not compare shapes, and the
    next step would fail with an obscure kernel error. Call before ``optimizer.load_state_dict``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, state in saved["state"].items():
        if index >= len(params):
            continue  # a different parameter count: load_state_dict itself says so
        for key, value in state.items():
            if torch.is_tensor(value) and value.ndim > 0 and value.shape != params[index].shape:
                raise UserError(
                    f"{path}: the saved optimizer state ({key} of parameter {index}) has shape {list(value.shape)}, "
                    f"the model's parameter {list(params[index].shape)}: resume with the model settings the run "
                    "was started with (such as the vocab padding)"
                )


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
