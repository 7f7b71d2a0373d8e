"""A classifier's evaluation, sharded over the data-parallel ranks: `bertgpu evaluate`'s, and the one
fine-tuning runs after every epoch.

Evaluation is sharded so that every example counts exactly once: the batches are the same whatever
the number of processes, data-parallel rank r takes every dp-th of them, and the logits are gathered
into one array in example order before any metric is computed. The metrics of N processes are
therefore those of one.
"""

from __future__ import annotations

from typing import Any

import torch

from bertgpu.data.classification import eval_batches
from bertgpu.finetuning.classification import compute_metrics  # noqa: F401 (evaluate's, and tests', name)
from bertgpu.parallel import ParallelDims
from bertgpu.training.precision import autocast


@torch.no_grad()
def predict_logits(
    model: Any,
    dataset: Any,
    batch_size: int,
    dims: ParallelDims,
    device: torch.device,
    precision: str,
    shares: list[int] | None = None,
    shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Logits of every example (row), ``[N, *shape]`` in float64 on the CPU, identical on every rank: ``shape``
    is one row's (default ``(num_labels,)``; a token head's ``(longest row, num_labels)``, zero past a row's end).

    ``model`` is a classifier, or a ``ParallelModel`` of one; ``shares`` the ranks' shares of the
    batches (unequal GPUs). Each data-parallel rank fills the rows of its batches in a zero array and
    the arrays are summed over the data-parallel ranks: every row
    comes from exactly one, and adding zeros is exact. Under FSDP every forward pass is collective,
    so a rank with fewer batches runs its last one again (its result unused), to keep in step.
    """
    was_training = model.training
    model.eval()
    shape = (model.config.num_labels,) if shape is None else shape
    logits = torch.zeros(len(dataset), *shape, dtype=torch.float64, device=device)
    batches = eval_batches(dataset.lengths, batch_size, dims.dp, dims.dp_rank, shares)
    if dims.fsdp:
        rounds = max(len(eval_batches(dataset.lengths, batch_size, dims.dp, r, shares)) for r in range(dims.dp))
        batches = batches + [None] * (rounds - len(batches))
    last = None
    for indices in batches:
        batch = {k: v.to(device, non_blocking=True) for k, v in dataset.batch(indices or last).items()}
        with autocast(precision, device):
            out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        if indices is not None:
            if out.dim() == 3:  # per token: [B, L, C], L this batch's longest
                logits[indices, : out.size(1)] = out.double()
            else:
                logits[indices] = out.double()
            last = indices
    model.train(was_training)
    return dims.dp_sum(logits).cpu()


def describe_f1(metrics: dict[str, Any], names: list[str]) -> str:
    """Which F1 ``metrics['f1']`` is: "binary (positive)", or the labels its macro average is over."""
    if len(names) == 2:
        return f"binary ({names[1]})"
    over = metrics["f1_labels"]
    if len(over) == len(names):
        return f"macro over the {len(names)} labels"
    return f"macro over {len(over)} of the {len(names)} labels: those in the data or the predictions"


def per_class_table(metrics: dict[str, Any]) -> list[str]:
    """Each label's precision, recall, F1 and support as aligned text lines ("-": undefined)."""
    per_class = metrics["per_class"]
    width = max(5, *(len(name) for name in per_class))

    def cell(value: float | None) -> str:
        return f"{'-' if value is None else f'{value:.4f}':>9}"

    lines = [f"{'label':<{width}} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}"]
    for name, c in per_class.items():
        absent = ""
        if not c["support"]:
            predicted = f"predicted {c['predicted']:,} times" if c["predicted"] else "never predicted"
            absent = f"  (absent from the data, {predicted})"
        lines.append(
            f"{name:<{width}} {cell(c['precision'])} {cell(c['recall'])} {cell(c['f1'])} {c['support']:>8,}{absent}"
        )
    return lines


def missing_labels_warning(metrics: dict[str, Any], data: str) -> str | None:
    """One line when the data lacks some of the model's labels: which, and what that does to the F1."""
    names, in_data = list(metrics["per_class"]), metrics["data_labels"]
    missing = [name for name in names if name not in in_data]
    if not missing:
        return None
    line = f"{data} holds {len(in_data)} of the model's {len(names)} labels (not {', '.join(missing)})"
    if len(names) == 2:
        return f"{line}: F1 is the binary F1 of {names[1]}, {metrics['f1']:.4f}"
    predicted = [name for name in missing if metrics["per_class"][name]["predicted"]]
    f1, all_f1 = metrics["f1"], f"over all {len(names)} {metrics['macro_f1_all_labels']:.4f}"
    if not predicted:
        return f"{line}: macro F1 {f1:.4f} averages the {len(in_data)} labels in the data; {all_f1}"
    return (
        f"{line}: macro F1 {f1:.4f} averages {len(metrics['f1_labels'])} labels, {', '.join(predicted)} among them "
        f"(predicted though absent: F1 0); over the {len(in_data)} labels in the data it is "
        f"{metrics['macro_f1_data_labels']:.4f}, {all_f1}"
    )
