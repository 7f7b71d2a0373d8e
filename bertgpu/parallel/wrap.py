"""The pieces a spread model is made of, for ``parallelize()`` and the pipeline's stages alike.

``ParallelModel`` is a model spread over processes, called like the model (``WholeModel`` where every process
runs the whole forward pass; the pipeline's stages are ``pipeline.PipelineModel``); ``apply_tensor_parallel``,
``apply_activation_checkpointing`` and ``apply_fsdp`` spread or wrap a model one encoder layer at a
time (``parallelize`` says in which order); ``grad_norm`` and ``clip_grad_norm_`` see through sharded
gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bertgpu.models import architectures
from bertgpu.parallel.compression import Compression, bytes_per_step, is_dtensor, load_state_tensors, state_tensors
from bertgpu.parallel.dims import ParallelDims


def encoder_layers(model: nn.Module) -> nn.ModuleList | nn.ModuleDict:
    """The model's encoder layers (``EncoderModel.encoder_layers``): a ModuleList, or a pipeline stage's
    ModuleDict of the layers it keeps (keyed by their index, so names stay HF's)."""
    return model.encoder_layers()


def layer_keys(layers: nn.ModuleList | nn.ModuleDict) -> list:
    return list(layers.keys()) if isinstance(layers, nn.ModuleDict) else list(range(len(layers)))


@dataclass(frozen=True)
class SpreadOptions:
    """How ``parallelize`` spreads a model, beside the degrees of its ``ParallelDims``."""

    precision: str = "fp32"  # bf16: FSDP gathers the parameters in bf16
    activation_checkpointing: bool = False
    compile: bool = False  # with one process the whole step as one graph, else each encoder layer
    compression: Compression = Compression()  # the gradients' all-reduce (--grad-compression)
    seed: int = 0  # PowerSGD's
    pipeline: Any = None  # the run's ParallelConfig, with dims.pp > 1: its stages and schedule
    seq_length: int | None = None  # the longest a batch's sequences can be (None: every batch has one shape)
    cuda_graphs: bool = False  # with compile on one GPU: mode="reduce-overhead" (static shapes)
    compile_step: bool = False  # --compile-step: with cuda_graphs, the whole step one graph (training.fused_step)
    autotune: bool = False  # --autotune: Inductor's max-autotune GEMM templates, epilogues fused


class ParallelModel:
    """A model spread over processes: call it like the model.

    ``model`` is the model itself (parameters for the optimizer, state dicts for checkpoints; FSDP and
    tensor parallelism change it in place, into DTensor parameters), ``module`` what a forward pass
    goes through (the DDP wrapper, or the model).
    """

    def __init__(
        self,
        module: nn.Module,
        model: nn.Module,
        dims: ParallelDims,
        compression: Compression = Compression(),
        powersgd=None,
        mute: list[bool] | None = None,
    ):
        self.module, self.model, self.dims = module, model, dims
        self.compression = compression
        self.powersgd = powersgd  # PowerSGD's state, when it compresses the gradients
        self._mute = mute or [False]

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @property
    def config(self):
        return self.model.config

    @property
    def training(self) -> bool:
        return self.module.training

    def train(self, mode: bool = True) -> ParallelModel:
        self.module.train(mode)
        return self

    def eval(self) -> ParallelModel:
        return self.train(False)

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
        """The forward and backward passes of one optimizer step over this rank's micro-batches (gradient
        accumulation); add the step's log sums to ``sums`` (zeros) and return it. The model reads the keys
        ``inputs`` of a micro-batch; ``loss_fn(outputs, mb)`` is the micro-batch's share of the global
        batch's loss, ``record(outputs, mb)`` its log sums (under no_grad); ``context(mb)`` wraps its
        forward pass (autocast), ``scale`` the loss before backward (the fp16 gradient scaler)."""
        for i, mb in enumerate(micro):
            with self.no_sync(i < len(micro) - 1), context(mb):
                outputs = self.module(**{k: mb[k] for k in inputs})
            scale(self.dims.backward_loss(loss_fn(outputs, mb))).backward()
            with torch.no_grad():
                sums += record(outputs, mb)
        return sums

    def no_sync(self, skip: bool):
        """A context for one micro-step of gradient accumulation: with ``skip``, DDP keeps the gradients
        local (they are all-reduced with the last micro-step's). FSDP reduce-scatters every micro-step
        (an unsharded gradient would cost the memory FSDP is there to save), so does nothing here."""
        if skip and hasattr(self.module, "no_sync"):
            return self.module.no_sync()
        return contextlib.nullcontext()

    def num_parameters(self) -> int:
        """The whole model's parameter count (a collective under pipeline parallelism)."""
        return sum(p.numel() for p in self.model.parameters())

    def comm_bytes_per_step(self, step: int) -> int:
        """The bytes of gradient this process hands to the data-parallel collective at optimizer step
        ``step`` (see ``compression.bytes_per_step``)."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        return bytes_per_step(trainable, self.compression, fsdp=self.dims.fsdp, step=step, dp=self.dims.dp)

    def rank_state_dict(self) -> dict[str, torch.Tensor] | None:
        """This process's own state beside the weights, for its checkpoint: PowerSGD's error feedback,
        warm-start factors and RNG (None without PowerSGD)."""
        return state_tensors(self.powersgd) if self.powersgd is not None else None

    def load_rank_state_dict(
        self, tensors: dict[str, torch.Tensor], sample_batch: Callable[[], dict[str, torch.Tensor]]
    ) -> None:
        """The inverse of ``rank_state_dict`` on the same layout; ``sample_batch()`` is a batch for
        ``settle_buckets``."""
        load_state_tensors(self.powersgd, tensors)
        self.settle_buckets(sample_batch)

    def settle_buckets(self, sample_batch: Callable[[], dict[str, torch.Tensor]]) -> None:
        """Let DDP lay out its gradient buckets before a resumed PowerSGD run's first step.

        DDP lays its buckets out anew after its first synchronised backward pass (by the order in
        which gradients become ready), and PowerSGD's state is kept per bucket: a resumed run's first
        step would meet the state of another layout. So that step is made a silent one first: the
        forward pass on ``sample_batch()`` and a backward pass of zero, the hook muted (no communication, no
        state touched), the RNG put back and the gradients dropped. The buckets are then those the
        state was saved with, and the run continues bit for bit.
        """
        if self.powersgd is None:
            return
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            self._mute[0] = True
            try:
                outputs = self(**sample_batch())
                sum(o.float().sum() for o in outputs if torch.is_tensor(o)).mul(0.0).backward()
            finally:
                self._mute[0] = False
        for p in self.model.parameters():
            p.grad = None

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients to a global norm of ``max_norm`` (``inf``: no clipping); return the norm
        before clipping, the same on every process. No host synchronisation."""
        return clip_grad_norm_(list(self.model.parameters()), max_norm)


class WholeModel(ParallelModel):
    """A ParallelModel whose every process runs the whole forward pass (one process, data parallel, FSDP, tensor
    parallel: the weights may be sharded or split, the pass is not): the forward pass and the loss can be one
    function (``forward_backward_objective``), compiled as one graph with one process. The pipeline's stages
    (``pipeline.PipelineModel``) run the pass across processes, the loss on the last: they cannot."""

    def __init__(
        self,
        module: nn.Module,
        model: nn.Module,
        dims: ParallelDims,
        compression: Compression = Compression(),
        powersgd=None,
        mute: list[bool] | None = None,
        whole_step: str | None = None,
        options: SpreadOptions = SpreadOptions(),
    ):
        super().__init__(module, model, dims, compression, powersgd, mute)
        # --compile with one process: the step's objective through torch.compile with this mode ("default" or
        # "reduce-overhead": CUDA graphs); None: the objective runs as it is (each layer compiled, or eager).
        self.whole_step = whole_step
        self.autotune = options.autotune  # --autotune: compiled with max-autotune's GEMM templates (compile_options)
        # --compile-step with CUDA graphs (``options.cuda_graphs``: where they apply): the loop captures the whole
        # step as one graph (training.fused_step), the objective compiled without torch.compile's own graphs.
        self.step_graphs = whole_step is not None and options.compile_step and options.cuda_graphs
        self._compiled: dict[tuple[Callable, str], Callable] = {}

    def forward_backward_objective(
        self,
        micro: list[dict[str, torch.Tensor]],
        objective: Callable[..., tuple[torch.Tensor, torch.Tensor]],
        inputs: tuple[str, ...],
        sums: torch.Tensor,
        *,
        context: Callable[[dict[str, torch.Tensor]], Any] = lambda mb: contextlib.nullcontext(),
        scale: Callable[[torch.Tensor], torch.Tensor] = lambda loss: loss,
        **constants: Any,
    ) -> torch.Tensor:
        """As ``forward_backward``, with the forward pass and the loss one function: ``objective(module,
        {k: mb[k] for k in inputs}, **constants)`` returns (loss, log sums). With ``whole_step`` it runs
        compiled as one graph (a module-level function, so that one compilation serves every step)."""
        run, mode = objective, self.whole_step
        if mode == "reduce-overhead" and len(micro) > 1:
            # A replay may reuse the memory of the previous one's outputs, which accumulated gradients are
            # made of until the optimizer step: CUDA graphs only without gradient accumulation.
            mode = "default"
        if mode is not None:
            if (objective, mode) not in self._compiled:
                options = compile_options(mode, self.autotune)
                self._compiled[objective, mode] = torch.compile(objective, dynamic=False, **options)
            run = self._compiled[objective, mode]
        graphs = mode == "reduce-overhead"
        for i, mb in enumerate(micro):
            if graphs:  # the previous replay's outputs are consumed: its buffers may be reused
                torch.compiler.cudagraph_mark_step_begin()
            with self.no_sync(i < len(micro) - 1), context(mb):
                loss, step_sums = run(self.module, {k: mb[k] for k in inputs}, **constants)
            scale(self.dims.backward_loss(loss)).backward()
            sums += step_sums
        return sums


def compile_options(mode: str | None, autotune: bool = False) -> dict[str, Any]:
    """torch.compile's keyword arguments for ``mode`` (None or "default"; "reduce-overhead": CUDA graphs), with
    ``autotune`` (--autotune) Inductor's max-autotune GEMM templates with epilogue fusion: the bias and the GELU
    after a matmul computed in its kernel, each matmul's kernel chosen by timing the candidates once."""
    graphs = mode == "reduce-overhead"
    if autotune:
        return {"options": {"max_autotune": True, "epilogue_fusion": True, "triton.cudagraphs": graphs}}
    return {"mode": mode} if graphs else {}


def _grad_groups(parameters: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The parameters with a gradient, by kind (plain tensors; DTensors of one mesh and placement)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            key = (p.grad.device_mesh, tuple(p.grad.placements)) if is_dtensor(p.grad) else None
            groups.setdefault(key, []).append(p)
    return list(groups.values())


def grad_norm(parameters: list[torch.Tensor]) -> torch.Tensor | None:
    """The 2-norm of the gradients of ``parameters`` (None when none has one). Gradients of one kind are
    normed together; a DTensor norm is made whole (``full_tensor``: the sum over the shards)."""
    norms = []
    for params in _grad_groups(parameters):
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
        norms.append(norm.full_tensor() if is_dtensor(norm) else norm)
    if not norms:
        return None
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))


