"""The memory a training step will need, estimated before the first one, against what the device has:
the refusal of a batch that will not fit (pretrain and finetune; a warning with --ignore-memory-estimate), in
place of a run that swaps for minutes a step or is killed.

The estimate, per process, in bytes:

- the model's state: its weights as stored, and for each trainable weight an fp32 gradient and AdamW's
  two fp32 moments (4 + 8 bytes), divided among the processes that shard them (FSDP, tensor and
  pipeline parallelism);
- the activations one micro-batch keeps for the backward pass, per encoder layer and token: (8h + 2i +
  2as) elements of the compute precision (4 bytes in fp32, 2 in bf16/fp16) and (2h + as) bytes of
  dropout masks (h: hidden size, i: intermediate size, 3i for ModernBERT's GeGLU, a: heads, s: tokens
  per sequence; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  section 4.1, whose 34h + 5as bytes are this with i = 4h in 16-bit). On CUDA the a·s terms, the
  attention matrices, are left out: SDPA's fused kernels keep none. --activation-checkpointing keeps a
  layer's input (h elements) and recomputes one layer at a time;
- the masked-LM head's fp32 logits over the vocab at each prediction slot, with their log-softmax and
  both gradients at the peak of the backward pass: 16 V bytes per slot (pretraining only; a classifier's
  head is negligible).

Sequences are counted at their longest (--max-seq-length): fine-tuning's batches are padded to their own
longest example, so the estimate is an upper bound there. Measured on 2026-11-27, CPU, fp32, bert-base-
uncased's 30,522-token vocab, 20 slots (`bertgpu pretrain --steps 2 --log-every 1 --batch-size B`, the
growth of the logged peak memory, the resident set, between two batch sizes, per sequence): tiny at 128
tokens 11.8 MiB (estimate 11.9), mini at 128 tokens 23.2 MiB (19.8), mini at 512 tokens 89 MiB (78.3);
the state, tiny's 71 MB, is small beside them. Not measured on a GPU yet. A run is refused only when
the estimate exceeds what the device has: a sign of the order of magnitude, not a precise limit, which
--ignore-memory-estimate overrides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertgpu.models import architectures

GiB = 2**30


def state_bytes(model: torch.nn.Module, shards: int = 1) -> int:
    """Weights as stored, plus an fp32 gradient and AdamW's two fp32 moments per trainable weight."""
    stored = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return (stored + 12 * trainable) // max(shards, 1)


@dataclass(frozen=True)
class Split:
    """How a process holds its part of a step's activations: ``tp`` tensor-parallel ways, ``pp`` pipeline
    stages, and whether each layer keeps only its input (--activation-checkpointing)."""

    tp: int = 1
    pp: int = 1
    activation_checkpointing: bool = False


def activation_bytes(
    config: Any,
    sequences: int,
    seq_length: int,
    precision: str,
    device_type: str,
    *,
    prediction_slots: int = 0,
    split: Split = Split(),
) -> int:
    """What ``sequences`` of ``seq_length`` tokens keep for the backward pass (see the module's docstring):
    the encoder layers of this pipeline stage, split ``tp`` ways where tensor parallelism splits them
    (``split``), and the masked-LM head at ``prediction_slots`` per sequence."""
    tp, pp = split.tp, split.pp
    h, i, a = config.hidden_size, config.intermediate_size, config.num_attention_heads
    s, element = seq_length, 4 if precision == "fp32" else 2
    mlp = architectures.of(config).mlp_widths * i
    matrices = a * s if device_type == "cpu" else 0
    # Whole on every tensor-parallel rank: the inputs of the layer norms, of Wqkv and of the MLP; the rest split.
    per_token = element * (4 * h + (4 * h + mlp + 2 * matrices) / tp) + 2 * h + matrices / tp
    layers = -(-config.num_hidden_layers // pp)
    if split.activation_checkpointing:
        encoder = sequences * s * (layers * element * h + per_token)
    else:
        encoder = sequences * s * layers * per_token
    head = sequences * prediction_slots * 16 * config.vocab_size
    return int(encoder + head)


def available_bytes(device: torch.device) -> int | None:
    """The memory this process can still use: on CUDA the device's free memory plus what this process's
    allocator already holds; on CPU the machine's available memory (MemAvailable: free plus what the
    kernel can reclaim), or its cgroup's remaining limit where that is lower (a container). None: not known."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device)
    if device.type != "cpu":
        return None
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def batch_warning(
    state: int, activations: int, available: int | None, processes: int, batch: str, checkpointing: bool
) -> str | None:
    """One line when ``processes`` processes of ``state`` + ``activations`` bytes each exceed ``available``
    (None: not known, no warning); ``batch`` says what the batch is, for the line."""
    need = state + activations
    if available is None or need * processes <= available:
        return None
    each = f"{processes} processes x " if processes > 1 else ""
    return (
        f"{batch} needs about {each}{need / GiB:.1f} GiB (weights and optimizer state {state / GiB:.1f}, "
        f"activations {activations / GiB:.1f}; an estimate) and only {available / GiB:.1f} GiB is free: the run "
        f"would run out of memory; lower --batch-size (--grad-accum keeps the global batch)"
        + ("" if checkpointing else " or add --activation-checkpointing")
    )
