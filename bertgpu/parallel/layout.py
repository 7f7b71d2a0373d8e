"""The layout rules: which degrees of parallelism, precisions and options go together.

Every combination that cannot work is refused here, in one line that names the alternative, before
any process starts (and again in each process), for pretrain and finetune alike.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig, accumulation
from ..errors import UserError
from ..training import resolve_precision
from . import launch
from .dims import ParallelDims


def check_layout(cfg: Any, model_config: ModelConfig) -> ParallelDims:
    """The run's degrees of parallelism, every mistake in them a one-line error (before any process
    starts, and again in each process)."""
    dims = ParallelDims(launch.world_size(cfg.run.nproc, cfg.run.device), cfg.parallel.tp, cfg.parallel.strategy)
    dims.check_model(model_config)
    precision = resolve_precision(cfg.run.precision, torch.device(cfg.run.device))
    if precision == "fp16" and (dims.tp > 1 or dims.fsdp):
        raise UserError(
            "--precision fp16 works with --strategy ddp only (its gradient scaler cannot see sharded "
            "gradients): use --precision bf16"
        )
    parallel = cfg.parallel
    if parallel.grad_compression == "powersgd" and (dims.fsdp or dims.tp > 1):
        raise UserError(
            "--grad-compression powersgd works with --strategy ddp without --tp only (FSDP and tensor "
            "parallelism reduce-scatter gradients, which PowerSGD cannot compress): use fp16 or bf16, "
            "the dtype gradients are reduced in"
        )
    if parallel.balance == "auto":
        if dims.dp == 1:
            raise UserError(
                "--balance auto needs at least 2 data-parallel processes: with one there is nothing to balance"
            )
        if dims.fsdp or dims.tp > 1:
            raise UserError(
                "--balance auto works with --strategy ddp without --tp only: FSDP and tensor parallelism "
                "synchronise every layer, so a slow process slows all and cannot be timed alone"
            )
    adapter = getattr(cfg, "adapter", None)  # fine-tuning's LoRA and quantisation
    if adapter is not None and adapter.enabled:
        if dims.tp > 1:
            raise UserError(
                f"--tp {dims.tp} cannot split LoRA's adapted layers; LoRA keeps no gradients or optimizer "
                "state for the frozen encoder, so shard its weights with --strategy fsdp if it does not "
                "fit one device"
            )
        if adapter.quantize and dims.fsdp:
            raise UserError(
                f"--quantize {adapter.quantize} cannot be sharded with --strategy fsdp (FSDP cannot "
                "hold bitsandbytes' 8/4-bit weights): use --strategy ddp, every process holding the "
                "quantised encoder"
            )
    accumulation(cfg.run, dims.dp)  # the batch sizes, and --global-batch, fit this layout
    return dims
