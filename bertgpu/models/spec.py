"""The shape of a registry entry: what the rest of bertgpu asks of an architecture (torchtitan's TrainSpec).

Each architecture's folder makes one (``bertgpu/models/<name>/__init__.py``); ``architectures.py`` collects them.
No torch here: the command line reads the entries before anything heavy is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Architecture:
    """What the rest of bertgpu asks of an architecture, one entry each (``ARCHITECTURES``)."""

    name: str  # --arch, and the config's model_type
    config_class: type  # its EncoderConfig (models/config.py): model_type, title (as a model card names it), nsp
    module: Callable[[], ModuleType]  # its own module (imported when first asked): model classes, FLOPs
    masked_lm_class: str  # transformers' class of a pretraining checkpoint, and ours of that name
    # The fine-tuning heads, transformers' class of each and ours of that name: "sequence" (one output per sequence:
    # a classifier, regression or multi-label), "token" (one per token) and "span" (a start and an end score per
    # token: extractive question answering).
    head_classes: Mapping[str, str]
    tokenizer_json: bool  # transformers reads its tokenizer from tokenizer.json only (no slow one to convert)
    # The linear layers --lora-targets may name (PEFT matches them by the end of a module's name), as its help and
    # errors list them; none: --lora-rank cannot fine-tune it.
    lora_targets: tuple[str, ...]
    presets: tuple[str, ...]  # pretrain --model's preset names
    preset: Callable[[str, int, list[str] | None], Any]  # (name, vocab_size, vocab's tokens) -> its config
    # Activations of the intermediate width that one token's MLP keeps for the backward pass, in units of
    # intermediate_size (memory.py): BERT's input and GELU output of W1; a GeGLU's Wi output (2) and product.
    mlp_widths: int
    # Tensor parallelism of every encoder layer: submodule -> ("colwise" or "rowwise", chunks), chunks > 1 for a
    # weight that stacks that many matrices by rows (split as strided shards: parallel/fused_tp.py).
    tp_plan: Mapping[str, tuple[str, int]]
    tp_fused: str  # what the fused weights are, for --tp's one-line errors ("": none)
    stages: str  # the module (dotted name) that cuts it into pipeline stages: Stage and keep (--pp)
    pooler: bool  # a pooler (tanh(W h_[CLS])) that NSP trains and fine-tuning's --pooling pooler reads
    hf_reads_mean_pooling: bool  # transformers' classifier reads classifier_pooling "mean" from config.json
    # The model card's words for what the classifier reads: with --pooling pooler, with --pooling mean.
    pooling_words: tuple[str, str]

    @property
    def classification_class(self) -> str:
        """transformers' class of a fine-tuned sequence classifier, and ours."""
        return self.head_classes["sequence"]

    @property
    def title(self) -> str:
        return self.config_class.title

    @property
    def nsp(self) -> bool:
        """A next-sentence head (and a pooler) beside the masked-LM head."""
        return self.config_class.nsp