def clip_grads_with_norm_(parameters: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    for params in _grad_groups(parameters):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)


def clip_grad_norm_(parameters: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for parameters that may be DTensors on several meshes. With
    plain tensors only this is torch's own computation, to the bit."""
    total = grad_norm(parameters)
    if total is None:
        return torch.zeros(())
    clip_grads_with_norm_(parameters, max_norm, total)
    return total


def apply_tensor_parallel(model: nn.Module, dims: ParallelDims) -> None:
    """Megatron-style tensor parallelism of every encoder layer over the tp mesh, by the architecture's plan
    (``Architecture.tp_plan``; fused weights as strided shards: ``fused_tp``)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from bertgpu.parallel.fused_tp import FusedColwiseParallel

    plan = {
        name: RowwiseParallel()
        if style == "rowwise"
        else ColwiseParallel()
        if chunks == 1
        else FusedColwiseParallel(chunks)
        for name, (style, chunks) in architectures.of(model.config).tp_plan.items()
    }
    layers = encoder_layers(model)
    for key in layer_keys(layers):
        parallelize_module(layers[key], dims.tp_mesh, plan)


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Wrap every encoder layer so that its activations are recomputed in the backward pass."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = encoder_layers(model)
    for key in layer_keys(layers):
        # Non-reentrant checkpointing (the wrapper's default); the RNG state is replayed, so dropout
        # draws the same masks in the recomputation.
        layers[key] = checkpoint_wrapper(layers[key], preserve_rng_state=True)


def apply_fsdp(model: nn.Module, dims: ParallelDims, precision: str, reduce_dtype: torch.dtype | None = None) -> None:
    """fully_shard every encoder layer, then the root (embeddings, tied decoder, pooler, heads).
    Parameters are gathered in bf16 under --precision bf16; gradients are reduced in fp32, or in
    ``reduce_dtype`` (--grad-compression fp16/bf16)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from bertgpu.parallel.fused_tp import fsdp_placement

    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if precision == "bf16" else None, reduce_dtype=reduce_dtype or torch.float32
    )
    mesh = dims.dp_mesh
    for layer in encoder_layers(model):
        # Fused weights strided over the tensor-parallel group by columns (fused_tp.fsdp_placement).
        fully_shard(layer, mesh=mesh, mp_policy=mp, shard_placement_fn=fsdp_placement)
    fully_shard(model, mesh=mesh, mp_policy=mp)
