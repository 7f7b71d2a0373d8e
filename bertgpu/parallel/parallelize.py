"""``parallelize()``: spread a BERT over the processes of a ``ParallelDims``.

The order is torchtitan's, and each step composes with the ones before it:

1. **Tensor parallel** (``--tp``), through DTensor's ``parallelize_module``: in every encoder layer,
   Q, K, V and the FFN's first matmul column-wise (each process computes its own heads and its
   slice of the intermediate width), the attention output and the FFN's second matmul row-wise
   (partial sums, all-reduced). Embeddings, LayerNorms, pooler and heads stay whole on every
   process of the group, which computes them identically.
2. **Activation checkpointing** (``--activation-checkpointing``): each encoder layer keeps only its
   input and recomputes the rest in the backward pass (dropout masks included: the RNG state is
   replayed).
3. **Compile** (``--compile``): with one process (no data, tensor or pipeline parallelism, no activation
   checkpointing) the whole
   forward half of a step (embeddings, encoder, gathered heads and loss: the task's objective
   function) as one graph (``WholeModel.forward_backward_objective``), on a GPU replayed as CUDA graphs
   (``mode="reduce-overhead"``) where ``cuda_graphs``; with several, each encoder layer through
   ``torch.compile``, in place, so that parameter names do not change and DDP/FSDP/DTensor see the
   modules they wrap.
4. **Data parallel**: FSDP2's ``fully_shard`` per encoder layer and at the root (embeddings, pooler
   and heads, so the tied embedding/decoder is one unit), bf16 parameters with fp32 gradient
   reduction under bf16; or DistributedDataParallel over the data-parallel group. Under tensor
   parallelism ``ddp`` is ``fully_shard`` over a replicate-only mesh, which holds DTensor
   parameters as DDP cannot, with DDP's semantics (whole replicas, gradients all-reduced).

The tasks call ``parallelize`` and use what it returns; they never wrap a model themselves.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch
from torch import nn

from bertgpu.parallel.compression import register as register_compression
from bertgpu.parallel.dims import ParallelDims
from bertgpu.parallel.pipeline import parallelize_pipeline
from bertgpu.parallel.wrap import (
    ParallelModel,
    SpreadOptions,
    WholeModel,
    apply_activation_checkpointing,
    apply_fsdp,
    apply_tensor_parallel,
    compile_options,
    encoder_layers,
    layer_keys,
)


def parallelize(
    model: nn.Module, dims: ParallelDims, device: torch.device, options: SpreadOptions = SpreadOptions()
) -> ParallelModel:
    """Spread ``model`` (its weights already loaded, the same on every process) over ``dims``, as ``options``
    say (``SpreadOptions``: the precision, activation checkpointing, compile, the gradients' compression, and
    with ``dims.pp`` > 1 the pipeline's schedule, ``pipeline.parallelize_pipeline``)."""
    if dims.pp > 1:
        return parallelize_pipeline(model, dims, device, options)
    precision, compression, compile = options.precision, options.compression, options.compile
    activation_checkpointing = options.activation_checkpointing
    if not dims.fsdp:
        model.to(device)  # fully_shard moves each shard itself: a model bigger than one GPU is never whole on one
    if dims.tp > 1:
        apply_tensor_parallel(model, dims)
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    # Under activation checkpointing each layer stays its own graph: the checkpointed regions replay their RNG
    # in the backward pass, which per-layer compilation has run on GPUs (whole-graph tracing of them has not).
    whole = compile and whole_step_compile(dims) and not activation_checkpointing
    if compile and not whole:
        layers = encoder_layers(model)
        for key in layer_keys(layers):
            # every batch has the same shapes: one graph
            layers[key].compile(dynamic=False, **compile_options(None, options.autotune))
    if dims.fsdp:
        apply_fsdp(model, dims, precision, reduce_dtype=compression.dtype)
        return WholeModel(model, model, dims, compression)
    if dims.dp > 1:
        from torch.nn.parallel import DistributedDataParallel

        # No buffer sync at each forward: our buffers (ModernBERT's rotary frequencies) are the same
        # constants on every rank, and the sync is a collective that hung an evaluation in which the ranks
        # run different numbers of batches. torch 2.13 names it forward_sync_buffers (broadcast_buffers
        # warns there); older releases know only broadcast_buffers.
        known = inspect.signature(DistributedDataParallel).parameters
        no_sync = {"forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers": False}
        # Gradients as views of the all-reduce buckets: no copy into the buckets and back each step, and no
        # second gradient-sized buffer (a model's gradients' worth of memory, torch's DDP notes).
        ddp = DistributedDataParallel(
            model,
            process_group=dims.dp_group,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
            **no_sync,
        )
        powersgd, mute = register_compression(ddp, compression, dims.dp_group, options.seed)
        return WholeModel(ddp, model, dims, compression, powersgd, mute)
    graphs = whole and options.cuda_graphs and device.type == "cuda"
    # --compile-step captures the whole step itself (training.fused_step): the objective then compiles without
    # torch.compile's own graphs, which cannot nest in a capture.
    step_graphs = graphs and options.compile_step
    mode = ("reduce-overhead" if graphs and not step_graphs else "default") if whole else None
    return WholeModel(model, model, dims, compression, whole_step=mode, options=replace(options, cuda_graphs=graphs))


def whole_step_compile(dims: ParallelDims) -> bool:
    """Whether --compile compiles the whole step as one graph: with one process, which holds the whole model.
    Data, tensor and pipeline parallelism compile each encoder layer (the units that DDP's buckets, FSDP's
    shards, DTensor's plans and the pipeline's stages are made of)."""
    return dims.world_size == 1 and dims.pp == 1 and dims.tp == 1 and not dims.fsdp
