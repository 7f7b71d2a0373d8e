"""Pipeline parallelism (``--pp``): the encoder's layers split into stages on different processes.

Built on ``torch.distributed.pipelining``: each process holds one stage (or several, interleaved),
a ``PipelineStage`` each, and a schedule (``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``) runs a step's micro-batches through them. The stages are cut from
bertgpu's own model, not traced: every process builds the whole model (the same weights), then
keeps only its stages' parts, under their Hugging Face names (the layers it keeps stay at their
index in a ``ModuleDict``), so checkpoints and the optimizer's state are the same on every layout.
Stage 0 holds the embeddings, the last stage the pooler and heads.

Each stage is then spread as without pipelining, in torchtitan's order: tensor parallel,
activation checkpointing, compile, then ``fully_shard`` over the data-parallel processes.

**The tied word embedding.** BERT's MLM decoder is the input embedding matrix, which lives on the
first stage. The last stage keeps a copy (Megatron-LM's "embedding group"): after every step's
backward passes the two copies' gradients are summed over the 2 processes holding them, so both
take the same optimizer step and stay equal; the gradient norm counts the matrix once.

**The loss** of a micro-batch is its share of the global batch's loss (summed over masked tokens,
divided by those of the whole global batch), so the schedules' own division by the number of
micro-batches is turned off (``scale_grads=False``); as without pipelining, the data-parallel
gradient average is undone by the factor dp.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.parallel.compression import Compression
from bertgpu.parallel.dims import ParallelDims
from bertgpu.parallel.wrap import (
    ParallelModel,
    SpreadOptions,
    apply_activation_checkpointing,
    apply_tensor_parallel,
    clip_grads_with_norm_,
    encoder_layers,
    grad_norm,
)

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
# Test hook only: "sync" skips adding the tied copies' gradients, "norm" counts the copy twice in the norm.
_BREAK_TIED = "BERTGPU_TEST_BREAK_TIED"


def stage_layers(num_layers: int, num_stages: int) -> list[range]:
    """The encoder layers of each stage, split evenly (the first stages take one more when it is uneven)."""
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for s in range(num_stages):
        bounds.append(bounds[-1] + base + (s < extra))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def check_stages(num_layers: int, pp: int, stages_per_rank: int) -> None:
    if num_layers < pp * stages_per_rank:
        raise UserError(
            f"--pp {pp} with {stages_per_rank} stage(s) per process makes {pp * stages_per_rank} stages, more "
            f"than the model's {num_layers} encoder layers (num_hidden_layers): lower --pp or --pp-stages-per-rank"
        )


def parallelize_pipeline(
    model: nn.Module, dims: ParallelDims, device: torch.device, options: SpreadOptions
) -> PipelineModel:
    """This process's stages of ``model`` (the whole model, the same weights on every process), spread
    over its data-parallel and tensor-parallel peers, with the schedule that runs them (``options.pipeline``:
    the run's ParallelConfig)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    parallel, precision, compression = options.pipeline, options.precision, options.compression
    per_rank = parallel.stages_per_rank
    n_stages = dims.pp * per_rank
    check_stages(model.config.num_hidden_layers, dims.pp, per_rank)
    ids = [dims.pp_rank + k * dims.pp for k in range(per_rank)]  # looped placement, as interleaved 1F1B wants
    split = stage_layers(model.config.num_hidden_layers, n_stages)
    first, last = 0 in ids, n_stages - 1 in ids
    # The architecture's stages (Stage, keep): the module its entry names (models/bert/stages.py for BERT).
    cut = importlib.import_module(architectures.of(model.config).stages)
    cut.keep(model, [split[s] for s in ids], first, last)
    model.to(device)
    if dims.tp > 1:
        apply_tensor_parallel(model, dims)
    if options.activation_checkpointing:
        apply_activation_checkpointing(model)
    layers = encoder_layers(model)
    if options.compile:
        for key in layers:
            layers[key].compile(dynamic=False)
    stages = [cut.Stage(model, [str(i) for i in split[s]], s == 0, s == n_stages - 1) for s in ids]
    if dims.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from bertgpu.parallel import fused_tp

        mp = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if precision == "bf16" else None,
            reduce_dtype=compression.dtype or torch.float32,
        )
        for stage in stages:
            for layer in stage.layers:
                fully_shard(layer, mesh=dims.dp_mesh, mp_policy=mp, shard_placement_fn=fused_tp.fsdp_placement)
            fully_shard(stage, mesh=dims.dp_mesh, mp_policy=mp)
    pipe_stages = [PipelineStage(stage, s, n_stages, device, group=dims.pp_group) for s, stage in zip(ids, stages)]
    net = PipelineModel(model, dims, compression, stages, first, last)
    net.seq_length = options.seq_length
    kind = parallel.pp_schedule
    n_micro = parallel.microbatches
    if kind == "interleaved-1f1b":
        net.schedule = ScheduleInterleaved1F1B(pipe_stages, n_micro, loss_fn=net._loss, scale_grads=False)
    else:
        cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
        net.schedule = cls(pipe_stages[0], n_micro, loss_fn=net._loss, scale_grads=False)
    net.tied_names = model.tied_embedding  # (the decoder, the embedding) of a masked-LM head; None: no tie
    net._tied_group = _embedding_group(dims) if net.tied_names is not None else None
    model.gather_stages = net.gather_state_dict  # hf_dir: the whole model's weights, from every stage
    model.optimizer_aliases = dict([net.tied_names]) if net.tied_names is not None and last and not first else {}
    return net


