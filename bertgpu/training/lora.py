"""LoRA adapters and 8-/4-bit base weights for fine-tuning (``finetune --lora-rank R --quantize int8|nf4``).

A model transformation, applied to a fine-tuning model (a head on the encoder) whose weights are loaded and before
``parallelize()`` spreads it over the processes (the model's own module knows nothing of it):

1. ``--quantize``: every linear layer of the encoder becomes a bitsandbytes layer holding its frozen
   weight in 8 bits (``Linear8bitLt``, LLM.int8() with outlier threshold 6, as transformers'
   ``load_in_8bit``) or 4 bits (``Linear4bit``, NormalFloat4 with double quantisation, as QLoRA),
   quantised on the spot: the fp32 weight is not kept.
2. LoRA through PEFT itself (``peft.inject_adapter_in_model``): each target layer computes
   ``W x + (alpha / r) B A dropout(x)``, ``A`` and ``B`` trainable, ``B`` starting at zero. The model
   stays our model: PEFT's layers hold the original layer as ``base_layer``, so parameter names
   are PEFT's (``...query.base_layer.weight``, ``...query.lora_A.default.weight``).
3. Everything is frozen but the adapters and the head's modules, trained whole (PEFT's ``modules_to_save``:
   the model's ``head_modules``, such as BERT's ``classifier``, or ``qa_outputs`` of a span head).

Saving (``bertgpu.checkpoints.checkpoint`` asks ``is_lora``): a LoRA model is written as the merged classifier
(``W + (alpha / r) B A`` in fp32, the quantised weights dequantised first, so it computes what the
run evaluated), a plain Hugging Face directory, plus ``adapter/`` in PEFT's own format
(``adapter_config.json``, ``adapter_model.safetensors`` with PEFT's key names, the head saved as a
``modules_to_save`` module), which ``peft.PeftModel.from_pretrained`` loads onto the base model.
Resuming rebuilds the frozen base from ``--model`` and loads the adapter and head from ``adapter/``.

peft and bitsandbytes are optional (``pip install 'bertgpu[lora]'`` / ``'bertgpu[quant]'``); they
are imported only here, and only when asked for.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertgpu.config import AdapterConfig
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.config import EncoderConfig

ADAPTER_DIR = "adapter"
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_NAME = "default"  # PEFT's name for a model's one adapter (in parameter names, not in files)
# PEFT's task type of each fine-tuning head (``EncoderModel.head_kind``): which PeftModel class loads the adapter.
TASK_TYPES = {"sequence": "SEQ_CLS", "token": "TOKEN_CLS", "span": "QUESTION_ANS"}
PEFT_PREFIX = "base_model.model."  # how PEFT's files name a parameter of the model it wraps

# bitsandbytes (imported by peft too) tries, on CPUs with AVX512-BF16, to fetch a 4-bit kernel from the
# Hugging Face hub through the `kernels` package, and logs a warning when it cannot. We never download
# kernels: its own CPU kernels serve, and the warning would only confuse.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def require(cfg: AdapterConfig) -> None:
    """The packages the adapter settings need, or a one-line error saying what to install."""
    if cfg.enabled and importlib.util.find_spec("peft") is None:
        raise UserError("--lora-rank needs the peft package: pip install 'bertgpu[lora]' (or pip install peft)")
    if cfg.quantize:
        try:  # imported, not only looked up: an install that cannot load its library is no install
            _bnb()
        except Exception as e:  # noqa: BLE001 - ImportError, or a broken native library: one line either way
            raise UserError(
                f"--quantize {cfg.quantize} needs the bitsandbytes package: pip install 'bertgpu[quant]' "
                f"(or pip install bitsandbytes); importing it failed: {e}"
            ) from None


def worker_imports(cfg: AdapterConfig) -> tuple[str, ...]:
    """The packages every worker of a run with these settings imports (``require``'s), for the workers' fork server
    to import once: peft with transformers is 2-3 s of CPU a worker."""
    if not cfg.enabled:
        return ()
    return ("peft", "bitsandbytes") if cfg.quantize else ("peft",)


def _bnb():
    import bitsandbytes

    return bitsandbytes


def check(cfg: AdapterConfig, model_config: EncoderConfig, head: str = "sequence") -> list[str]:
    """The adapter settings against the model with the fine-tuning ``head`` (no side effects): every target must
    name linear layers of the encoder, as PEFT matches ``target_modules``. Return the targets."""
    require(cfg)
    choices = ", ".join(architectures.of(model_config).lora_targets)
    if not choices:
        raise UserError("--lora-rank fine-tunes BERT models only; a ModernBERT is fine-tuned whole (leave it out)")
    with torch.device("meta"):
        model = architectures.head_model(model_config, head)
    linear = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    whole = [name for name in linear if _in(name, model.head_modules)]  # the head's: PEFT must not adapt them
    linear = [name for name in linear if name not in whole]
    for target in cfg.targets:
        if named := next((name for name in whole if _matches(name, target)), None):
            raise UserError(
                f"--lora-targets {target}: the {named} head is trained whole with LoRA; targets are the "
                f"encoder's linear layers ({choices})"
            )
        if not any(_matches(name, target) for name in linear):
            raise UserError(
                f"--lora-targets {target}: no linear layer of the model is called that; choose from {choices}"
            )
    return cfg.targets


def _matches(name: str, target: str) -> bool:
    """PEFT's rule for a string in ``target_modules``: the module's name is it, or ends with ``.target``."""
    return name == target or name.endswith("." + target)


def _in(name: str, modules: tuple[str, ...]) -> bool:
    """Whether ``name`` is one of ``modules`` or inside one."""
    return any(name == m or name.startswith(m + ".") for m in modules)


def peft_config(cfg: AdapterConfig, base_model: str | os.PathLike | None = None, head: str = "sequence") -> Any:
    """PEFT's LoraConfig for these settings, the task of the fine-tuning ``head`` (``TASK_TYPES``). The head is
    trained as our own modules (injected, PEFT would keep a frozen copy of them beside trained ones); the saved
    config names them in ``modules_to_save``, where PEFT expects them."""
    import peft

    return peft.LoraConfig(
        task_type=TASK_TYPES[head],
        r=cfg.lora_rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.targets,
        bias="none",
        base_model_name_or_path=str(Path(base_model).resolve()) if base_model else None,
    )


def apply(
    model: nn.Module,
    cfg: AdapterConfig,
    device: torch.device,
    precision: str,
    base_model: str | os.PathLike | None = None,
) -> nn.Module:
    """Quantise (``cfg.quantize``), add the LoRA adapters and freeze all else but the head's modules
    (``head_modules``), in place. ``model`` is a fine-tuning model whose weights are loaded, the same on every
    process; the adapters' initialisation draws from the global RNG (seed it first for the same adapters
    everywhere)."""
    import peft

    if cfg.quantize:
        quantize(model, cfg.quantize, device, precision)
    peft.inject_adapter_in_model(peft_config(cfg, base_model, model.head_kind), model, adapter_name=ADAPTER_NAME)
    for name, p in model.named_parameters():
        p.requires_grad_(_in(name, model.head_modules) or ".lora_" in name)
    return model


def is_lora(model: nn.Module) -> bool:
    """Whether ``apply`` made this model (PEFT leaves its config on the model)."""
    return isinstance(getattr(model, "peft_config", None), dict)


def is_quantized(model: nn.Module) -> bool:
    return getattr(model, "bertgpu_quantized", None) is not None


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters, a quantised weight counted as the matrix it stands for."""
    trainable = total = 0
    for p in model.parameters():
        n = _logical_numel(p)
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


