"""`bertgpu fill-mask`: the top-k tokens, with probabilities, for each [MASK] of a text.

The quickest sanity check of a pretrained model, as transformers' fill-mask pipeline: a model that
learned something fills "the capital of france is [MASK]." with a city.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from bertgpu.config import FillMaskConfig
from bertgpu.data.encoding import decode_text
from bertgpu.data.tokenizer import Tokenizer
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.interface import EncoderModel
from bertgpu.parallel import launch
from bertgpu.tasks import model_dirs
from bertgpu.tasks.checks import check_fill_mask_flags
from bertgpu.tasks.classifier import model_lowercase, model_vocab

MASK = "[MASK]"


def load_masked_lm(path: str, device: torch.device) -> tuple[EncoderModel, Tokenizer, Path]:
    """The model with its masked-LM head, its tokenizer and its directory; one line when it has no such head."""
    model_dir = model_dirs.model_directory(path)
    config = architectures.load_config(model_dir)
    model, _ = model_dirs.load_masked_lm(model_dir, config, "fill-mask")
    tokenizer = Tokenizer(model_vocab(model_dir), model_lowercase(model_dir))
    return model.to(device).eval(), tokenizer, model_dir


@torch.no_grad()
def fill_mask(model: EncoderModel, tokenizer: Tokenizer, text: str, top_k: int = 5) -> list[dict[str, Any]]:
    """For each [MASK] of ``text`` in order: its position and the ``top_k`` tokens with their probabilities."""
    pieces = text.split(MASK)
    if len(pieces) == 1:
        raise UserError(f"no {MASK} in {text!r}: write {MASK} where a token is to be predicted")
    # The text between the [MASK]s is tokenized alone: the normalizer would lower-case "[MASK]" and the
    # pre-tokenizer split it into "[", "mask", "]".
    ids = [tokenizer.cls_id]
    for n, piece_ids in enumerate(tokenizer.encode_batch(pieces)):
        ids += ([tokenizer.mask_id] if n else []) + piece_ids
    ids.append(tokenizer.sep_id)
    if len(ids) > model.config.max_position_embeddings:
        raise UserError(
            f"the text is {len(ids)} tokens long, more than the model's "
            f"{model.config.max_position_embeddings} positions"
        )
    positions = [i for i, token in enumerate(ids) if token == tokenizer.mask_id]
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=device)
    logits, _ = model(
        input_ids, torch.zeros_like(input_ids), torch.ones_like(input_ids), torch.tensor([positions], device=device)
    )
    probs = logits[0].float().softmax(-1)
    top = probs.topk(min(top_k, probs.size(-1)), dim=-1)
    return [
        {
            "position": position,
            "tokens": [tokenizer.vocab[i] for i in top.indices[k].tolist()],
            "probabilities": [round(p, 6) for p in top.values[k].tolist()],
        }
        for k, position in enumerate(positions)
    ]


def texts_of(cfg: FillMaskConfig) -> list[str]:
    """The texts given, or the non-blank lines of --input (``-``: standard input)."""
    if not cfg.input:
        return list(cfg.text)
    if cfg.input == "-":
        lines = sys.stdin.read().splitlines()
    else:
        try:
            data = Path(cfg.input).read_bytes()
        except OSError as e:
            raise UserError(f"--input {cfg.input}: {e.strerror or e}") from None
        lines = decode_text(data, cfg.input, "--input").splitlines()
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise UserError(f"--input {cfg.input} holds no text")
    return texts


def run(cfg: FillMaskConfig) -> list[list[dict[str, Any]]]:
    cfg = check_fill_mask_flags(cfg)
    texts = texts_of(cfg)
    device = torch.device(launch.resolve_device(cfg.device))
    model, tokenizer, _ = load_masked_lm(cfg.model, device)
    every = []
    for number, text in enumerate(texts, 1):
        results = fill_mask(model, tokenizer, text, cfg.top_k)
        every.append(results)
        if len(texts) > 1 and not cfg.json:
            print(("\n" if number > 1 else "") + text)
        for n, result in enumerate(results, 1):
            if cfg.json:
                shown = {"text": text, "number": number, **result} if len(texts) > 1 else result
                print(json.dumps(shown, ensure_ascii=False))
            else:
                candidates = "  ".join(f"{t} {p:.4f}" for t, p in zip(result["tokens"], result["probabilities"]))
                print(f"[MASK] {n}: {candidates}")
    return every
