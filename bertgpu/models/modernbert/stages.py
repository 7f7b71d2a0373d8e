"""Pipeline stages of a ModernBERT (``--pp``): what ``bert_stages`` is for BERT. Stage 0 holds the token
embeddings and their norm; the last the final norm and the heads (the masked-LM head and the decoder tied to
the embeddings, or the classifier's); every stage computes the rotary angles and the attention masks of its
layers from the batch itself (they hold no weights)."""

from __future__ import annotations

import torch
from torch import nn


class Stage(nn.Module):
    def __init__(self, model: nn.Module, layers: list[str], first: bool, last: bool):
        super().__init__()
        encoder = model.model
        object.__setattr__(self, "encoder", encoder)  # for its rotary angles and masks, not its parameters
        self.embeddings = encoder.embeddings if first else None
        self.layers = nn.ModuleList(encoder.layers[key] for key in layers)
        self.last, self.masked_lm = last, model.tied_embedding is not None  # the decoder tied to the embeddings
        if last:
            self.final_norm, self.head = encoder.final_norm, model.head
            if self.masked_lm:
                self.decoder, self.vocab_size = model.decoder, model.vocab_size
            else:
                self.drop, self.classifier = model.drop, model.classifier
                self.pooling = model.config.classifier_pooling

    def forward(
        self,
        hidden: torch.Tensor | None = None,
        *,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
    ):
        # As modernbert.ModernBertModel.forward and the heads' forward, cut at the stage's bounds.
        x = self.embeddings(input_ids) if self.embeddings is not None else hidden
        B, L = input_ids.shape
        rotary = self.encoder.rotary(L, x.device)
        masks = self.encoder.masks(attention_mask, B, L, x.device)
        for layer in self.layers:
            x = layer(x, rotary, masks)
        if not self.last:
            return x
        x = self.final_norm(x)
        if self.masked_lm:
            if mlm_positions is not None:
                x = torch.gather(x, 1, mlm_positions.unsqueeze(-1).expand(-1, -1, x.size(-1)))
            logits = self.decoder(self.head(x))[..., : self.vocab_size]
            return logits, logits.new_zeros(B, 2)
        if self.pooling == "cls":
            pooled = x[:, 0]
        else:
            m = (torch.ones(B, L, device=x.device) if attention_mask is None else attention_mask).to(x.dtype)
            pooled = (x * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True)
        return self.classifier(self.drop(self.head(pooled)))


def keep(model: nn.Module, layers: list[range], first: bool, last: bool) -> None:
    """Delete from ``model`` what this process's stages do not hold, in place; parameter names stay."""
    encoder = model.model
    kept = [i for r in layers for i in r]
    encoder.layers = nn.ModuleDict({str(i): encoder.layers[i] for i in kept})
    if not first:
        encoder.embeddings = None  # the last stage's decoder keeps the tensor, now its own copy
    if not last:
        encoder.final_norm = model.head = None
        if model.tied_embedding is not None:  # ModernBertForMaskedLM
            model.decoder = None
        else:
            model.drop = model.classifier = None
