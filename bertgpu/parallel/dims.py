"""The degrees of parallelism of a run, checked, and the DeviceMesh they make.

As torchtitan's ``ParallelDims``: the processes form a mesh of pipeline, data-parallel and
tensor-parallel dimensions, ``world = pp x dp x tp``. The dp processes train on
different data; the tp processes of one group train one batch together, each holding a slice of
every encoder layer's matmuls. Consecutive ranks share a tp group (on one machine when tp divides
the GPUs per machine, where tensor parallelism's frequent collectives belong).

The mesh has three named dimensions, ``(dp_replicate, dp_shard, tp)``: ``--strategy ddp`` puts the
data-parallel degree on ``dp_replicate`` (whole replicas, gradients all-reduced), ``fsdp`` on
``dp_shard`` (parameters, gradients and optimizer state sharded). Both above 1 at once would be
HSDP, for which the mesh already has room. Under pipeline parallelism (``--pp``) a ``pp`` dimension
comes first, outermost: each pipeline stage is a (dp x tp) block of consecutive ranks, and a stage's
activations travel to the next stage's process of the same (dp, tp) coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from bertgpu.errors import UserError
from bertgpu.models.config import EncoderConfig

STRATEGIES = ("ddp", "fsdp")


@dataclass
class ParallelDims:
    world_size: int
    tp: int = 1
    strategy: str = "ddp"
    pp: int = 1  # pipeline stages, each on its own processes (bertgpu.parallel.pipeline)
    mesh: torch.distributed.device_mesh.DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise UserError(f"--strategy {self.strategy}: choose from {', '.join(STRATEGIES)}")
        if self.tp < 1:
            raise UserError(f"--tp must be at least 1, got {self.tp}")
        if self.pp < 1:
            raise UserError(f"--pp must be at least 1, got {self.pp}")
        if self.tp * self.pp > self.world_size:
            raise UserError(
                f"--pp {self.pp} x --tp {self.tp} needs at least {self.pp * self.tp} processes, the run has "
                f"{self.world_size} (--nproc, or torchrun)"
            )
        if self.tp > self.world_size:
            raise UserError(
                f"--tp {self.tp} needs at least {self.tp} processes, the run has {self.world_size} "
                "(--nproc, or torchrun)"
            )
        if self.world_size % (self.tp * self.pp):
            n = self.tp * self.pp
            what = f"--tp {self.tp}" if self.pp == 1 else f"--pp {self.pp} x --tp {self.tp}"
            raise UserError(
                f"{what} does not divide the {self.world_size} process(es): the processes form "
                f"data-parallel groups of {n} each (start a multiple of {n} with --nproc or torchrun)"
            )

    @property
    def dp(self) -> int:
        """The data-parallel degree: how many different batches one step trains on."""
        return self.world_size // (self.tp * self.pp)

    @property
    def dp_replicate(self) -> int:
        return self.dp if self.strategy == "ddp" else 1

    @property
    def dp_shard(self) -> int:
        return self.dp if self.strategy == "fsdp" else 1

    @property
    def fsdp(self) -> bool:
        """Whether fully_shard wraps the model: --strategy fsdp, or ddp under tensor parallelism
        (DistributedDataParallel cannot hold DTensor parameters; fully_shard over a replicate-only
        mesh is DDP's semantics for them: whole replicas, gradients all-reduced), or ddp under pipeline
        parallelism (the schedules drive fully_shard's gradient reduction themselves, once per step)."""
        return self.dp > 1 and (self.strategy == "fsdp" or self.tp > 1 or self.pp > 1)

    def backward_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward() on. A rank's loss is its part of a sum normalised over the whole
        global batch, so the gradient wanted is the sum over the data-parallel ranks; DDP and FSDP
        average instead, so scale by the degree they divide by."""
        return loss * self.dp

    def check_model(self, config: EncoderConfig) -> None:
        """Tensor parallelism splits attention heads and the feed-forward width evenly."""
        if self.tp == 1:
            return
        if config.num_attention_heads % self.tp:
            raise UserError(
                f"--tp {self.tp} does not divide the model's {config.num_attention_heads} attention heads "
                "(num_attention_heads): each tensor-parallel process holds whole heads"
            )
        if config.intermediate_size % self.tp:
            raise UserError(f"--tp {self.tp} does not divide the model's intermediate_size {config.intermediate_size}")

    def describe(self) -> str:
        """The layout for the start line and the log: ``4 processes = dp 2 x tp 2, fsdp``."""
        if self.world_size == 1:
            return "1 process"
        parts = [f"{name} {n}" for name, n in (("pp", self.pp), ("dp", self.dp), ("tp", self.tp)) if n > 1]
        return f"{self.world_size} processes = {' x '.join(parts)}" + (f", {self.strategy}" if self.dp > 1 else "")

    # --- the mesh --------------------------------------------------------------------------------

    def build_mesh(self, device_type: str) -> None:
        """Make the DeviceMesh (every rank calls this after joining the process group); with one
        process there is none."""
        if self.world_size == 1:
            return
        from torch.distributed.device_mesh import init_device_mesh

        shape, names = (self.dp_replicate, self.dp_shard, self.tp), ("dp_replicate", "dp_shard", "tp")
        if self.pp > 1:  # outermost: a stage's processes are consecutive ranks, on as few machines as can be
            shape, names = (self.pp, *shape), ("pp", *names)
        self.mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)

    @property
    def _dp_dim(self) -> str:
        return "dp_replicate" if self.strategy == "ddp" else "dp_shard"

    @property
    def dp_rank(self) -> int:
        """This process's data-parallel rank: which share of the global batch it reads."""
        return self.mesh.get_local_rank(self._dp_dim) if self.mesh is not None else 0

    @property
    def tp_rank(self) -> int:
        return self.mesh.get_local_rank("tp") if self.mesh is not None else 0

    @property
    def pp_rank(self) -> int:
        """Which pipeline stage (of one per process; more under interleaving) this process holds."""
        return self.mesh.get_local_rank("pp") if self.pp > 1 else 0

    @property
    def pp_group(self):
        """The process group of this process's pipeline column: one process of each stage, the same
        data-parallel and tensor-parallel coordinates."""
        return self.mesh.get_group("pp") if self.pp > 1 else None

    @property
    def dp_group(self):
        """The process group of this rank's data-parallel peers (one rank of each tp group)."""
        return self.mesh.get_group(self._dp_dim) if self.mesh is not None else None

    @property
    def dp_mesh(self):
        """The data-parallel part of the mesh that fully_shard spreads over: 2-d (replicate, shard)
        under ddp, so that replicas all-reduce; 1-d (shard) under fsdp."""
        if self.strategy == "ddp":
            return self.mesh["dp_replicate", "dp_shard"]
        return self.mesh["dp_shard"]

    @property
    def tp_mesh(self):
        return self.mesh["tp"]

    def dp_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel ranks, in place. The ranks of a tp group hold the same batch, so
        this (not a sum over every process) is the global batch's total."""
        if self.mesh is not None and self.dp > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.dp_group)
        return tensor
