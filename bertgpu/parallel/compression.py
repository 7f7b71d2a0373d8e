"""Gradient compression between the data-parallel processes: DDP's communication hooks, FSDP's reduce dtype.

``--grad-compression``:

- ``fp16`` / ``bf16``: each gradient bucket is cast to half precision, all-reduced, and cast back
  (torch's ``fp16_compress_hook`` / ``bf16_compress_hook``): half the bytes, ~3 decimal digits kept.
- ``powersgd``: PowerSGD (Vogels et al. 2019, torch's ``powerSGD_hook``): each gradient matrix is
  all-reduced as two rank-r factors P and Q, with error feedback (what compression lost is added to
  the next step's gradient) and warm start; the first ``warmup`` steps all-reduce uncompressed, as its
  authors recommend. Vectors (biases, LayerNorm) and matrices too small to gain go uncompressed.
- Under FSDP (and ``ddp`` under tensor parallelism, which runs on fully_shard too) gradients are
  reduce-scattered, not all-reduced through DDP's hooks: ``fp16``/``bf16`` are FSDP's reduce dtype,
  and PowerSGD is not available.

PowerSGD's state (error feedback, warm-start factors, its step and RNG) is per process and per DDP
bucket; ``state_tensors``/``load_state_tensors`` turn it into tensors for a checkpoint and back.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
MIN_COMPRESSION_RATE = 2  # torch's default: a matrix is compressed when that divides its bytes by 2 or more


@dataclass(frozen=True)
class Compression:
    kind: str = "none"
    rank: int = 4  # PowerSGD's matrix approximation rank
    warmup: int = 2  # PowerSGD: optimizer steps of uncompressed all-reduce first (at least 2)

    @property
    def dtype(self) -> torch.dtype | None:
        return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.kind)


def register(
    ddp: torch.nn.parallel.DistributedDataParallel, compression: Compression, group, seed: int
) -> tuple[object | None, list[bool]]:
    """Register the compression's communication hook on ``ddp``; return PowerSGD's state (or None) and
    the hook's mute switch (a one-element list).

    The hook is wrapped so that it can be muted for one silent step (``ParallelModel.settle_buckets``):
    a muted hook hands the local gradients back without communicating.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    state = None
    if compression.kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=compression.rank,
            start_powerSGD_iter=max(2, compression.warmup),
            min_compression_rate=MIN_COMPRESSION_RATE,
            use_error_feedback=True,
            warm_start=True,
            random_seed=seed,
        )
        inner = powerSGD_hook.powerSGD_hook
    elif compression.kind == "fp16":
        inner = default_hooks.fp16_compress_hook
    elif compression.kind == "bf16":
        if torch.cuda.is_available() and ddp.device_ids:
            inner = default_hooks.bf16_compress_hook
        else:  # torch's bf16 hook insists on NCCL; the same cast-reduce-cast under gloo

            def inner(process_group, bucket):
                return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)
    else:
        return None, [False]
    mute = [False]
    # Under gloo a hook's futures complete on gloo's own threads, and PowerSGD issues its next all-reduce
    # (Q after P) from there, while the backward pass hands over the next bucket: the processes could
    # issue collectives in different orders. So on the CPU each bucket's exchange is finished before the
    # next begins (no overlap; NCCL issues everything in order from the backward pass and keeps it).
    sequential = compression.kind == "powersgd" and not ddp.device_ids

    def compressed(hook_state, bucket):
        if mute[0]:
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future
        future = inner(hook_state, bucket)
        if sequential:
            future.wait()
        return future

    # Not torch's own names: DDP refuses a hook named bf16_compress_hook without NCCL.
    compressed.__name__ = compressed.__qualname__ = f"bertgpu_{compression.kind}_hook"
    ddp.register_comm_hook(state if state is not None else group, compressed)
    return state, mute


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a DTensor, without importing DTensor (0.5 s of CPU) into a process that has none, such as
    the launcher: none exists before torch.distributed.tensor is imported."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def bytes_per_step(parameters: list[torch.Tensor], compression: Compression, *, fsdp: bool, step: int, dp: int) -> int:
    """The bytes of gradient each process hands to the data-parallel collective in one optimizer step
    (the all-reduce's or reduce-scatter's input; a ring moves about twice that over each link).

    ``parameters``: the trainable parameters as this process holds them (a tensor-parallel shard
    counts its local part). PowerSGD sends P (rows x r) and Q (cols x r) in fp32 for each matrix it
    compresses and the rest uncompressed, from step ``warmup`` on.
    """
    if dp == 1:
        return 0
    total = 0
    powersgd_on = compression.kind == "powersgd" and step > max(2, compression.warmup)
    for p in parameters:
        shape = p.to_local().shape if is_dtensor(p) and not fsdp else p.shape
        numel = int(np.prod(shape)) if len(shape) else 1
        if compression.dtype is not None:
            total += numel * 2
        elif powersgd_on and len(shape) > 1:
            rows, cols = shape[0], numel // shape[0]
            compressed = (rows + cols) * compression.rank
            total += 4 * (compressed if rows * cols >= MIN_COMPRESSION_RATE * compressed else numel)
        else:
            total += numel * 4
    return total


def state_tensors(state) -> dict[str, torch.Tensor]:
    """PowerSGD's state as tensors: the error feedback and warm-start factors of every bucket, its step
    count, its RNG and its statistics."""
    name, keys, pos, has_gauss, cached = state.rng.get_state()
    tensors = {
        "iter": torch.tensor(state.iter),
        "rng_keys": torch.from_numpy(keys.astype(np.int64)),
        "rng_pos": torch.tensor([pos, has_gauss]),
        "rng_gauss": torch.tensor(cached, dtype=torch.float64),
        "numel": torch.tensor(
            [state.total_numel_before_compression, state.total_numel_after_compression, state.next_stats_report]
        ),
    }
    for kind, table in (("error", state.error_dict), ("p", state.p_memory_dict), ("q", state.q_memory_dict)):
        for bucket, tensor in table.items():
            tensors[f"{kind}.{bucket}"] = tensor
    return tensors


def load_state_tensors(state, tensors: dict[str, torch.Tensor]) -> None:
    """The inverse of ``state_tensors``, into a fresh PowerSGD state."""
    state.iter = int(tensors["iter"])
    pos, has_gauss = (int(v) for v in tensors["rng_pos"])
    state.rng.set_state(
        ("MT19937", tensors["rng_keys"].numpy().astype(np.uint32), pos, has_gauss, float(tensors["rng_gauss"]))
    )
    before, after, report = (int(v) for v in tensors["numel"])
    state.total_numel_before_compression, state.total_numel_after_compression = before, after
    state.next_stats_report = report
    for kind, table in (("error", state.error_dict), ("p", state.p_memory_dict), ("q", state.q_memory_dict)):
        table.clear()
        for key, tensor in tensors.items():
            if key.startswith(kind + "."):
                table[int(key.split(".", 1)[1])] = tensor


def describe(compression: Compression) -> str:
    if compression.kind == "powersgd":
        return f"powersgd rank {compression.rank} after {max(2, compression.warmup)} steps"
    return compression.kind
