"""Pipeline stages of a BERT (``--pp``; ``pipeline.parallelize_pipeline`` asks the architecture's entry for
this module): stage 0 holds the embeddings, the last the pooler and the heads (the masked-LM head and the
decoder tied to the embeddings, and NSP's; or the classifier's); every stage makes the attention mask (and
--pack's positions) of its layers from the batch itself."""

from __future__ import annotations

import torch
from torch import nn


class Stage(nn.Module):
    """One pipeline stage's computation over parts of the process's model (the same modules, so the
    same parameters): embeddings (first stage), its encoder layers, pooler and heads (last stage).

    Its inputs are the activations of the stage before (none on the first) and, on every stage, the
    batch's tensors as keyword arguments (the schedule splits them into micro-batches alike); the
    last stage returns what the whole model returns.
    """

    def __init__(self, model: nn.Module, layers: list[str], first: bool, last: bool):
        super().__init__()
        bert = model.bert
        object.__setattr__(self, "bert", bert)  # for its attention inputs (documents or padding), not its parameters
        self.embeddings = bert.embeddings if first else None
        self.layers = nn.ModuleList(bert.encoder.layer[key] for key in layers)
        self.pretraining = model.tied_embedding is not None  # the masked-LM and NSP heads, or a classifier
        self.pooler = bert.pooler if last else None
        if last and self.pretraining:
            self.cls = model.cls
        elif last:
            self.dropout, self.classifier = model.dropout, model.classifier
        self.last = last

    def forward(
        self,
        hidden: torch.Tensor | None = None,
        *,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
    ):
        # As model.BertModel.forward and the heads' forward, cut at the stage's bounds.
        mask, positions = self.bert.attention_inputs(attention_mask)  # every stage makes its own from the batch
        x = self.embeddings(input_ids, token_type_ids, positions) if self.embeddings is not None else hidden
        for layer in self.layers:
            x = layer(x, mask)
        if not self.last:
            return x
        pooled = self.pooler(x) if self.pooler is not None else None
        if not self.pretraining:
            return self.classifier(self.dropout(pooled))
        if mlm_positions is not None:
            x = torch.gather(x, 1, mlm_positions.unsqueeze(-1).expand(-1, -1, x.size(-1)))
        return self.cls.predictions(x), self.cls.seq_relationship(pooled)


def keep(model: nn.Module, layers: list[range], first: bool, last: bool) -> None:
    """Delete from ``model`` what this process's stages do not hold, in place; parameter names stay."""
    bert = model.bert
    kept = [i for r in layers for i in r]
    bert.encoder.layer = nn.ModuleDict({str(i): bert.encoder.layer[i] for i in kept})
    if not first:
        bert.embeddings = None  # the last stage's decoder keeps the tensor, now its own copy
    if not last:
        bert.pooler = None
        if model.tied_embedding is not None:  # BertForPreTraining
            model.cls = None
        else:
            model.dropout = model.classifier = None
