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
import torch.nn.functional as F

from ..data.classification import ClassificationDataset, eval_batches
from ..parallel import ParallelDims
from ..precision import autocast


@torch.no_grad()
def predict_logits(
    model: Any,
    dataset: ClassificationDataset,
    batch_size: int,
    dims: ParallelDims,
    device: torch.device,
    precision: str,
    shares: list[int] | None = None,
) -> torch.Tensor:
    """Logits of every example, ``[N, num_labels]`` in float64 on the CPU, identical on every rank.

    ``model`` is a classifier, or a ``ParallelModel`` of one; ``shares`` the ranks' shares of the
    batches (unequal GPUs). Each data-parallel rank fills the rows of its batches in a zero array and
    the arrays are summed over the data-parallel ranks: every row
    comes from exactly one, and adding zeros is exact. Under FSDP every forward pass is collective,
    so a rank with fewer batches runs its last one again (its result unused), to keep in step.
    """
    was_training = model.training
    model.eval()
    logits = torch.zeros(len(dataset), model.config.num_labels, dtype=torch.float64, device=device)
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
            logits[indices] = out.double()
            last = indices
    model.train(was_training)
    return dims.dp_sum(logits).cpu()


def compute_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """Mean loss, accuracy and F1 (of label id 1 with two classes, else the macro average over the
    classes present in labels or predictions, as scikit-learn's f1_score), and the confusion matrix
    (rows: true label, columns: predicted)."""
    num_labels = logits.size(1)
    labels = labels.cpu()
    predictions = logits.argmax(-1)
    confusion = torch.zeros(num_labels, num_labels, dtype=torch.long)
    confusion.index_put_((labels, predictions), torch.ones_like(labels), accumulate=True)
    tp = confusion.diag()
    fp_fn = confusion.sum(0) + confusion.sum(1) - 2 * tp
    f1 = torch.where(2 * tp + fp_fn > 0, 2 * tp / (2 * tp + fp_fn).clamp(min=1), torch.zeros(()))
    if num_labels == 2:
        f1_value = f1[1].item()
    else:
        present = (confusion.sum(0) + confusion.sum(1)) > 0
        f1_value = f1[present].mean().item()
    return {
        "loss": F.cross_entropy(logits, labels).item(),
        "accuracy": tp.sum().item() / len(labels),
        "f1": f1_value,
        "examples": len(labels),
        "confusion": confusion.tolist(),
    }
