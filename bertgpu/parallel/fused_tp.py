"""Tensor parallelism of fused weights: a linear layer whose weight stacks ``chunks`` matrices by rows, as an
architecture's tensor-parallel plan names them (``Architecture.tp_plan``: ("colwise", chunks)).

A fused Q, K and V (rows q, then k, then v: 3 chunks) or a GeGLU's input and gate (rows input, then gate: 2)
split as one plain column-wise matrix would give the first process all of q and half of k. Here each is split
as ``chunks`` matrices at once: DTensor's ``_StridedShard(0, split_factor=chunks)`` gives process r the r-th
slice of every chunk, concatenated (q_r, k_r, v_r; input_r, gate_r), which is exactly what its heads and its
share of the GeGLU width need; the full matrix (checkpoints, transformers' layout) is gathered back in order.
The other layers of the plan are plain column- and row-wise; embeddings, norms and heads stay whole.

**FSDP over the strided weights** (``--tp`` with ``--strategy fsdp``, or with ``--pp``): FSDP2's ``fully_shard``
splits each tensor-parallel shard again, by default by rows (``Shard(0)``), and describes the result to DTensor
as ``(_StridedShard(0, split_factor=tp), _StridedShard(0, split_factor=chunks))``. The rows each process holds
are right (training is exact: the all-gather rebuilds the tensor-parallel shard), but that description is not:
it counts the tensor-parallel shards, not that each is strided over the chunks, so ``full_tensor()`` and
``redistribute`` (the checkpoint's weights and the optimizer state) put rows of q, k and v (input and gate)
in the wrong places: 0.08 off the one-process weights after 3 steps. ``fsdp_placement`` has ``fully_shard``
split these weights by columns instead (``Shard(1)``, its ``shard_placement_fn``): the two splits are then on
different dimensions, which DTensor composes exactly, and the checkpoint is the whole matrix in
transformers' order.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel
from torch.distributed.tensor.placement_types import _StridedShard

from bertgpu.errors import UserError


class FusedColwiseParallel(ColwiseParallel):
    """Column-wise parallel for a linear layer whose output is ``chunks`` matrices stacked by rows: each
    process holds the matching slice of every chunk, and computes its outputs locally."""

    def __init__(self, chunks: int) -> None:
        super().__init__()
        self.chunks = chunks

    def _partition_linear_fn(self, name, module, device_mesh):
        for pname, param in module.named_parameters():
            placement = _StridedShard(0, split_factor=self.chunks)
            sharded = distribute_tensor(param, device_mesh, [placement], src_data_rank=self.src_data_rank)
            module.register_parameter(pname, nn.Parameter(sharded, requires_grad=param.requires_grad))

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        return outputs.to_local()  # (q_r, k_r, v_r) or (input_r, gate_r): what this process's share computes from


def fsdp_placement(param: nn.Parameter) -> Shard | None:
    """``fully_shard``'s ``shard_placement_fn``: columns (``Shard(1)``) for a weight strided over the
    tensor-parallel group (``FusedColwiseParallel``'s), FSDP's default (rows) for every other."""
    if isinstance(param, DTensor) and any(isinstance(p, _StridedShard) for p in param.placements):
        return Shard(1)
    return None


def check_layout(dims: Any, config: Any, fused: str) -> None:
    """FSDP splits the fused weights' columns (``fsdp_placement``) evenly only: the data-parallel shards must
    divide the hidden size (a one-line error before any process starts, not FSDP's own in every process).
    ``fused``: what they are, as the error names them (the architecture's title and ``Architecture.tp_fused``)."""
    shards = dims.dp_shard if dims.fsdp else 1
    if dims.tp > 1 and shards > 1 and config.hidden_size % shards:
        raise UserError(
            f"--tp {dims.tp} with --strategy fsdp over {shards} data-parallel processes splits {fused} by "
            f"columns, and {shards} does not divide its hidden_size "
            f"{config.hidden_size}: use a data-parallel degree that does, or --strategy ddp"
        )
