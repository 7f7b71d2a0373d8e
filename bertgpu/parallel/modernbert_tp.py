"""Tensor parallelism of a ModernBERT's layers: its own plan for the fused weights.

ModernBERT fuses Q, K and V into one matrix (``attn.Wqkv``: rows q, then k, then v) and the GeGLU's input
and gate into another (``mlp.Wi``: rows input, then gate). A plain column-wise split would give the first
process all of q and half of k. Here each is split as ``chunks`` matrices at once: DTensor's
``_StridedShard(0, split_factor=chunks)`` gives process r the r-th slice of every chunk, concatenated
(q_r, k_r, v_r; input_r, gate_r), which is exactly what its heads and its share of the GeGLU width need;
the full matrix (checkpoints, transformers' layout) is gathered back in order. ``Wo`` of attention and of
the MLP are row-wise, as BERT's output projections. Embeddings, norms and heads stay whole.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.distributed.tensor.placement_types import _StridedShard


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


PLAN = {
    "attn.Wqkv": FusedColwiseParallel(3),
    "attn.Wo": RowwiseParallel(),
    "mlp.Wi": FusedColwiseParallel(2),
    "mlp.Wo": RowwiseParallel(),
}


def apply(layers: nn.ModuleList | nn.ModuleDict, tp_mesh) -> None:
    for key in list(layers.keys()) if isinstance(layers, nn.ModuleDict) else range(len(layers)):
        parallelize_module(layers[key], tp_mesh, PLAN)
