"""--compile-step: a training step's device work run as one compiled unit, and on a GPU with CUDA graphs as one graph.

A step's device work is two halves that a loop's ``train_step`` writes out (``FusedStep.__call__``):
``forward_backward(micro)`` (the forward and backward passes of every micro-batch, returning the step's log sums)
and ``update()`` (unscale and clip the gradients, the optimizer step skipped on the device where non-finite, zero
the gradients, returning the skipped flag). The schedule stays outside: it moves the learning rate on the host.

- Off (the default): both halves run as they are.
- On: ``update`` runs through ``torch.compile`` (the clip's norm and scaling and the optimizer's arithmetic fused
  into a few kernels; LAMB's per-tensor loop especially), beside the forward half that --compile already compiles.
- On, with CUDA graphs (--compile on one GPU): after ``WARMUP`` eager steps of a batch signature (the lazy state:
  optimizer moments, cuBLAS workspaces, compilation), the whole step, every micro-batch's forward and backward and
  the update, is captured as one CUDA graph and replayed from then on: one launch per step, gradient accumulation
  included (torch.compile's own CUDA graphs, mode="reduce-overhead", cover the forward and backward of a single
  micro-batch only). Each new batch is copied into the graph's static inputs; the outputs are cloned, since the next
  replay writes over them.

So that neither the compiled update nor the graph holds the learning rate as a constant, each parameter group's
rate is a 0-dim tensor on the device for the duration of the step, filled from the schedule's float (``_lr_tensors``);
the optimizer's state dict and checkpoints keep floats.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

WARMUP = 3  # eager steps of a batch signature before its capture (torch's CUDA-graph notes ask for a few)

Micro = list[dict[str, torch.Tensor | None]]


def signature(micro: Micro) -> tuple:
    """What a captured graph is specific to: the micro-batches' keys, shapes and dtypes (None: a dropped mask)."""
    return tuple(
        tuple((k, None if v is None else (tuple(v.shape), v.dtype)) for k, v in sorted(mb.items())) for mb in micro
    )


class FusedStep:
    """Runs a step's two halves as --compile-step says (see the module's docstring): ``enabled`` compiles the
    update; ``graphs`` (a CUDA device) captures the whole step as one CUDA graph."""

    def __init__(self, optimizer: torch.optim.Optimizer, enabled: bool = False, graphs: bool = False):
        self.optimizer, self.enabled, self.graphs = optimizer, enabled, enabled and graphs
        self._lrs: list[torch.Tensor] | None = None
        self._seen: dict[tuple, int] = {}
        self._captured: dict[tuple, tuple[torch.cuda.CUDAGraph, Micro, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pool = None

    def __call__(
        self, forward_backward: Callable[[Micro], torch.Tensor], update: Callable[[], torch.Tensor], micro: Micro
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the step's log sums, its skipped flag), both on the device."""
        if not self.enabled:
            return forward_backward(micro), update()
        compiled = torch.compile(update, dynamic=False)  # one compilation: dynamo caches by the function's code
        with self._lr_tensors():
            if not self.graphs:
                return forward_backward(micro), self._update(compiled)
            key = signature(micro)
            if key not in self._captured:
                self._seen[key] = self._seen.get(key, 0) + 1
                if self._seen[key] <= WARMUP:
                    return self._on_side_stream(lambda: (forward_backward(micro), self._update(compiled)))
                self._capture(key, forward_backward, compiled, micro)
            graph, static, outputs = self._captured[key]
            for mine, new in zip(static, micro):
                for k, v in new.items():
                    if v is not None:
                        mine[k].copy_(v, non_blocking=True)
            graph.replay()
            return tuple(t.clone() for t in outputs)

    def _update(self, compiled: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The compiled update, after the gradients exist: LAMB's lazy state is made here, outside it, or the first
        step's trace (no state yet) would not be its last."""
        if hasattr(self.optimizer, "init_state"):
            self.optimizer.init_state()
        return compiled()

    def _on_side_stream(self, fn):
        """Warm-up steps on a side stream, as torch's CUDA-graph notes ask (the capture follows on one)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(stream)
        return out

    def _capture(self, key: tuple, forward_backward, update, micro: Micro) -> None:
        static = [{k: None if v is None else v.clone() for k, v in mb.items()} for mb in micro]
        self._pool = self._pool if self._pool is not None else torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # The gradients are None here (the last warm-up zeroed them to None): the captured backward writes them
        # (no accumulation into stale values) and the captured zero_grad frees them back to the graph's pool.
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = (forward_backward(static), update())
        self._captured[key] = (graph, static, outputs)

    @contextlib.contextmanager
    def _lr_tensors(self):
        """Each parameter group's learning rate as a 0-dim device tensor for the step (filled from the schedule's
        float; the same tensors every step, so the compiled update and the graph read them), floats again after."""
        groups = self.optimizer.param_groups
        rates = [g["lr"] for g in groups]
        if self._lrs is None:
            device = next(p.device for g in groups for p in g["params"])
            self._lrs = [torch.zeros((), dtype=torch.float32, device=device) for _ in groups]
        for group, rate, tensor in zip(groups, rates, self._lrs):
            tensor.fill_(rate)
            group["lr"] = tensor
        try:
            yield
        finally:
            for group, rate in zip(groups, rates):
                group["lr"] = rate
