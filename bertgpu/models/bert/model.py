"""BERT in plain PyTorch (Devlin et al. 2019), parameter for parameter the model of transformers.

Module and parameter names are exactly those of transformers' ``BertModel``,
``BertForPreTraining`` and the fine-tuning heads ``BertForSequenceClassification``,
``BertForTokenClassification`` and ``BertForQuestionAnswering``, so a state dict moves between the two
unchanged (``bertgpu.checkpoints.checkpoint`` does the file side). Everything here is pure computation: no
files, no processes, no distribution.

One BERT layer (post-LayerNorm, as in the paper)::

    x = LayerNorm(x + Dropout(Wo · Attention(Wq x, Wk x, Wv x)))
    x = LayerNorm(x + Dropout(W2 · act(W1 x)))
"""

from __future__ import annotations

import functools
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from bertgpu.models.bert.config import BertConfig
from bertgpu.models.interface import EncoderModel
from bertgpu.models.layers import ACT_FNS, check_span_outputs, document_mask, layer_norm, padded_vocab_size


class BertEmbeddings(nn.Module):
    """Sum of word, position and segment embeddings, then LayerNorm and dropout.

    With ``pad_vocab_multiple`` > 1 the word-embedding matrix has extra rows past vocab_size, kept
    at zero: no id ever looks them up, and the tied decoder's logits for them are cut off.
    """

    def __init__(self, config: BertConfig, pad_vocab_multiple: int = 1) -> None:
        super().__init__()
        h = config.hidden_size
        rows = padded_vocab_size(config.vocab_size, pad_vocab_multiple)
        self.word_embeddings = nn.Embedding(rows, h, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h)
        self.LayerNorm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        if position_ids is None:  # 0, 1, ... in every row
            position_ids = torch.arange(input_ids.size(1), device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if token_type_ids is None:  # segment A everywhere: add row 0 without building a zeros tensor
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Each token's position in its document [B, L]: 0 at the first token of each run of equal numbers in
    ``documents`` [B, L] (padding restarts too, unread)."""
    B, L = documents.shape
    index = torch.arange(L, device=documents.device).expand(B, L)
    starts = torch.cat([torch.ones_like(documents[:, :1], dtype=torch.bool), documents[:, 1:] != documents[:, :-1]], 1)
    return index - torch.where(starts, index, 0).cummax(dim=1).values


def _varlen_attn():
    """torch.nn.attention.varlen.varlen_attn (flash attention over variable-length sequences), or None
    where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


class BertSelfAttention(nn.Module):
    """Multi-head self-attention through PyTorch's fused scaled_dot_product_attention.

    The reshapes count heads from the projections' width, not from the config, so that the same code
    runs on a slice of the heads (the Q/K/V projections split column-wise over processes).

    With ``varlen`` (set by ``use_varlen_attention``: batches padded at the end only, as pretraining's
    are) a padded batch on a GPU in bf16/fp16 without attention dropout goes through flash attention's
    variable-length kernel instead of SDPA with a mask (which rules flash out): each row's real tokens
    are one sequence, its padding another, in the batch's own [B·L] layout, so shapes stay static (for
    torch.compile and CUDA graphs) and no real token attends to padding; with a block-diagonal mask
    (``document_mask``: --pack rows of several documents) each document is a sequence. Elsewhere (CPU,
    fp32, dropout) the masked SDPA runs.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.head_dim = h // config.num_attention_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.dropout_p = config.attention_probs_dropout_prob
        self.varlen = False
        self.fused_qkv = True  # see ``project``; ``use_fused_qkv`` turns it off

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K and V, each [B, L, heads, head_dim]. With ``fused_qkv`` one matmul of x by the three weights
        concatenated ([3h, h], made anew at each forward: a copy of 3h² values, small beside the activations,
        and fused into the cast under torch.compile), so that the parameters stay transformers' three (their
        names, checkpoints, optimizer state and the tensor-parallel plan unchanged). Three matmuls where a
        projection is not a plain nn.Linear of plain tensors: LoRA's, 8/4-bit or FP8 layers, or weights split
        over processes (tensor parallelism's DTensors, whose plan computes each projection itself)."""
        B, L, _ = x.shape
        projections = (self.query, self.key, self.value)
        if self.fused_qkv and all(_plain_linear(p) for p in projections):
            weight = torch.cat([p.weight for p in projections])
            bias = torch.cat([p.bias for p in projections])
            return F.linear(x, weight, bias).view(B, L, 3, -1, self.head_dim).unbind(2)
        return tuple(p(x).view(B, L, -1, self.head_dim) for p in projections)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, L, _ = x.shape
        dropout_p = self.dropout_p if self.training else 0.0
        q, k, v = self.project(x)
        if mask is not None and mask.dim() == 1:  # --document-bounds: the kernel's bounds, built once per batch
            return _varlen(q, k, v, mask).reshape(B, L, -1)
        if mask is not None and self.varlen and dropout_p == 0.0 and x.is_cuda and q.dtype in _HALF:
            return _padded_varlen(q, k, v, mask).reshape(B, L, -1)
        # [B, L, heads, head_dim] -> [B, heads, L, head_dim]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return y.transpose(1, 2).reshape(B, L, -1)


_HALF = (torch.bfloat16, torch.float16)


def _plain_linear(module: nn.Module) -> bool:
    """An nn.Linear itself (no subclass: FP8's Float8Linear, LoRA's and bitsandbytes' layers compute otherwise)
    with plain weights (not a tensor subclass: tensor parallelism's DTensor shards); FSDP's gathered weights
    are plain during the forward pass."""
    return (
        type(module) is nn.Linear
        and module.bias is not None
        and type(module.weight) in (torch.Tensor, nn.Parameter)
        and type(module.bias) in (torch.Tensor, nn.Parameter)
    )


def use_fused_qkv(model: nn.Module, on: bool = True) -> None:
    """Compute Q, K and V of ``model``'s BERT attention as one matmul (``on``, the default of a new model) or
    as three (``BertSelfAttention.project``); the parameters are the same either way."""
    for module in model.modules():
        if isinstance(module, BertSelfAttention):
            module.fused_qkv = on


def _padded_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention of [B, L, heads, D] tensors whose rows are real tokens then padding (``mask`` [B, 1, 1, L],
    True at real tokens): 2B variable-length sequences over the flattened [B·L] tokens, row b's real tokens
    [bL, bL + n_b) and its padding [bL + n_b, (b+1)L). A full row's padding is a sequence of length 0.

    With a block-diagonal ``mask`` [B, 1, L, L] (``document_mask``: rows of several documents, then
    padding), each document is a sequence of its own: B·L + 1 bounds, the starts of the documents and of
    the padding in order, then B·L repeated (sequences of length 0), so that the shape is the batch's
    whatever the number of documents (torch.compile, CUDA graphs)."""
    B, L, H, D = q.shape
    if mask.size(2) == 1:
        lengths = mask.reshape(B, L).sum(-1, dtype=torch.int32)
        starts = torch.arange(B, device=q.device, dtype=torch.int32) * L
        bounds = torch.stack([starts, starts + lengths], dim=1).flatten()
    else:  # a token starts a sequence where it is not in the document of the token before it
        same = mask[:, 0].diagonal(offset=-1, dim1=1, dim2=2)  # [B, L - 1]: token i + 1 in token i's document
        new = torch.cat([torch.ones_like(same[:, :1]), ~same], dim=1).flatten()
        index = torch.arange(B * L, device=q.device, dtype=torch.int32)
        bounds = torch.where(new, index, B * L).sort().values
    cu = torch.cat([bounds, torch.full((1,), B * L, device=q.device, dtype=torch.int32)])
    return _varlen(q, k, v, cu)


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """The variable-length kernel over the [B·L] tokens of [B, L, heads, D] tensors, ``cu`` the sequences' int32
    bounds (each sequence at most L tokens long)."""
    B, L, H, D = q.shape
    y = _VARLEN[0](q.reshape(B * L, H, D), k.reshape(B * L, H, D), v.reshape(B * L, H, D), cu, cu, L, L)
    return y.view(B, L, H, D)


def document_bounds(documents: torch.Tensor) -> torch.Tensor:
    """--document-bounds: the variable-length kernel's B·L + 1 int32 bounds of rows whose ``documents`` [B, L]
    number each token's document (0 on padding), the very bounds ``_padded_varlen`` derives from their
    block-diagonal mask in every layer: the starts of the documents and of the padding in order, then B·L repeated.
    Built once per batch from B·L numbers, where the mask is B·L² values."""
    B, L = documents.shape
    new = torch.cat([torch.ones_like(documents[:, :1], dtype=torch.bool), documents[:, 1:] != documents[:, :-1]], 1)
    index = torch.arange(B * L, device=documents.device, dtype=torch.int32)
    bounds = torch.where(new.flatten(), index, B * L).sort().values
    return torch.cat([bounds, torch.full((1,), B * L, device=documents.device, dtype=torch.int32)])


# The kernel, looked up once outside any traced code (torch.compile then sees a plain function, no import).
_VARLEN: list = [None]


@functools.cache
def _varlen_works() -> bool:
    """Whether this torch's variable-length kernel runs here as ``_padded_varlen`` calls it (a GPU, bf16, a
    sequence of length 0 among others): tried once on a tiny batch, forward and backward."""
    if _varlen_attn() is None or not torch.cuda.is_available():
        return False
    _VARLEN[0] = _varlen_attn()
    try:
        q = torch.randn(2, 4, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], device="cuda", dtype=torch.bool)[:, None, None, :]
        _padded_varlen(q, q, q, mask).float().sum().backward()
        torch.cuda.synchronize()
        return bool(torch.isfinite(q.grad).all())
    except Exception:  # noqa: BLE001 - any failure: the masked SDPA path stays
        return False


def use_varlen_attention(model: nn.Module, document_bounds: bool = False) -> bool:
    """Let ``model``'s attention take the variable-length kernel for padded batches (batches padded at the
    end only) where this torch has it and it runs here; return whether it does. ``document_bounds``
    (--document-bounds): --pack's rows of several documents hand it bounds built once per batch."""
    if not _varlen_works():
        return False
    for module in model.modules():
        if isinstance(module, BertSelfAttention):
            module.varlen = True
        if isinstance(module, BertModel):
            module.document_bounds = document_bounds
    return True


