"""What bertgpu asks of a model, whatever its architecture: the class every model class derives from.

The tasks, ``hf_dir``, ``checkpoint`` and ``parallel/`` read these attributes and call these methods, each
declared here with its default, so that none of them probes a model with ``getattr``/``hasattr`` or asks
which architecture it is (``bertgpu.models.architectures`` holds what is per architecture beside the classes).
Pure declarations: no files, no processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn


class EncoderModel(nn.Module):
    """A model of an architecture: a bare encoder, or one with heads (masked LM, classification)."""

    config: Any
    # alias -> source: the parameters that are one tensor (stored once on disk, like transformers).
    tied_weights: ClassVar[dict[str, str]] = {}
    # (the decoder's weight, the input embedding's): a masked-LM head tied to the embeddings, which the pipeline's
    # first and last stages each hold a copy of; None without a masked-LM head.
    tied_embedding: ClassVar[tuple[str, str] | None] = None
    # The parameters a pretrained checkpoint must supply (the encoder's); any other missing one keeps its
    # initialisation (a fresh head).
    encoder_prefixes: ClassVar[tuple[str, ...]] = ()
    # The masked-LM head's parameters (a pretraining model's): missing, the checkpoint cannot fill masks.
    mlm_head_prefixes: ClassVar[tuple[str, ...]] = ()
    # The next-sentence head's parameters (a pretraining model's that has one): missing, NSP is not evaluated.
    nsp_head_prefixes: ClassVar[tuple[str, ...]] = ()
    # The ends of the names of the tensors with one row per vocabulary word: a file holds config.vocab_size rows
    # of each, a model built with pad_vocab_multiple more (hf_dir cuts and pads them).
    vocab_rows: ClassVar[tuple[str, ...]] = ()
    # The ends of the names of tensors some transformers versions saved beside the weights (buffers computed on
    # the fly here): skipped when a file loads, not reported as unexpected.
    ignored_keys: ClassVar[tuple[str, ...]] = ()
    # Where this class holds its bare encoder ("bert.", "model."; "" when it is one), and the first names of the
    # bare encoder's parameters: a file of a bare encoder loads into a model with heads and the other way round.
    base_prefix: ClassVar[str] = ""
    bare_names: ClassVar[tuple[str, ...]] = ()
    # The prefix a file of a model with heads gives the encoder (transformers' base_model_prefix, with its dot):
    # stripped when such a file loads into a bare encoder.
    heads_prefix: ClassVar[str] = ""
    # A fine-tuning model's head: its kind (the registry's key, ``Architecture.head_classes``: "sequence", "token",
    # "span"; None for a bare encoder or a pretraining model) and its modules, the new layers on top of the encoder
    # that LoRA trains whole beside its adapters (PEFT's modules_to_save).
    head_kind: ClassVar[str | None] = None
    head_modules: ClassVar[tuple[str, ...]] = ()

    # Set on this process's model by parallel.pipeline, when it holds pipeline stages: the optimizer state names
    # of a tied copy (saved under the original's), and how to gather the whole model's weights from every stage.
    optimizer_aliases: dict[str, str] = {}
    gather_stages: Callable[[], dict[str, torch.Tensor] | None] | None = None

    def encoder_layers(self) -> nn.ModuleList | nn.ModuleDict:
        """The encoder layers (what tensor parallelism, activation checkpointing, compile and FSDP wrap one at
        a time): a ModuleList, or a pipeline stage's ModuleDict of the layers it keeps (keyed by index)."""
        raise NotImplementedError

    def use_documents(self, on: bool) -> None:
        """Read ``attention_mask`` as document numbers (--pack rows) and keep attention within each
        (``on``), or as the 0/1 key padding."""
        raise NotImplementedError

    def use_flex_attention(self) -> None:
        """Attend through FlexAttention (CUDA) where the architecture has it and the model attends through
        SDPA; elsewhere nothing."""

    def use_varlen_attention(self, document_bounds: bool = False) -> bool:
        """Let attention take flash attention's variable-length kernel for batches padded at the end (a GPU)
        where the architecture has that path and this torch runs it here; return whether it does. With
        ``document_bounds`` (--document-bounds), rows of several documents give the kernel their bounds built once
        per batch from the document numbers, where the architecture builds them."""
        return False

    def use_fused_qkv(self, on: bool) -> None:
        """Compute Q, K and V as one matmul (``on``) or as three, the parameters the same either way; nothing
        where they are one weight already."""

    def use_next_sentence(self, on: bool) -> None:
        """Run the next-sentence head and what only it reads (``on``), or not (pretraining under --no-nsp): then
        neither runs nor gets a gradient, so no process of a data-parallel run waits for one, and the NSP
        logits are None. Nothing for a model without one."""

    def mlm_output_bias(self) -> nn.Parameter | None:
        """The masked-LM decoder's bias (one per vocabulary row, padded rows included), or None: a model
        without a masked-LM head, or whose decoder has no bias."""
        return None

    def encoder_to_load(self) -> nn.Module:
        """What a pretrained checkpoint's weights load into when the head is fresh (a classifier's encoder)."""
        return self

    def freeze_unread(self) -> None:
        """Stop the gradients of parameters that the forward pass does not read (a pooler under mean
        pooling): no process of a data-parallel run may wait for one."""
