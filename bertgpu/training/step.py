"""The forward half of a pretraining step: model, gathered heads and loss, as one function.

``pretraining_objective`` runs the model on a micro-batch and returns its loss (the micro-batch's share
of the global batch's loss, which backward() is called on) and its log sums (``LOG_SUMS`` order). There
is one cross-entropy over the masked slots: the loss and the logged MLM loss are the same sum, the log's
detached, and the [B·P, V] logits are cast to fp32 once (inside the cross-entropy's kernel when compiled).
Under --no-nsp the model runs no pooler and no NSP head (``EncoderModel.use_next_sentence``).

``compile_objective`` makes it one graph with ``torch.compile`` (embeddings, encoder, gathered heads and
loss; with ``mode="reduce-overhead"`` on one GPU, replayed as CUDA graphs), which ``parallelize`` chooses
where the layout lets one process hold the whole model (``whole_step_compile``); elsewhere each encoder
layer is compiled on its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertgpu.data.pretraining import IGNORE_INDEX

# What the log sums between two log lines (summed over the data-parallel ranks), in this order.
LOG_SUMS = ("mlm_loss", "mlm_correct", "masked", "nsp_loss", "nsp_correct", "sequences", "tokens")
# What the model reads of a micro-batch.
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "mlm_positions")


def pretraining_loss(
    outputs: tuple[torch.Tensor, torch.Tensor | None],
    mlm_labels: torch.Tensor,
    nsp_label: torch.Tensor,
    n_masked: torch.Tensor,
    global_batch: int,
    nsp: bool,
    tokens: torch.Tensor | int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, log sums) of the model's ``outputs`` (mlm_logits [B, P, V], nsp_logits [B, 2] or None).

    The MLM loss is summed over the masked slots and divided by ``n_masked``, the masked tokens of the
    whole global batch; the NSP loss is summed over the pairs and divided by ``global_batch``."""
    mlm_logits, nsp_logits = outputs
    labels = mlm_labels.flatten()
    logits = mlm_logits.flatten(0, 1)
    mlm_sum = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    loss = mlm_sum / n_masked
    device = labels.device
    zero = torch.zeros((), dtype=torch.float64, device=device)
    if not torch.is_tensor(tokens):
        tokens = torch.full((), tokens, dtype=torch.float64, device=device)
    with torch.no_grad():
        valid = labels != IGNORE_INDEX
        mlm_correct = ((logits.argmax(-1) == labels) & valid).sum()  # the argmax of the logits as computed
    if nsp:
        nsp_sum = F.cross_entropy(nsp_logits.float(), nsp_label, reduction="sum")
        loss = loss + nsp_sum / global_batch
        nsp_loss, nsp_correct = nsp_sum.detach(), (nsp_logits.detach().argmax(-1) == nsp_label).sum()
    else:
        nsp_loss = nsp_correct = zero
    sums = torch.stack(
        [
            t.double()
            for t in (
                mlm_sum.detach(),
                mlm_correct,
                valid.sum(),
                nsp_loss,
                nsp_correct,
                torch.full((), len(mlm_labels), dtype=torch.float64, device=device),
                tokens,
            )
        ]
    )
    return loss, sums


def pretraining_objective(
    module: torch.nn.Module, mb: dict[str, torch.Tensor | None], n_masked: torch.Tensor, global_batch: int, nsp: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's forward pass on a micro-batch ``mb`` (``MODEL_INPUTS``, ``mlm_labels`` and ``nsp_label``) and
    ``pretraining_loss`` of it. ``attention_mask`` None: a batch without padding (SDPA then takes its fastest
    kernel, flash attention on a GPU)."""
    mask = mb["attention_mask"]
    outputs = module(**{k: mb[k] for k in MODEL_INPUTS})
    tokens = mb["input_ids"].numel() if mask is None else real_tokens(mask)
    return pretraining_loss(outputs, mb["mlm_labels"], mb["nsp_label"], n_masked, global_batch, nsp, tokens)


def real_tokens(attention_mask: torch.Tensor) -> torch.Tensor:
    """The batch's real (non-padding) tokens: its mask is 0/1, or numbers each token's document (--pack)."""
    return (attention_mask != 0).sum()


def compile_objective(fn, mode: str | None):
    """``fn`` through torch.compile (one graph of static shapes; ``mode`` "reduce-overhead": CUDA graphs)."""
    return torch.compile(fn, dynamic=False, mode=mode)


def drop_full_mask(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    """The batch (still on the host) with ``attention_mask`` None when it has no padding at all and one
    document per row (a --pack row of several documents keeps the mask that numbers them): looked at on
    the CPU, before the copy to the device, so that no step waits for the device to know it."""
    mask = batch.get("attention_mask")
    if mask is not None and bool((mask == 1).all()):
        return {**batch, "attention_mask": None}
    return batch