class BertDenseAddNorm(nn.Module):
    """Project, dropout, add the residual, LayerNorm: the tail of both BERT sublayers.

    transformers calls it BertSelfOutput after attention and BertOutput after the FFN; the
    parameter names (``dense``, ``LayerNorm``) are the same.
    """

    def __init__(self, config: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.bf16_stream = False  # --bf16-stream: the LayerNorm (and so the residual stream) in bf16 under autocast

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return layer_norm(self.LayerNorm, residual + self.dropout(self.dense(x)), self.bf16_stream)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)  # the name transformers uses: attention.self.query...
        self.output = BertDenseAddNorm(config, config.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT_FNS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertDenseAddNorm(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertPooler(nn.Module):
    """tanh(W · h_[CLS]): the sequence summary that NSP and classification read."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))


def init_weights(module: nn.Module, std: float) -> None:
    """transformers' BertPreTrainedModel._init_weights, for use with ``Module.apply``."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class _Bert(EncoderModel):
    """What every BERT model class declares alike (transformers' names)."""

    bare_names = ("embeddings.", "encoder.", "pooler.")  # the parameters of a bare BERT encoder
    heads_prefix = "bert."  # where a model with heads holds it
    vocab_rows = (
        "embeddings.word_embeddings.weight",
        "predictions.bias",
        "predictions.decoder.weight",
        "predictions.decoder.bias",
    )
    ignored_keys = ("embeddings.position_ids", "embeddings.token_type_ids")

    def use_varlen_attention(self, document_bounds: bool = False) -> bool:
        return use_varlen_attention(self, document_bounds)

    def use_fused_qkv(self, on: bool) -> None:
        use_fused_qkv(self, on)


class BertModel(_Bert):
    """The encoder: embeddings, N layers and (optionally) the pooler."""

    encoder_prefixes = ("embeddings.", "encoder.")

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True, pad_vocab_multiple: int = 1) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config, pad_vocab_multiple)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.apply(partial(init_weights, std=config.initializer_range))
        with torch.no_grad():  # padded vocab rows start (and, never receiving a gradient, stay) zero
            self.embeddings.word_embeddings.weight[config.vocab_size :].zero_()
        # True (``use_document_attention``; pretraining on --pack rows): attention_mask numbers each token's
        # document (1, 2, ...; 0 on padding), and each document is computed as if alone in its row.
        self.documents = False
        self.document_bounds = False  # --document-bounds (use_varlen_attention): see attention_inputs

    def attention_inputs(self, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(the mask the layers take, the position ids or None for 0, 1, ...) of a batch's ``attention_mask``.

        The key-padding mask [B, 1, 1, L], True = attend, broadcast over heads and query positions; None lets
        SDPA pick its fastest kernel when there is no padding at all. With ``documents``, the block-diagonal
        ``document_mask`` [B, 1, L, L] and positions that restart at 0 in each document, as MLPerf's packed
        BERT: each document then gets the very inputs it would get alone in a row ([CLS] at position 0),
        which the learned position embeddings, fine-tuning and the 512-token second phase all assume."""
        if attention_mask is None:
            return None, None
        if self.documents:
            if self.document_bounds and self._takes_varlen(attention_mask):  # the kernel's bounds, once per batch
                return document_bounds(attention_mask), document_positions(attention_mask)
            return document_mask(attention_mask), document_positions(attention_mask)
        return attention_mask.bool()[:, None, None, :], None

    def _takes_varlen(self, attention_mask: torch.Tensor) -> bool:
        """Whether every layer's attention takes the variable-length kernel for this batch (``use_varlen_attention``
        set, a GPU, a half-precision autocast, no attention dropout): its conditions in ``BertSelfAttention``."""
        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        half = torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") in _HALF
        return attention_mask.is_cuda and half and dropout == 0.0

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        pool: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return (sequence_output [B, L, H], pooled_output [B, H] or None without a pooler or ``pool``)."""
        mask, positions = self.attention_inputs(attention_mask)
        x = self.encoder(self.embeddings(input_ids, token_type_ids, positions), mask)
        return x, (self.pooler(x) if self.pooler is not None and pool else None)

    def encoder_layers(self) -> nn.ModuleList | nn.ModuleDict:
        return self.encoder.layer

    def use_documents(self, on: bool) -> None:
        self.documents = on


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT_FNS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """Transform, then score every vocabulary word with the (tied) input embedding matrix.

    The decoder has as many rows as the (possibly padded) embedding matrix; the logits of the
    padded rows are cut off, so callers only ever see the vocab_size real words.
    """

    def __init__(self, config: BertConfig, pad_vocab_multiple: int = 1) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        rows = padded_vocab_size(config.vocab_size, pad_vocab_multiple)
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, rows)
        self.bias = nn.Parameter(torch.zeros(rows))
        self.decoder.bias = self.bias  # one tensor under two names, as in transformers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))[..., : self.vocab_size]  # a view; no copy when unpadded


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, pad_vocab_multiple: int = 1) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config, pad_vocab_multiple)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class _WithEncoder(_Bert):
    """A BERT with heads: the encoder is ``self.bert``."""

    encoder_prefixes = ("bert.embeddings.", "bert.encoder.")
    base_prefix = "bert."
    bert: BertModel

    def encoder_layers(self) -> nn.ModuleList | nn.ModuleDict:
        return self.bert.encoder.layer

    def use_documents(self, on: bool) -> None:
        self.bert.documents = on


