"""Hugging Face BERT directories: written atomically, read safely.

A directory saved here is what ``transformers`` writes for the same model (``config.json``,
``model.safetensors``, ``vocab.txt``, tokenizer files), so ``from_pretrained`` reads it, and any
Hugging Face BERT directory loads into our models. Weights are read with safetensors only: a
pickle (``pytorch_model.bin``) can run code when loaded. A model whose vocab is padded for speed
(``pad_vocab_multiple``) is saved with its vocab_size real rows and loads such files back. The
weights of a model spread over processes are gathered through
``torch.distributed.checkpoint.state_dict``, which sees through FSDP shards, DTensors and the wrapper
prefixes of DDP, compile and activation checkpointing. (Resumable training checkpoints, which hold
such a directory, are ``checkpoint``'s.)
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from bertgpu import atomic
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.config import EncoderConfig
from bertgpu.training import lora

WEIGHTS_NAME = "model.safetensors"
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def _is_vocab_rows(name: str, model: nn.Module) -> bool:
    """A tensor with one row per vocabulary word (``EncoderModel.vocab_rows``). A model built with
    pad_vocab_multiple has more rows than config.vocab_size; files always hold exactly vocab_size, as
    transformers expects."""
    return name.endswith(model.vocab_rows)


def export_state_dict(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The model's tensors as a Hugging Face BERT stores them: on the CPU, tied aliases dropped
    (safetensors refuses shared tensors; transformers re-ties them), vocab padding cut off.

    ``state`` is the model's full state dict when it was gathered from processes that each hold a
    shard (``full_state_dict``); by default, the model's own.
    """
    model = unwrap(model)
    aliases = model.tied_weights
    vocab_size = _vocab_size(model)
    if state is None:
        state = _local_state_dict(model)
    if lora.is_lora(model):  # the merged classifier, under the plain model's names
        state = lora.merged_state_dict(model, state)
    tensors = {}
    for name, tensor in state.items():
        if name in aliases:
            continue
        if _is_vocab_rows(name, model):
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
        return lora.local_state_dict(unwrap(model)) if is_main() else None
    if unwrap(model).gather_stages is not None:  # pipeline stages (parallel.pipeline): rank 0 holds the first only
        return unwrap(model).gather_stages()
    if not dist.is_initialized():
        return get_model_state_dict(model)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if dist.get_rank() == 0 else None


def _vocab_size(model: nn.Module) -> int:
    """The true vocab size of a model's config (its embedding may be padded)."""
    return model.config.vocab_size


def is_main() -> bool:
    """Whether this process writes what is written once: rank 0, or the only process."""
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _local_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return lora.local_state_dict(model) if lora.is_quantized(model) else model.state_dict()


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
    config: EncoderConfig,
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
    with atomic.directory(out) as tmp:
        write_pretrained(
            model, config, tmp, vocab_path=vocab_path, do_lower_case=do_lower_case, architecture=architecture
        )
    return out


def write_pretrained(
    model: nn.Module,
    config: EncoderConfig,
    directory: Path,
    *,
    vocab_path: str | os.PathLike,
    do_lower_case: bool,
    architecture: str | None = None,
    state: dict[str, torch.Tensor] | None = None,
) -> None:
    """The files of a Hugging Face BERT directory, written into ``directory`` (not atomic by itself).
    ``state``: the model's full state dict, when gathered from processes (``full_state_dict``).
    A LoRA model (``bertgpu.training.lora``) is written merged, with its adapter in PEFT's format in ``adapter/``."""
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
    atomic.write_json(directory / "config.json", config.to_hf_dict(architecture), sort_keys=True)
    shutil.copyfile(vocab_path, directory / "vocab.txt")
    if architectures.of(config).tokenizer_json:  # transformers reads no other tokenizer file of it
        write_fast_tokenizer(directory / "vocab.txt", do_lower_case, directory / "tokenizer.json")
    atomic.write_json(directory / "tokenizer_config.json", tokenizer_config, sort_keys=True)
    atomic.write_json(directory / "special_tokens_map.json", SPECIAL_TOKENS, sort_keys=True)