def _embedding_group(dims: ParallelDims):
    """The 2-process groups of the first and the last stage of each pipeline column (every process
    makes every group, in the same order); this process's, or None if it holds neither end."""
    grid = dims.mesh.mesh.reshape(dims.pp, -1)
    mine = None
    for column in range(grid.shape[1]):
        ranks = [int(grid[0, column]), int(grid[-1, column])]
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine


def _pack(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[tuple[str, torch.Size]]]:
    """The targets of a micro-batch as one [B, n] tensor (the schedules split one ``target`` along the
    batch), and how to take them apart again."""
    spec = [(k, v.shape[1:]) for k, v in tensors.items()]
    return torch.cat([v.reshape(len(v), -1).long() for v in tensors.values()], dim=1), spec


def _unpack(target: torch.Tensor, spec: list[tuple[str, torch.Size]]) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for key, shape in spec:
        width = shape.numel()
        out[key] = target[:, at : at + width].reshape(len(target), *shape)
        at += width
    return out


class PipelineModel(ParallelModel):
    """A ParallelModel of pipeline stages: ``forward_backward`` runs a step through the schedule;
    ``model`` holds this process's stages (Hugging Face names) for the optimizer and checkpoints."""

    def __init__(self, model: nn.Module, dims: ParallelDims, compression: Compression, stages, first, last):
        super().__init__(model, model, dims, compression)
        self.stages, self.first, self.last = stages, first, last
        self.schedule: Any = None
        self._tied_group = None
        self.tied_names: tuple[str, str] | None = None  # (the last stage's copy, the first stage's matrix)
        self._loss_now: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
        self.seq_length: int | None = None  # pad sequences to this many tokens (batches of any length)
        self.rows: dict[bool, int] = {}  # the rows every batch is padded to, in training and in evaluation

    @property
    def config(self):
        return self.model.config

    def _fixed_shape(self, mb: dict[str, torch.Tensor], inputs: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """``mb`` padded to the shape of every step: the schedules infer the shapes they send between stages
        once (and again on each switch between training and evaluation). Sequence inputs (as wide as
        ``input_ids``) are padded to ``seq_length`` (fine-tuning's batches are only as long as their
        longest example); rows to the first batch's count of the mode (training or evaluation: a short
        last batch), a multiple of the micro-batches, padding rows attending to their first token only
        (finite outputs) with targets -100, which losses ignore."""
        ids = mb[inputs[0]]
        rows, width = len(ids), ids.size(1)
        n_micro = self.schedule._n_microbatches
        target = self.rows.setdefault(self.training, -(-rows // n_micro) * n_micro)
        if rows > target:
            raise RuntimeError(f"a batch of {rows} rows after one of {target}: pipeline stages need one shape")
        length = max(width, self.seq_length or width)
        out = {}
        for key, value in mb.items():
            fill = self.config.pad_token_id if key == inputs[0] else 0 if key in inputs else -100
            shape = list(value.shape)
            shape[0] = target
            if key in inputs and value.dim() == 2 and value.size(1) == width:
                shape[1] = length
            padded = torch.full(shape, fill, dtype=value.dtype, device=value.device)
            padded[tuple(slice(0, n) for n in value.shape)] = value
            if key == "attention_mask":
                padded[rows:, 0] = 1
            out[key] = padded
        return out

    def __call__(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        """The whole model's outputs (forward only, through the schedule's ``eval``) on every process of the
        pipeline column, for evaluation: called as the model is (``input_ids, token_type_ids,
        attention_mask[, mlm_positions]``)."""
        names = ("input_ids", "token_type_ids", "attention_mask", "mlm_positions")
        batch = {k: v for k, v in {**dict(zip(names, args)), **kwargs}.items() if v is not None}
        rows = len(batch["input_ids"])
        fixed = self._fixed_shape(batch, tuple(batch))
        with torch.no_grad():
            unused = torch.zeros(len(fixed["input_ids"]), dtype=torch.long, device=fixed["input_ids"].device)
            out = self.schedule.eval(**fixed, target=unused if self.last else None)
            out = self._from_last_stage(out)
        return tuple(o[:rows] for o in out) if isinstance(out, tuple) else out[:rows]

    def _from_last_stage(self, out):
        """The last stage's outputs, broadcast to the other stages of the pipeline column."""
        group = self.dims.pp_group
        src = dist.get_global_rank(group, self.dims.pp - 1)  # the last stage's process, in any placement
        outs = [o.contiguous() for o in (out if isinstance(out, tuple) else (out,))] if self.last else None
        meta = [(isinstance(out, tuple), [(o.shape, o.dtype) for o in outs])] if self.last else [None]
        dist.broadcast_object_list(meta, src=src, group=group)
        is_tuple, shapes = meta[0]
        if not self.last:
            device = next(self.model.parameters()).device
            outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes]
        for o in outs:
            dist.broadcast(o, src=src, group=group)
        return tuple(outs) if is_tuple else outs[0]

    def _loss(self, outputs, target: torch.Tensor) -> torch.Tensor:
        if self._loss_now is None:  # evaluation: the schedules compute a loss anyway, which nothing reads
            return torch.zeros((), device=target.device)
        return self._loss_now(outputs, target)

    def forward_backward(
        self,
        micro: list[dict[str, torch.Tensor]],
        inputs: tuple[str, ...],
        loss_fn: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor],
        record: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor],
        sums: torch.Tensor,
        *,
        context: Callable[[dict[str, torch.Tensor]], Any] = lambda mb: contextlib.nullcontext(),
        scale: Callable[[torch.Tensor], torch.Tensor] = lambda loss: loss,
    ) -> torch.Tensor:
        """As ``ParallelModel.forward_backward``, each micro-batch of accumulation a step of the schedule
        (split into its micro-batches); the log sums are the last stage's, summed over the pipeline
        column so that every process logs and checkpoints them alike."""
        for mb in micro:
            rows = len(mb[inputs[0]])
            fixed = self._fixed_shape(mb, inputs)
            target, spec = _pack({k: v for k, v in fixed.items() if k not in inputs})

            def loss(outputs, t, spec=spec):  # per micro-batch, on the last stage; dp's average undone as without pp
                return scale(self.dims.backward_loss(loss_fn(outputs, _unpack(t, spec))))

            self._loss_now = loss
            with context(mb):
                outputs = self.schedule.step(
                    **{k: fixed[k] for k in inputs}, target=target if self.last else None, return_outputs=self.last
                )
            if self.last:
                with torch.no_grad():
                    real = tuple(o[:rows] for o in outputs) if isinstance(outputs, tuple) else outputs[:rows]
                    sums += record(real, mb)
        self._loss_now = None
        dist.all_reduce(sums, group=self.dims.pp_group)
        self.sync_tied_gradients()
        return sums

    def _tied(self) -> torch.nn.Parameter | None:
        """This process's copy of the tied embedding/decoder matrix, when it holds an end of the pipeline."""
        if self._tied_group is None:
            return None
        named = dict(self.model.named_parameters())
        decoder, embedding = self.tied_names
        return named.get(embedding) if self.first else named.get(decoder)

    def sync_tied_gradients(self) -> None:
        """Sum the gradients of the two copies of the tied matrix (first and last stage), so that both take
        the same step: the gradient of the one matrix they are."""
        p = self._tied()
        if p is None or p.grad is None or os.environ.get(_BREAK_TIED) == "sync":
            return
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(grad, group=self._tied_group)

    def num_parameters(self) -> int:
        copy = self._tied() if self.last and not self.first else None
        mine = sum(p.numel() for p in self.model.parameters() if p is not copy)
        count = torch.tensor([mine], dtype=torch.float64, device=next(self.model.parameters()).device)
        dist.all_reduce(count, group=self.dims.pp_group)
        return int(count.item())

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip to a norm over every stage's gradients, the tied matrix counted once (the last stage's copy
        left out of its share); the same on every process."""
        params = list(self.model.parameters())
        copy = self._tied() if self.last and not self.first else None
        counted = params if os.environ.get(_BREAK_TIED) == "norm" else [p for p in params if p is not copy]
        norm = grad_norm(counted)
        device = params[0].device
        squared = (norm.double() ** 2) if norm is not None else torch.zeros((), dtype=torch.float64, device=device)
        dist.all_reduce(squared, group=self.dims.pp_group)
        total = squared.sqrt().float()
        clip_grads_with_norm_(params, max_norm, total)
        return total

    def gather_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole model's state dict on the CPU of rank 0 (None elsewhere): each stage's made whole
        over its data-parallel and tensor-parallel processes, then sent down rank 0's pipeline column.
        Every process calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = self.dims.dp > 1 or self.dims.tp > 1  # DTensors, made whole on every process of the stage
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=full))
        state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        column = dist.get_process_group_ranks(self.dims.pp_group)
        if 0 not in column:
            return None
        parts = [None] * len(column) if dist.get_rank() == 0 else None
        dist.gather_object(state, parts, dst=0, group=self.dims.pp_group)
        if dist.get_rank() != 0:
            return None
        merged: dict[str, torch.Tensor] = {}
        for part in parts:
            for k, v in part.items():
                merged.setdefault(k, v)  # the embedding (stage 0) before the last stage's copy
        return merged