class BertForPreTraining(_WithEncoder):
    """BERT with the masked-LM and next-sentence heads.

    ``pad_vocab_multiple`` (64 on GPUs) pads the word embeddings and the tied decoder to a multiple
    of that many rows, for faster matmuls; forward still returns logits over config.vocab_size
    words, and bertgpu.checkpoints.checkpoint saves and loads the vocab_size real rows only.
    """

    # alias -> source: the parameters that are one tensor (stored once on disk, like transformers).
    tied_weights = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
    tied_embedding = ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight")
    mlm_head_prefixes = ("cls.predictions",)
    nsp_head_prefixes = ("cls.seq_relationship",)

    def __init__(self, config: BertConfig, pad_vocab_multiple: int = 1) -> None:
        super().__init__()
        self.config = config
        # False (pretraining under --no-nsp): no pooler and no NSP head run, and the NSP logits are None.
        self.next_sentence = True
        self.bert = BertModel(config, pad_vocab_multiple=pad_vocab_multiple)
        self.cls = BertPreTrainingHeads(config, pad_vocab_multiple)
        self.cls.apply(partial(init_weights, std=config.initializer_range))
        # Tie after init, so the decoder's own random init does not overwrite the embedding.
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def mlm_output_bias(self) -> nn.Parameter:
        return self.cls.predictions.bias

    def use_next_sentence(self, on: bool) -> None:
        self.next_sentence = on
        for module in (self.bert.pooler, self.cls.seq_relationship):
            module.requires_grad_(on)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (mlm_logits, nsp_logits [B, 2], or None when ``next_sentence`` is False).

        mlm_logits is [B, P, V] at ``mlm_positions`` [B, P] when given: only the ~15% masked slots
        go through the transform and the H×V decoder, the largest matmul of a small BERT.
        Otherwise it is [B, L, V].
        """
        x, pooled = self.bert(input_ids, token_type_ids, attention_mask, pool=self.next_sentence)
        if mlm_positions is not None:
            x = torch.gather(x, 1, mlm_positions.unsqueeze(-1).expand(-1, -1, x.size(-1)))
        return self.cls.predictions(x), (self.cls.seq_relationship(pooled) if pooled is not None else None)


class BertForSequenceClassification(_WithEncoder):
    """BERT with a linear classifier on the pooled [CLS] output (or, with ``config.classifier_pooling`` "mean",
    on the mean of the last hidden states over the real tokens)."""

    head_kind = "sequence"
    head_modules = ("classifier",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.classifier, config.initializer_range)

    def encoder_to_load(self) -> nn.Module:
        return self.bert

    def freeze_unread(self) -> None:
        if self.config.classifier_pooling == "mean":
            self.bert.pooler.requires_grad_(False)  # mean pooling reads the hidden states, not the pooler

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return logits [B, num_labels]."""
        mean = self.config.classifier_pooling == "mean"
        x, pooled = self.bert(input_ids, token_type_ids, attention_mask, pool=not mean)
        if mean:
            m = torch.ones(x.shape[:2], device=x.device) if attention_mask is None else attention_mask
            m = m.to(x.dtype).unsqueeze(-1)
            pooled = (x * m).sum(1) / m.sum(1)
        return self.classifier(self.dropout(pooled))