def write_fast_tokenizer(vocab_path: Path, do_lower_case: bool, path: Path) -> None:
    """The WordPiece vocab as a tokenizers' tokenizer.json (BERT's normalizer, pre-tokenizer, [CLS] ... [SEP]
    post-processing and ## decoding): the ids of bertgpu's own tokenizer."""
    import tokenizers
    from tokenizers import decoders, processors

    from bertgpu.data.tokenizer import Tokenizer

    ours = Tokenizer(vocab_path, do_lower_case)
    backend = tokenizers.Tokenizer.from_str(ours.backend.to_str())
    backend.post_processor = processors.BertProcessing(("[SEP]", ours.sep_id), ("[CLS]", ours.cls_id))
    backend.decoder = decoders.WordPiece()
    path.write_text(backend.to_str(), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Training checkpoints: a Hugging Face directory plus the state to continue training from it.


def _map_key(key: str, model: nn.Module) -> str:
    """A checkpoint key as ``model`` names it: the encoder's prefix added (a bare encoder's file into a model
    with heads) or taken off (a model with heads' file into a bare encoder), and TF-era LayerNorm names."""
    if key.endswith(".gamma"):
        key = key[: -len("gamma")] + "weight"
    elif key.endswith(".beta"):
        key = key[: -len("beta")] + "bias"
    prefix = model.base_prefix
    if prefix and not key.startswith(prefix) and key.startswith(model.bare_names):
        return prefix + key
    if not prefix and model.heads_prefix and key.startswith(model.heads_prefix):
        return key[len(model.heads_prefix) :]
    return key


def check_weights(path: str | os.PathLike) -> None:
    """That the safetensors file ``path`` (or a directory's model.safetensors) opens: its header is whole and its
    tensors lie within the file (safetensors checks both on opening, without reading them), so that a damaged
    file is one line before a run creates anything, not after it made its --out."""
    file = Path(path) / WEIGHTS_NAME if Path(path).is_dir() else Path(path)
    try:
        with safe_open(file, "pt"):
            pass
    except (SafetensorError, OSError) as e:
        raise UserError(f"{file}: cannot read safetensors weights ({e})") from None


def missing_weights(model: nn.Module, path: str | os.PathLike) -> list[str]:
    """The names of ``model``'s tensors that the checkpoint ``path`` (a directory or .safetensors file) lacks, from
    the file's keys alone (no tensor is read): those ``load_weights`` leaves at their initialisation, such as the
    masked-LM head of a sentence encoder (MiniLM ships its encoder alone)."""
    model = unwrap(model)
    file = Path(path) / WEIGHTS_NAME if Path(path).is_dir() else Path(path)
    try:
        with safe_open(file, "pt") as f:
            named = {_map_key(key, model) for key in f.keys()}
    except (SafetensorError, OSError) as e:
        raise UserError(f"{file}: cannot read safetensors weights ({e})") from None
    aliases: dict[str, str] = model.tied_weights
    named |= {source for alias, source in aliases.items() if alias in named}  # as load_weights reads an alias
    return [name for name in model.state_dict() if name not in named and name not in aliases]


def load_weights(model: nn.Module, path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Load a Hugging Face BERT checkpoint (directory or .safetensors file) into ``model``.

    Any BERT checkpoint fits any of our models: a bare encoder into a pretraining or classification
    model, or the encoder of one of those into a bare ``BertModel``. Return ``(missing,
    unexpected)``: missing parameters (heads and pooler only) keep their initialisation;
    unexpected tensors are ignored. Raise UserError when the encoder is incomplete or a shape
    differs. A model with a padded vocab takes the file's vocab_size rows; its padded rows are zero.
    """
    model = unwrap(model)
    vocab_size = _vocab_size(model)
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

    named = {_map_key(key, model): key for key in loaded}
    # A tied alias stands for its source: it fills the source only when the file lacks it.
    aliases: dict[str, str] = model.tied_weights
    for alias, source in aliases.items():
        if alias in named:
            key = named.pop(alias)
            named.setdefault(source, key)
    own = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    unexpected = []
    for name, key in named.items():
        if name.endswith(model.ignored_keys):  # buffers we compute on the fly
            continue
        if name not in own:
            unexpected.append(key)
            continue
        tensor = loaded[key]
        if _is_vocab_rows(name, model) and _fills_padded_rows(tensor, own[name], vocab_size):
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
    required = [k for k in missing if k.startswith(model.encoder_prefixes)]
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
    config = architectures.load_config(path)
    if config_overrides:
        config = dataclasses.replace(config, **config_overrides)
    model = model_cls(config)
    load_weights(model, path)
    return model
