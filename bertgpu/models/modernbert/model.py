"""ModernBERT in plain PyTorch (Warner et al. 2024), parameter for parameter the model of transformers.

Module and parameter names are exactly those of transformers' ``ModernBertModel``,
``ModernBertForMaskedLM`` and the fine-tuning heads ``ModernBertForSequenceClassification``,
``ModernBertForTokenClassification`` and ``ModernBertForQuestionAnswering``, so a state dict moves between
the two unchanged (``bertgpu.checkpoints.hf_dir`` does the file side). Everything here is pure computation: no
files, no processes, no distribution.

One ModernBERT layer (pre-LayerNorm, no biases; layer 0 has no attention norm, the embedding norm
stands in for it)::

    x = x + Wo · Attention(rope(q), rope(k), v)      with q, k, v = split(Wqkv · LN(x))
    x = x + Wo · (GELU(a) * g)                       with a, g = split(Wi · LN(x))   (GeGLU)

Every ``global_attn_every_n_layers``-th layer (0, 3, 6, ...) attends over the whole sequence with
rotary base ``global_rope_theta``; the others over a sliding window, each token seeing the tokens at
most ``local_attention // 2`` positions away on either side, with rotary base ``local_rope_theta``.

Attention runs through PyTorch's scaled_dot_product_attention with one boolean mask per kind of layer,
built once per forward pass and shared by its layers (global: the key padding, [B, 1, 1, L], never
L x L; local: the band and the padding, [B, 1, L, L]); or, with ``attention="flex"`` (CUDA), through
FlexAttention with block masks, which skip the blocks outside the window and never hold an L x L mask.

With ``ModernBertModel.documents`` (--pack rows, ``attention_mask`` numbering each token's document), every
mask also keeps each token within its document (global layers then get [B, 1, L, L]; FlexAttention skips the
blocks between documents). Positions are not restarted per document: rotary attention depends on the
distance between two tokens only, so a document's attention is the same wherever it sits in its row.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertgpu.models.interface import EncoderModel
from bertgpu.models.layers import ACT_FNS, check_span_outputs, document_mask, padded_vocab_size
from bertgpu.models.modernbert.config import ModernBertConfig

ATTENTION_KINDS = ("sdpa", "flex")


def _trunc_normal(module: nn.Module, std: float, cutoff: float) -> None:
    nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-cutoff * std, b=cutoff * std)
    if getattr(module, "bias", None) is not None:
        nn.init.zeros_(module.bias)


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, LayerNorm and dropout (no position embeddings: positions are rotary)."""

    def __init__(self, config: ModernBertConfig, pad_vocab_multiple: int = 1) -> None:
        super().__init__()
        rows = padded_vocab_size(config.vocab_size, pad_vocab_multiple)
        self.tok_embeddings = nn.Embedding(rows, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.drop = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertMLP(nn.Module):
    """GeGLU: Wi makes the input and the gate (its two halves, in that order), Wo projects back.

    The halves are counted from Wi's width, not the config, so that the same code runs on a slice of
    it (tensor parallel: each process holds matching rows of both halves)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = ACT_FNS[config.hidden_activation]
        self.drop = nn.Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(self.act(a) * gate))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, heads, L, d] by the angles of cos/sin [L, d] (computed in fp32, as transformers)."""
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


class ModernBertAttention(nn.Module):
    """Self-attention with one fused Q/K/V projection (Wqkv: rows q, then k, then v) and rotary positions.

    Heads are counted from Wqkv's width, so that the same code runs on a slice of the heads (tensor
    parallel: each process holds the matching q, k and v rows of its heads)."""

    def __init__(self, config: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        h = config.hidden_size
        self.head_dim = h // config.num_attention_heads
        self.Wqkv = nn.Linear(h, 3 * h, bias=config.attention_bias)
        self.Wo = nn.Linear(h, h, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        self.out_drop = nn.Dropout(config.attention_dropout) if config.attention_dropout > 0 else nn.Identity()
        self.local = config.layer_types[layer_idx] == "sliding_attention"

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], mask: Any) -> torch.Tensor:
        B, L, _ = x.shape
        qkv = self.Wqkv(x).view(B, L, 3, -1, self.head_dim)  # [B, L, 3, heads, d]
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # each [B, heads, L, d]
        cos, sin = rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        p = self.dropout_p if self.training else 0.0
        if isinstance(mask, (FlexMask, LocalBlocks)):
            y = mask.attend(q, k, v, p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out_drop(self.Wo(y.transpose(1, 2).reshape(B, L, -1)))


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, config: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        h, eps, bias = config.hidden_size, config.norm_eps, config.norm_bias
        # Layer 0's input is the embedding norm's output already (transformers: an Identity, no weights).
        self.attn_norm = nn.Identity() if layer_idx == 0 else nn.LayerNorm(h, eps=eps, bias=bias)
        self.attn = ModernBertAttention(config, layer_idx)
        self.mlp_norm = nn.LayerNorm(h, eps=eps, bias=bias)
        self.mlp = ModernBertMLP(config)

    def forward(self, x: torch.Tensor, rotary: dict[bool, Any], masks: dict[bool, Any]) -> torch.Tensor:
        local = self.attn.local
        x = x + self.attn(self.attn_norm(x), rotary[local], masks[local])
        return x + self.mlp(self.mlp_norm(x))


class FlexMask:
    """A FlexAttention block mask and the compiled kernel that reads it: the band of a local layer (and
    the key padding), evaluated per 128 x 128 block, so blocks outside the window are skipped and no
    L x L mask is held."""

    _kernel = None

    def __init__(
        self,
        attention_mask: torch.Tensor | None,
        batch: int,
        length: int,
        window: int | None,
        device,
        documents: bool = False,
    ):
        from torch.nn.attention.flex_attention import create_block_mask

        keep = None if attention_mask is None else attention_mask if documents else attention_mask.bool()

        def mask_mod(b, h, q, kv):
            ok = (q - kv).abs() <= window if window is not None else q >= 0
            if keep is not None:  # documents: the same document (padding: padding), else a real key
                ok = ok & (keep[b, q] == keep[b, kv] if documents else keep[b, kv])
            return ok

        self.block_mask = create_block_mask(
            mask_mod, batch if keep is not None else None, None, length, length, device=device
        )

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
        """FlexAttention has no dropout: attention_dropout is 0 in ModernBERT (--dropout > 0 is not applied
        inside attention here)."""
        from torch.nn.attention.flex_attention import flex_attention

        if q.device.type != "cuda" or torch.compiler.is_compiling():  # CPU: the eager reference (tests)
            return flex_attention(q, k, v, block_mask=self.block_mask)  # compiling: part of the caller's graph
        if FlexMask._kernel is None:
            FlexMask._kernel = torch.compile(flex_attention, dynamic=False)
        with torch.compiler.set_stance("default"):  # compiled also where evaluation runs eager: no eager kernel
            return FlexMask._kernel(q, k, v, block_mask=self.block_mask)


class LocalBlocks:
    """Sliding-window attention without an L x L mask, for long sequences through SDPA: the queries in
    blocks of ``2 * window``, each block attending to its own keys and ``window`` more on either side
    (a band of block + 2 x window keys), so memory and work grow with L x (4 x window), not L x L.

    Each block's mask is the band |q - k| <= window (the same for every block), the key padding and the
    ends of the sequence; each query also sees itself (as ``sdpa_masks``)."""

    def __init__(
        self,
        attention_mask: torch.Tensor | None,
        batch: int,
        length: int,
        window: int,
        device,
        documents: bool = False,
    ) -> None:
        self.w, self.b = window, 2 * window
        self.n = -(-length // self.b)
        self.length = length
        padded = self.n * self.b
        j = torch.arange(self.b, device=device)[:, None]
        m = torch.arange(self.b + 2 * window, device=device)[None, :]
        band = (m - j >= 0) & (m - j <= 2 * window)  # |q - k| <= w, with k = block start + m - w
        if documents:  # a key of the query's document; -1 past the ends, where no document is
            doc = torch.full((batch, padded + 2 * window), -1, dtype=attention_mask.dtype, device=device)
            doc[:, window : window + length] = attention_mask
            keys = doc.unfold(1, self.b + 2 * window, self.b)  # [B, n, b + 2w]: each block's keys' documents
            queries = doc[:, window : window + padded].view(batch, self.n, self.b)
            allowed = band & (queries[..., :, None] == keys[..., None, :])
        else:
            keep = torch.zeros(batch, padded + 2 * window, dtype=torch.bool, device=device)
            keep[:, window : window + length] = True if attention_mask is None else attention_mask.bool()
            keys = keep.unfold(1, self.b + 2 * window, self.b)  # [B, n, b + 2w]: each block's keys
            allowed = band & keys[:, :, None, :]
        self.mask = allowed | (m - j == window)  # [B, n, b, b + 2w]; the diagonal
        self.mask = self.mask[:, None]  # [B, 1 (heads), n, b, b + 2w]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
        B, H, L, d = q.shape
        pad = self.n * self.b - L
        qb = F.pad(q, (0, 0, 0, pad)).view(B, H, self.n, self.b, d)
        kb, vb = (
            F.pad(t, (0, 0, self.w, pad + self.w)).unfold(2, self.b + 2 * self.w, self.b).transpose(-1, -2)
            for t in (k, v)
        )  # [B, H, n, b + 2w, d]
        y = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=self.mask, dropout_p=dropout_p)
        return y.reshape(B, H, self.n * self.b, d)[:, :, :L]


# From this length on, a local layer attends block by block through SDPA (LocalBlocks) instead of with one
# L x L mask: at 1024 tokens and a 128-token window the band is a quarter of the matrix.
BLOCKED_FROM = 1024


def sdpa_masks(
    attention_mask: torch.Tensor | None, length: int, window: int, device: torch.device, documents: bool = False
) -> dict[bool, torch.Tensor | None]:
    """The boolean masks (True: attend) of global (False) and local (True) layers for SDPA.

    Global layers: the key padding, [B, 1, 1, L], or None without padding. Local layers: the band
    |q - k| <= window and the key padding, [B, 1, L, L] (None when the window covers the sequence and
    there is no padding). Each query also sees itself, so that a padding position far from every real
    token is never a row without keys (SDPA would give it NaN, which would then reach real tokens
    through the values); real tokens' rows are unchanged by that. With ``documents``, the block-diagonal
    mask of the documents ``attention_mask`` numbers (padding one more block) instead of the key padding.
    """
    if documents and attention_mask is not None:
        same = document_mask(attention_mask)  # [B, 1, L, L], its diagonal true
        if length - 1 <= window:
            return {False: same, True: same}
        pos = torch.arange(length, device=device)
        return {False: same, True: same & ((pos[:, None] - pos[None, :]).abs() <= window)}
    keys = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
    if length - 1 <= window:
        return {False: keys, True: keys}
    pos = torch.arange(length, device=device)
    band = (pos[:, None] - pos[None, :]).abs() <= window
    local = band if keys is None else (band & keys) | torch.eye(length, dtype=torch.bool, device=device)
    return {False: keys, True: local[None, None] if local.dim() == 2 else local}


class ModernBertModel(nn.Module):
    """The encoder: embeddings, N layers, final norm."""

    def __init__(self, config: ModernBertConfig, pad_vocab_multiple: int = 1, attention: str = "sdpa") -> None:
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, not {attention!r}")
        self.config = config
        self.attention = attention
        self.blocked_from = BLOCKED_FROM  # SDPA: local layers block by block from this length on
        # True (``use_document_attention``; pretraining on --pack rows): attention_mask numbers each token's
        # document (1, 2, ...; 0 on padding) and attention stays within each.
        self.documents = False
        self.embeddings = ModernBertEmbeddings(config, pad_vocab_multiple)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        d = config.hidden_size // config.num_attention_heads
        for name, theta in (("global_inv_freq", config.global_rope_theta), ("local_inv_freq", config.local_rope_theta)):
            inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            self.register_buffer(name, inv, persistent=False)  # not in state dicts, as in transformers
        init_weights(self, config)

    def rotary(self, length: int, device: torch.device) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """cos and sin [L, head_dim] of global (False) and local (True) layers, in fp32."""
        pos = torch.arange(length, device=device, dtype=torch.float32)
        out = {}
        for local, inv in ((False, self.global_inv_freq), (True, self.local_inv_freq)):
            freqs = pos[:, None] * inv.to(device=device, dtype=torch.float32)[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            out[local] = (emb.cos(), emb.sin())
        return out

    def masks(self, attention_mask: torch.Tensor | None, batch: int, length: int, device: torch.device) -> dict:
        # No padding: SDPA may take its fastest kernel. Not asked inside torch.compile, where reading the
        # device's answer would break the graph (the compiled step drops such a mask on the host already).
        # One document (or 0/1 numbers) without padding is no mask at all either.
        if attention_mask is not None and not torch.compiler.is_compiling() and bool((attention_mask == 1).all()):
            attention_mask = None
        docs = self.documents and attention_mask is not None
        if self.attention == "flex":
            return {
                False: FlexMask(attention_mask, batch, length, None, device, docs),
                True: FlexMask(attention_mask, batch, length, self.config.window, device, docs),
            }
        if length >= self.blocked_from and length - 1 > self.config.window:
            if docs:
                keys = document_mask(attention_mask)
            else:
                keys = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
            blocks = LocalBlocks(attention_mask, batch, length, self.config.window, device, docs)
            return {False: keys, True: blocks}
        return sdpa_masks(attention_mask, length, self.config.window, device, docs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Return the sequence output [B, L, H] (after the final norm)."""
        B, L = input_ids.shape
        x = self.embeddings(input_ids)
        rotary = self.rotary(L, x.device)
        masks = self.masks(attention_mask, B, L, x.device)
        for layer in self.layers:
            x = layer(x, rotary, masks)
        return self.final_norm(x)


class ModernBertPredictionHead(nn.Module):
    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ACT_FNS[config.classifier_activation]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


def init_weights(module: nn.Module, config: ModernBertConfig) -> None:
    """transformers' ModernBertPreTrainedModel._init_weights: truncated normals, the output projections
    scaled down with depth; LayerNorms at one (and zero)."""
    std = config.initializer_range
    cutoff = config.initializer_cutoff_factor or 3.0
    out = std / math.sqrt(2.0 * config.num_hidden_layers)
    for m in module.modules():
        if isinstance(m, ModernBertEmbeddings):
            _trunc_normal(m.tok_embeddings, std, cutoff)
        elif isinstance(m, ModernBertMLP):
            _trunc_normal(m.Wi, std, cutoff)
            _trunc_normal(m.Wo, out, cutoff)
        elif isinstance(m, ModernBertAttention):
            _trunc_normal(m.Wqkv, std, cutoff)
            _trunc_normal(m.Wo, out, cutoff)
        elif isinstance(m, ModernBertPredictionHead):
            _trunc_normal(m.dense, out, cutoff)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class _WithEncoder(EncoderModel):
    """A ModernBERT with heads: the encoder is ``self.model``; a bare encoder's file (no "model." prefix,
    transformers' base_model_prefix) loads into it."""

    encoder_prefixes = ("model.embeddings.", "model.layers.", "model.final_norm.")
    base_prefix = "model."
    bare_names = ("embeddings.", "layers.", "final_norm.")
    vocab_rows = ("embeddings.tok_embeddings.weight", "decoder.bias")  # the decoder's weight is the embedding's
    model: ModernBertModel

    def encoder_layers(self) -> nn.ModuleList | nn.ModuleDict:
        return self.model.layers

    def use_documents(self, on: bool) -> None:
        self.model.documents = on

    def use_flex_attention(self) -> None:
        if self.model.attention == "sdpa":
            self.model.attention = "flex"


class ModernBertForMaskedLM(_WithEncoder):
    """ModernBERT with its masked-LM head: transform (dense, GELU, norm), then the decoder, tied to the
    token embeddings, with a bias.

    The forward pass has the signature and outputs of ``BertForPreTraining``'s, so that pretraining,
    evaluation and fill-mask run either: ``token_type_ids`` are ignored (ModernBERT has no segments), and
    the second output is zeros [B, 2] in place of NSP logits (ModernBERT is trained on MLM only).
    ``pad_vocab_multiple`` pads the embedding and decoder rows as BERT's; files hold vocab_size rows.
    """

    tied_weights = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}
    tied_embedding = ("decoder.weight", "model.embeddings.tok_embeddings.weight")
    mlm_head_prefixes = ("head.", "decoder.")

    def __init__(self, config: ModernBertConfig, pad_vocab_multiple: int = 1, attention: str = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        rows = padded_vocab_size(config.vocab_size, pad_vocab_multiple)
        self.model = ModernBertModel(config, pad_vocab_multiple, attention)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, rows, bias=config.decoder_bias)
        init_weights(self.head, config)
        if self.decoder.bias is not None:
            nn.init.zeros_(self.decoder.bias)
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight
        with torch.no_grad():  # padded vocab rows start (and, never receiving a gradient, stay) zero
            self.decoder.weight[config.vocab_size :].zero_()

    def mlm_output_bias(self) -> nn.Parameter | None:
        return self.decoder.bias

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (mlm_logits, zeros [B, 2]); mlm_logits is [B, P, V] at ``mlm_positions`` [B, P] when
        given (only the masked slots go through the head and decoder), else [B, L, V]."""
        x = self.model(input_ids, attention_mask)
        if mlm_positions is not None:
            x = torch.gather(x, 1, mlm_positions.unsqueeze(-1).expand(-1, -1, x.size(-1)))
        logits = self.decoder(self.head(x))[..., : self.vocab_size]
        return logits, logits.new_zeros(input_ids.size(0), 2)


class ModernBertForSequenceClassification(_WithEncoder):
    """ModernBERT with transformers' classification head: the [CLS] (or mean) pooling, the prediction
    head's transform, dropout, a linear classifier. The whole file of a pretrained model loads into it
    (``encoder_to_load``: itself): its ``head`` is the masked-LM head's transform, which transformers also
    loads from a ModernBertForMaskedLM; the classifier stays new."""

    head_kind = "sequence"
    head_modules = ("head", "classifier")

    def __init__(self, config: ModernBertConfig, attention: str = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config, attention=attention)
        self.head = ModernBertPredictionHead(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.head, config)
        _trunc_normal(self.classifier, config.hidden_size**-0.5, config.initializer_cutoff_factor or 3.0)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return logits [B, num_labels]; ``token_type_ids`` are ignored (ModernBERT has no segments)."""
        x = self.model(input_ids, attention_mask)
        if self.config.classifier_pooling == "cls":
            pooled = x[:, 0]
        else:
            m = torch.ones(x.shape[:2], device=x.device) if attention_mask is None else attention_mask
            m = m.to(x.dtype).unsqueeze(-1)
            pooled = (x * m).sum(1) / m.sum(1)
        return self.classifier(self.drop(self.head(pooled)))


def training_flops_per_sequence(config: ModernBertConfig, seq_len: int, num_predictions: int) -> float:
    """Model FLOPs of one pretraining step for one sequence, matmuls only, for MFU (as model.py's for BERT):
    per layer and token Wqkv 3·2h², Wo 2h², GeGLU 3·2hi, scores and weighted sum 2·2·h·(keys seen: L in global
    layers, at most 2w+1 in local ones); the head P·(2h² + 2hV); training = 3 x forward."""
    h, i, L, V = config.hidden_size, config.intermediate_size, seq_len, config.vocab_size
    forward = 0.0
    for kind in config.layer_types or []:
        keys = L if kind == "full_attention" else min(L, 2 * config.window + 1)
        forward += L * (8 * h * h + 6 * h * i + 4 * keys * h)
    forward += num_predictions * (2 * h * h + 2 * h * V)
    return 3.0 * forward


class _PerToken(_WithEncoder):
    """transformers' head of a score per token: every token's last hidden state through the prediction head's
    transform, dropout (classifier_dropout) and ``classifier`` [H -> num_labels]. As the sequence classifier, the
    whole file of a pretrained model loads into it (its ``head`` from the masked-LM head's transform)."""

    head_modules = ("head", "classifier")

    def __init__(self, config: ModernBertConfig, attention: str = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config, attention=attention)
        self.head = ModernBertPredictionHead(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.head, config)
        _trunc_normal(self.classifier, config.hidden_size**-0.5, config.initializer_cutoff_factor or 3.0)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return logits [B, L, num_labels]; ``token_type_ids`` are ignored (ModernBERT has no segments)."""
        x = self.model(input_ids, attention_mask)
        return self.classifier(self.drop(self.head(x)))


class ModernBertForTokenClassification(_PerToken):
    """ModernBERT with a classifier per token (NER, POS: a tag per token), as transformers'
    ModernBertForTokenClassification; forward -> logits [B, L, num_labels]."""

    head_kind = "token"


class ModernBertForQuestionAnswering(_PerToken):
    """ModernBERT with a start and an end score per token (extractive question answering), as transformers'
    ModernBertForQuestionAnswering; forward -> logits [B, L, 2]: each token's start score, then its end score
    (transformers' start_logits and end_logits, stacked on the last dimension)."""

    head_kind = "span"

    def __init__(self, config: ModernBertConfig, attention: str = "sdpa") -> None:
        check_span_outputs(config.num_labels)
        super().__init__(config, attention)


__all__ = [
    "ModernBertConfig",
    "ModernBertForMaskedLM",
    "ModernBertForQuestionAnswering",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertModel",
]