def training_flops_per_sequence(config: BertConfig, seq_len: int, num_predictions: int) -> float:
    """Model FLOPs of one pretraining step for one sequence, matmuls only, for MFU.

    With h = hidden, i = intermediate, L = seq_len, V = vocab, P = num_predictions, n = layers and
    2 FLOPs per multiply-add::

        per layer, per token:  QKV 3·2h² + attention output 2h² + FFN 2·2hi + scores and weighted sum 2·2Lh
        forward = n·L·(8h² + 4hi + 4Lh) + pooler 2h² + NSP 2·2h + P·(transform 2h² + decoder 2hV)
        training = 3 × forward   (the backward pass costs twice the forward)

    Embedding lookups, LayerNorm, softmax and activations are not counted; V is config.vocab_size, not
    the padded rows of ``pad_vocab_multiple`` (their work is no model work).
    """
    h, i, L, V = config.hidden_size, config.intermediate_size, seq_len, config.vocab_size
    per_token = 8 * h * h + 4 * h * i + 4 * L * h
    forward = config.num_hidden_layers * L * per_token + 2 * h * h + 4 * h + num_predictions * (2 * h * h + 2 * h * V)
    return 3.0 * forward


class BertForTokenClassification(_WithEncoder):
    """BERT with a linear classifier on every token's last hidden state (NER, POS: a tag per token), as
    transformers' BertForTokenClassification: no pooler, dropout (classifier_dropout, else hidden_dropout_prob),
    ``classifier`` [H -> num_labels]."""

    head_kind = "token"
    head_modules = ("classifier",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.classifier, config.initializer_range)

    def encoder_to_load(self) -> nn.Module:
        return self.bert

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return logits [B, L, num_labels]."""
        x, _ = self.bert(input_ids, token_type_ids, attention_mask, pool=False)
        return self.classifier(self.dropout(x))


class BertForQuestionAnswering(_WithEncoder):
    """BERT with a start and an end score per token (extractive question answering), as transformers'
    BertForQuestionAnswering: no pooler, no dropout, ``qa_outputs`` [H -> 2]."""

    head_kind = "span"
    head_modules = ("qa_outputs",)

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        check_span_outputs(config.num_labels)
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.qa_outputs, config.initializer_range)

    def encoder_to_load(self) -> nn.Module:
        return self.bert

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return logits [B, L, 2]: each token's start score, then its end score (transformers' start_logits
        and end_logits, stacked on the last dimension)."""
        x, _ = self.bert(input_ids, token_type_ids, attention_mask, pool=False)
        return self.qa_outputs(x)
