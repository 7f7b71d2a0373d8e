"""The model a command is given: a BERT directory, or a `bertgpu pretrain` run, which means its newest checkpoint."""

from __future__ import annotations

import os
import re
from pathlib import Path

from torch import nn

from bertgpu.checkpoints import checkpoint, hf_dir
from bertgpu.data.tokenizer import load_vocab
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.config import EncoderConfig
from bertgpu.tasks.classifier import model_vocab

# A Hugging Face Hub model's name, as users pass it to from_pretrained: ORG/NAME, or one of the first models' names
# that have no organisation (bert-base-uncased, roberta-base, distilbert-base-uncased, xlm-roberta-base).
_HUB_NAME = re.compile(
    r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*|(?:bert|roberta|distilbert|distilroberta|albert|xlm|camembert)(?:-[\w.]+)+"
)


def hub_hint(name: str) -> str:
    """For a --model that names no file but looks like a Hub model: how to put it on the disk with the hub's own
    tools, to add to the line that says it is not there (bertgpu never downloads); '' for any other name."""
    if os.path.exists(name) or not _HUB_NAME.fullmatch(name):
        return ""
    local = name.rsplit("/", 1)[-1]
    return (
        f"; bertgpu reads models from disk: `huggingface-cli download {name} --local-dir {local}` (or `hf "
        f"download`, the same arguments), then --model {local}/"
    )


def model_directory(path: str) -> Path:
    """``path``, or the newest checkpoint when it is a `bertgpu pretrain` run directory."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise UserError(
            f"{path}: no such directory (a BERT directory: config.json, model.safetensors, vocab.txt)" + hub_hint(path)
        )
    if not (model_dir / "config.json").is_file():
        newest = checkpoint.latest_checkpoint(model_dir)
        if newest is None:
            raise UserError(
                f"{path} has no config.json: not a BERT directory, nor a `bertgpu pretrain` run with a checkpoint"
            )
        model_dir = newest
    return model_dir


def check_model_dir(path: str) -> tuple[Path, EncoderConfig]:
    """A BERT directory with config.json, model.safetensors and vocab.txt."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise UserError(
            f"--model {path}: no such directory (a BERT directory: config.json, model.safetensors, vocab.txt)"
            + hub_hint(path)
        )
    if not (model_dir / "config.json").is_file():
        newest = checkpoint.latest_checkpoint(model_dir)
        if newest is None:
            raise UserError(
                f"--model {path} has no config.json: not a BERT directory, nor a `bertgpu pretrain` run "
                "with a checkpoint"
            )
        model_dir = newest  # a pretraining run's --out: its newest checkpoint, as finetune's start line says
    config = architectures.load_config(model_dir)
    if not (model_dir / hf_dir.WEIGHTS_NAME).is_file():
        if (model_dir / "pytorch_model.bin").is_file():
            raise UserError(
                f"{model_dir} holds only pytorch_model.bin, a pickle that can run code when loaded; "
                f"convert it to model.safetensors first "
                f"(in transformers: from_pretrained, then save_pretrained)"
            )
        raise UserError(
            f"{model_dir} has no {hf_dir.WEIGHTS_NAME}: fine-tuning starts from trained weights "
            f"(a `bertgpu pretrain` checkpoint or a Hugging Face BERT directory)"
        )
    hf_dir.check_weights(model_dir)
    vocab_size = len(load_vocab(model_vocab(model_dir)))
    if vocab_size > config.vocab_size:
        raise UserError(
            f"{model_dir / 'vocab.txt'} has {vocab_size} tokens, more than the model's vocab_size "
            f"{config.vocab_size} (config.json): the vocab is not this model's"
        )
    return model_dir, config


def load_masked_lm(model_dir: Path, config: EncoderConfig, needs: str) -> tuple[nn.Module, list[str]]:
    """The pretraining model of ``model_dir`` with its weights and the names it lacked; one line when it has
    no masked-LM head (``needs``: who needs one, e.g. "fill-mask")."""
    model = architectures.pretraining_model(config)
    missing, _ = hf_dir.load_weights(model, model_dir)
    if architectures.mlm_head_missing(model, missing):
        head = ", ".join(prefix.rstrip(".") + ".*" for prefix in model.mlm_head_prefixes)
        if config.id2label:  # a classifier: say so, not "only an encoder"
            labels = ", ".join(config.id2label.values())
            raise UserError(
                f"{model_dir} is a classifier (labels {labels}) with no masked-LM head ({head}): {needs} "
                "needs a pretraining checkpoint, such as the one it was fine-tuned from"
            )
        raise UserError(
            f"{model_dir} has no masked-LM head ({head}), only an encoder: {needs} needs a "
            "pretraining checkpoint, BertForMaskedLM or BertForPreTraining"
        )
    return model, missing