def _logical_numel(p: torch.Tensor) -> int:
    state = getattr(p, "quant_state", None)  # bitsandbytes' 4-bit weights pack two values a byte
    return int(torch.Size(state.shape).numel()) if state is not None else p.numel()


def describe(cfg: AdapterConfig) -> str:
    base = f", {cfg.quantize} base" if cfg.quantize else ""
    return f"LoRA r {cfg.lora_rank} alpha {cfg.alpha:g} dropout {cfg.dropout:g} on {', '.join(cfg.targets)}{base}"


# ---------------------------------------------------------------------------------------------
# 8- and 4-bit base weights


def quantize(model: nn.Module, kind: str, device: torch.device, precision: str) -> None:
    """Replace every nn.Linear of the encoder layers (``encoder_layers()``) by bitsandbytes' 8-bit or 4-bit layer
    holding the same (frozen) weight, quantised on ``device`` at once; biases stay in fp32."""
    bnb = _bnb()
    # LLM.int8() multiplies activations quantised from fp16, and bitsandbytes logs the cast at the first
    # fp32 forward pass: that is the method, not a mistake of the user's.
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    scope = {id(m) for m in model.encoder_layers().modules()}
    for name, module in list(model.named_modules()):
        if not (isinstance(module, nn.Linear) and id(module) in scope):
            continue
        parent_name, _, child = name.rpartition(".")
        weight = module.weight.detach()
        with torch.device("meta"):  # no throw-away initialisation of the new layer's own weight
            if kind == "int8":
                layer = bnb.nn.Linear8bitLt(
                    module.in_features,
                    module.out_features,
                    bias=module.bias is not None,
                    has_fp16_weights=False,
                    threshold=6.0,
                )
            else:
                layer = bnb.nn.Linear4bit(
                    module.in_features,
                    module.out_features,
                    bias=module.bias is not None,
                    compute_dtype=compute,
                    compress_statistics=True,
                    quant_type="nf4",
                )
                # On CPUs with AVX512-BF16, bitsandbytes would repack the weight for a bf16 kernel at the first
                # forward pass without gradients: evaluation would then compute in bf16 what training computes in
                # the compute dtype. One path, the same on every CPU: dequantise and multiply.
                layer.support_avx512bf16_for_cpu = False
        if kind == "int8":
            layer.weight = bnb.nn.Int8Params(weight.to("cpu").clone(), requires_grad=False, has_fp16_weights=False)
        else:
            layer.weight = bnb.nn.Params4bit(
                weight.to("cpu").clone(), requires_grad=False, compress_statistics=True, quant_type="nf4"
            )
        if module.bias is not None:
            layer.bias = nn.Parameter(module.bias.detach().clone(), requires_grad=False)
        model.get_submodule(parent_name).register_module(child, layer.to(device))  # .to quantises
    model.bertgpu_quantized = kind


