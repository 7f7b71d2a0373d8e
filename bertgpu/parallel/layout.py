"""The layout rules: which degrees of parallelism, precisions and options go together.

Every combination that cannot work is refused here, in one line that names the alternative, before
any process starts (and again in each process), for pretrain and finetune alike.
"""

from __future__ import annotations

import os

import torch

from bertgpu.config import AdapterConfig, TrainingConfig
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.config import EncoderConfig
from bertgpu.parallel import launch
from bertgpu.parallel.dims import ParallelDims
from bertgpu.parallel.pipeline import check_stages
from bertgpu.training.batch import accumulation
from bertgpu.training.precision import resolve_precision


def check_layout(
    cfg: TrainingConfig, model_config: EncoderConfig, *, adapter: AdapterConfig | None = None, cpu_bf16: bool = False
) -> ParallelDims:
    """The run's degrees of parallelism, every mistake in them a one-line error (before any process
    starts, and again in each process). What is a task's own: fine-tuning's ``adapter`` (LoRA and
    quantisation), and pretraining's --recipe fast (``cpu_bf16``: bf16 on CPUs that compute it natively)."""
    parallel = cfg.parallel
    dims = ParallelDims(launch.world_size(cfg.run.nproc, cfg.run.device), parallel.tp, parallel.strategy, parallel.pp)
    dims.check_model(model_config)
    arch = architectures.of(model_config)
    if arch.tp_fused:
        from bertgpu.parallel import fused_tp  # here: it imports DTensor (0.5 s), which a launcher never needs

        fused_tp.check_layout(dims, model_config, f"a {arch.title}'s {arch.tp_fused}")
    precision = resolve_precision(cfg.run.precision, torch.device(cfg.run.device), cpu_bf16=cpu_bf16)
    if dims.pp > 1:
        check_pipeline(cfg, model_config, precision, adapter)
    if precision == "fp16" and (dims.tp > 1 or dims.fsdp):
        raise UserError(
            "--precision fp16 works with --strategy ddp only (its gradient scaler cannot see sharded "
            "gradients): use --precision bf16"
        )
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
    sizes, _ = accumulation(cfg.run, dims.dp)  # the batch sizes, and --global-batch, fit this layout
    if dims.pp > 1 and any(size % parallel.microbatches for size in sizes):
        raise UserError(
            f"--pp-microbatches {parallel.microbatches} does not divide the batch size per data-parallel rank "
            f"({', '.join(map(str, sorted(set(sizes))))}): each step's batch is split into that many equal parts"
        )
    return dims


def cpu_oversubscription(cfg: TrainingConfig) -> str | None:
    """A warning (one line, or None) when a CPU run starts more processes on this machine than it has cores:
    each process then gets a fraction of a core, and all of them wait on the slowest at every step, so
    the run is slower than with one process per core (each process already uses its share of the cores'
    threads: launch.cpu_threads). The cores are those this process may run on (a container's or
    taskset's share)."""
    if cfg.run.device != "cpu":
        return None
    if launch.launched_externally():  # a torchrun worker: its machine's processes are torchrun's
        local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        how = f"torchrun starts {local} processes on this machine"
    else:
        local = launch.resolve_nproc(cfg.run.nproc, cfg.run.device)
        how = f"--nproc {local} starts {local} processes"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if local <= cores:
        return None
    return (
        f"{how} on {cores} CPU core(s): each gets less than a core and they wait on each other at every step; "
        f"use --nproc {cores} at most (--grad-accum keeps the global batch)"
    )


def check_pipeline(
    cfg: TrainingConfig, model_config: EncoderConfig, precision: str, adapter: AdapterConfig | None = None
) -> None:
    """What pipeline parallelism does not compose with yet, each refused with the alternative."""
    parallel = cfg.parallel
    check_stages(model_config.num_hidden_layers, parallel.pp, parallel.stages_per_rank)
    if parallel.pp_schedule != "gpipe" and parallel.microbatches < parallel.pp:
        raise UserError(
            f"--pp-schedule {parallel.pp_schedule} needs at least as many micro-batches as --pp {parallel.pp} "
            f"(--pp-microbatches {parallel.microbatches}): raise it, or use --pp-schedule gpipe"
        )
    if precision == "fp16":
        raise UserError(
            "--precision fp16 does not work with --pp (its loss scaler cannot see the other stages' gradients): "
            "use --precision bf16"
        )
    if parallel.grad_compression == "powersgd":
        raise UserError("--grad-compression powersgd does not work with --pp: use fp16 or bf16")
    if parallel.balance == "auto":
        raise UserError("--balance auto does not work with --pp (the stages of a step wait on each other): drop it")
    if adapter is not None and adapter.enabled:
        raise UserError(
            "--lora-rank and --quantize do not work with --pp: shard the frozen encoder with --strategy fsdp"
        )
