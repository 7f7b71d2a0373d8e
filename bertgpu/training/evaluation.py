"""Held-out masked-LM (and NSP) evaluation of a pretraining model, the same figure in every layout.

The instances of an ``EvalSet`` are dealt to the data-parallel ranks (instance k to rank k mod dp);
each rank sums, in float64, the masked tokens' cross-entropy, the correct predictions and the counts
over its share, and the sums are added over the ranks. Every rank runs the same number of forward
passes (a rank with fewer instances pads its last batch with weight-0 instances), as FSDP and tensor
parallelism need. The result depends on the model and the set only, not on the layout, up to the
float32 rounding of a forward pass in another batch shape (~1e-7).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from bertgpu.data.heldout import EvalSet
from bertgpu.data.pretraining import IGNORE_INDEX
from bertgpu.training.precision import autocast

SUMS = ("mlm_loss", "mlm_correct", "masked", "nsp_loss", "nsp_correct", "sequences")
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "mlm_positions")


@torch.no_grad()
def evaluate_mlm(
    model: Any, eval_set: EvalSet, dims: Any, device: torch.device, batch_size: int, nsp: bool, precision: str = "fp32"
) -> dict[str, float]:
    """``eval_mlm_loss``, ``eval_mlm_acc``, ``eval_perplexity`` (and ``eval_nsp_loss``, ``eval_nsp_acc``
    with ``nsp``) of ``model`` (a ``BertForPreTraining`` or a ``ParallelModel`` of one) on ``eval_set``.
    Every process calls this together; all get the same figures."""
    was_training = model.training
    model.eval()
    mine = list(range(dims.dp_rank, len(eval_set), dims.dp))
    per_rank = -(-len(eval_set) // dims.dp)  # the most any rank has: every rank runs as many batches
    sums = torch.zeros(len(SUMS), dtype=torch.float64, device=device)
    # Eager: layers compiled in place (--compile with several processes) would otherwise compile again for
    # no-grad mode and each batch shape, and past torch._dynamo's recompile limit (8) run every step eager.
    # (FlexAttention's kernel on CUDA stays compiled: modernbert.FlexMask.attend asks for it.)
    with torch.compiler.set_stance("force_eager"):
        for first in range(0, per_rank, batch_size):
            wanted = range(first, min(first + batch_size, per_rank))
            sums += _batch_sums(model, eval_set, mine, wanted, device, nsp, precision)
    total = dict(zip(SUMS, dims.dp_sum(sums).tolist()))
    model.train(was_training)
    return metrics_of(total, nsp)


def _batch_sums(
    model: Any, eval_set: EvalSet, mine: list[int], wanted: range, device: torch.device, nsp: bool, precision: str
) -> torch.Tensor:
    """The sums of SUMS over one batch: this rank's instances ``mine[j]`` for j in ``wanted`` (weight 0 past
    its share)."""
    instances = [eval_set.instance(mine[j] if j < len(mine) else 0) for j in wanted]
    weights = torch.tensor([1.0 if j < len(mine) else 0.0 for j in wanted], dtype=torch.float64, device=device)
    batch = {k: v.to(device) for k, v in torch.utils.data.default_collate(instances).items()}
    with autocast(precision, device):
        mlm_logits, nsp_logits = model(*(batch[k] for k in MODEL_INPUTS))
    labels = batch["mlm_labels"]
    valid = labels != IGNORE_INDEX
    token_loss = (
        F.cross_entropy(mlm_logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
        .view_as(labels)
        .double()
    )
    correct = ((mlm_logits.argmax(-1) == labels) & valid).double()
    sums = [
        (token_loss * weights[:, None]).sum(),
        (correct * weights[:, None]).sum(),
        (valid.double() * weights[:, None]).sum(),
    ]
    if nsp:
        nsp_loss = F.cross_entropy(nsp_logits.float(), batch["nsp_label"], reduction="none").double()
        nsp_correct = (nsp_logits.argmax(-1) == batch["nsp_label"]).double()
        sums += [(nsp_loss * weights).sum(), (nsp_correct * weights).sum()]
    else:
        sums += [torch.zeros((), dtype=torch.float64, device=device)] * 2
    return torch.stack([*sums, weights.sum()])


def metrics_of(total: dict[str, float], nsp: bool) -> dict[str, float]:
    loss = total["mlm_loss"] / max(total["masked"], 1)
    metrics = {
        "eval_mlm_loss": loss,
        "eval_mlm_acc": total["mlm_correct"] / max(total["masked"], 1),
        "eval_perplexity": math.exp(min(loss, 700)),
    }
    if nsp:
        metrics.update(
            eval_nsp_loss=total["nsp_loss"] / max(total["sequences"], 1),
            eval_nsp_acc=total["nsp_correct"] / max(total["sequences"], 1),
        )
    return metrics


def describe(step: int, metrics: dict[str, float], instances: int) -> str:
    """The log line of an evaluation."""
    line = (
        f"step {step} eval | mlm {metrics['eval_mlm_loss']:.4f} acc {metrics['eval_mlm_acc']:.3f} | "
        f"perplexity {metrics['eval_perplexity']:.2f}"
    )
    if "eval_nsp_loss" in metrics:
        line += f" | nsp {metrics['eval_nsp_loss']:.4f} acc {metrics['eval_nsp_acc']:.3f}"
    return line + f" | {instances:,} held-out instances"


# A held-out loss within this of the unigram loss (``EvalSet.unigram_loss``): the model predicts masked tokens
# by their frequency and has not begun to use the context (a model that has drops well below it within a
# few hundred steps).
PLATEAU_MARGIN = 0.1
# From this share of the run on, a model still on the plateau is worth a warning: a run that is leaving it
# normally has by half way (BENCHMARKS.md: the stall on the Chinese reviews at lr 2e-3).
PLATEAU_WARN_SHARE = 0.75


def plateau_note(loss: float, unigram: float, step: int, total: int, warned: bool) -> tuple[str, bool]:
    """What the evaluation line of ``step`` (of ``total``) adds when the held-out ``loss`` sits on the unigram
    plateau ``unigram``: a mark, and once (``warned``: said already) from PLATEAU_WARN_SHARE of the run on, a
    warning saying what to change. Return the text and whether the warning has been said."""
    if step == 0 or loss <= unigram - PLATEAU_MARGIN:
        return "", warned
    note = f" | not below the unigram plateau ({unigram:.2f}: token frequencies, no context)"
    if warned or step < PLATEAU_WARN_SHARE * total:
        return note, warned
    return note + (
        f"\nbertgpu: warning: at step {step:,} of {total:,} the held-out masked-LM loss ({loss:.2f}) is not below "
        f"the unigram plateau ({unigram:.2f}): the model has learned no more than how frequent each token is, and a "
        "classifier fine-tuned from it may stay at chance; train longer, or lower --lr or lengthen --warmup"
    ), True


SUMMARY_KEYS = {
    "eval_mlm_loss": "min",
    "eval_mlm_acc": "max",
    "eval_perplexity": "min",
    "eval_nsp_loss": "min",
    "eval_nsp_acc": "max",
    "eval_start_cka": "max",  # a continuation's similarity to its start (``drift.KEY``)
}