def dequantized_weight(module: nn.Module) -> torch.Tensor:
    """The fp32 matrix a bitsandbytes linear layer computes with (what its quantised weight stands for)."""
    bnb = _bnb()
    weight = module.weight
    if isinstance(module, bnb.nn.Linear4bit):
        data, state = weight.data, weight.quant_state
        if getattr(state, "packing_format_for_cpu", False):  # repacked for bitsandbytes' CPU inference kernel
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

            data, state = _convert_weight_packed_for_cpu_inverse(data, state)
        return bnb.functional.dequantize_4bit(data, state).float()
    if isinstance(module, bnb.nn.Linear8bitLt):
        scale = weight.SCB if getattr(weight, "SCB", None) is not None else module.state.SCB
        return weight.data.float() * scale.float().unsqueeze(1) / 127.0
    return weight.detach().float()


def local_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under their parameter and buffer names, on the CPU, with every quantised
    weight dequantised to fp32 (bitsandbytes' quantisation-state entries left out). For a model held
    whole by this process: a quantised model is never sharded."""
    bnb = _bnb() if is_quantized(model) else None
    quantized = {
        name
        for name, m in model.named_modules()
        if bnb is not None and isinstance(m, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit))
    }
    state = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        owner = name.rpartition(".")[0]
        if owner in quantized and name.endswith(".weight"):
            tensor = dequantized_weight(model.get_submodule(owner))
        state[name] = tensor.detach().cpu()
    return state


# ---------------------------------------------------------------------------------------------
# Export: the merged classifier, and the adapter in PEFT's format


def _lora_layers(model: nn.Module) -> dict[str, float]:
    """Module name -> scaling (alpha / r) of every layer with a LoRA adapter."""
    return {
        name: float(m.scaling[ADAPTER_NAME])
        for name, m in model.named_modules()
        if isinstance(getattr(m, "scaling", None), dict) and ADAPTER_NAME in m.scaling
    }


def merged_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LoRA model's full state dict (PEFT's names) as the plain classifier's: ``base_layer``
    dropped from the names, and each adapted weight ``W + scaling * B @ A``, computed in fp32."""
    layers = _lora_layers(model)
    merged = {}
    for key, tensor in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        module, _, leaf = key.rpartition(".")
        if module.endswith(".base_layer") and module[: -len(".base_layer")] in layers:
            owner = module[: -len(".base_layer")]
            if leaf == "weight":
                a = state[f"{owner}.lora_A.{ADAPTER_NAME}.weight"].float()
                b = state[f"{owner}.lora_B.{ADAPTER_NAME}.weight"].float()
                tensor = tensor.float() + layers[owner] * (b @ a)
            key = f"{owner}.{leaf}"
        merged[key] = tensor
    return merged


def adapter_tensors(state: dict[str, torch.Tensor], heads: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The adapter and the head's modules ``heads`` as PEFT's ``adapter_model.safetensors`` names them:
    ``base_model.model.`` before the model's own name, the adapter's name (``.default``) left out."""
    tensors = {}
    for key, tensor in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            tensors[PEFT_PREFIX + key.replace(f".{ADAPTER_NAME}.", ".")] = tensor
        elif _in(key, heads):
            tensors[PEFT_PREFIX + key] = tensor
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}


def write_adapter(directory: Path, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``directory`` (created) with ``adapter_config.json`` and ``adapter_model.safetensors``, as
    ``PeftModel.save_pretrained`` writes them."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.peft_config[ADAPTER_NAME])
    config.inference_mode = True  # as PeftModel.save_pretrained saves it
    config.modules_to_save = list(model.head_modules)
    config.save_pretrained(str(directory))
    save_file(adapter_tensors(state, model.head_modules), directory / ADAPTER_WEIGHTS_NAME, metadata={"format": "pt"})


def load_adapter(model: nn.Module, directory: Path) -> None:
    """Load the adapter and head that ``write_adapter`` wrote into a model made by ``apply`` with
    the same settings (a resumed run). Every adapter and head tensor must be there, shaped alike."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = directory / ADAPTER_WEIGHTS_NAME
    try:
        saved = json.loads((directory / ADAPTER_CONFIG_NAME).read_text(encoding="utf-8"))
        loaded = load_file(file)
    except (OSError, ValueError, SafetensorError) as e:
        raise UserError(
            f"{directory}: cannot read the LoRA adapter ({e}); a LoRA run's checkpoint holds it in {ADAPTER_DIR}/"
        ) from None
    config = model.peft_config[ADAPTER_NAME]
    if (saved.get("r"), sorted(saved.get("target_modules") or [])) != (config.r, sorted(config.target_modules)):
        raise UserError(
            f"{directory}: the adapter has rank {saved.get('r')} on {saved.get('target_modules')}, the run "
            f"asks for rank {config.r} on {sorted(config.target_modules)}; resume with the same LoRA flags"
        )
    own = {name: p for name, p in model.named_parameters() if p.requires_grad}
    expected = adapter_tensors(own, model.head_modules)
    names = {PEFT_PREFIX + name.replace(f".{ADAPTER_NAME}.", "."): name for name in own}
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise UserError(f"{file}: {len(missing)} adapter tensor(s) missing (first: {missing[0]})")
    with torch.no_grad():
        for key in expected:
            target, tensor = own[names[key]], loaded[key]
            if tensor.shape != target.shape:
                raise UserError(f"{file}: {key} has shape {list(tensor.shape)}, the model's {list(target.shape)}")
            target.copy_(tensor)
