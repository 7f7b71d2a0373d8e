"""Held-out masked-LM loss curves, as time_to_quality.py measures them, the same way for every side of the race:
through transformers' masked-LM models, masked-token cross-entropy over fixed, seeded maskings of held-out text
packed as run_mlm packs; a curve is the loss of each model a run saved, against the time it was saved at.
"""

from __future__ import annotations

import re
from pathlib import Path


def pack(path: Path, tokenizer, seq: int):
    """run_mlm's group_texts: every line tokenized with [CLS]/[SEP], concatenated, cut into blocks of seq."""
    import torch

    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = [i for enc in tokenizer(lines)["input_ids"] for i in enc]
    n = len(ids) // seq
    return torch.tensor(ids[: n * seq]).view(n, seq)


def heldout_batches(blocks, tokenizer, maskings: int, seed: int):
    """Fixed maskings of the held-out blocks: DataCollatorForLanguageModeling under a seeded torch RNG."""
    import torch
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    torch.manual_seed(seed)
    out = []
    for _ in range(maskings):
        for start in range(0, len(blocks), 64):
            out.append(collator([{"input_ids": b} for b in blocks[start : start + 64]]))
    return out


def heldout_loss(model_dir: Path, batches) -> float:
    import torch
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()  # BertForMaskedLM or ModernBertForMaskedLM
    total = count = 0.0
    with torch.no_grad():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"]).logits
            valid = batch["labels"] != -100
            total += torch.nn.functional.cross_entropy(logits[valid], batch["labels"][valid], reduction="sum").item()
            count += valid.sum().item()
    return total / count


def curve(run_dir: Path, batches) -> list[tuple[float, float]]:
    points = []
    for d in sorted(p for p in run_dir.iterdir() if re.fullmatch(r"t\d{6}\.\d-.*", p.name)):
        points.append((float(d.name[1:9]), heldout_loss(d, batches)))
    return points


def time_to_reach(points: list[tuple[float, float]], target: float) -> float | None:
    """The first time the curve (linearly interpolated) is at or below ``target``."""
    prev = None
    for t, loss in points:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return t
            (t0, l0) = prev
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
        prev = (t, loss)
    return None


def loss_at(points: list[tuple[float, float]], t: float) -> float:
    """The curve's loss at time ``t`` (linear between checkpoints; the last point's after the end)."""
    prev = None
    for when, loss in points:
        if when >= t:
            if prev is None:
                return loss
            return prev[1] + (loss - prev[1]) * (t - prev[0]) / (when - prev[0])
        prev = (when, loss)
    return points[-1][1]
