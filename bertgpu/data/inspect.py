"""``bertgpu inspect``: what the model will be trained on, instance by instance.

The instances are ``PretrainingDataset``'s, the very code ``pretrain`` trains from, built with the same
flags (``DataConfig``) and seed, so instance I of epoch E here is instance I of epoch E there. Printed
as Google's create_pretraining_data prints its examples: the tokens as the model sees them, segment A
and B and whether B is random text, the masked positions and their original tokens. As text, a masked
token is written ``SHOWN{ORIGINAL}`` (``[MASK]{模}``, a random token ``犬{模}`` or the token itself
``模{模}``) and, with ``--wwm``, the tokens of one word are written together (``##`` dropped) and
words apart, so that whole-word masking can be seen; with ``--json``, one object per instance.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import numpy as np

from bertgpu.config import InspectConfig
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset, check_data, warn_wwm_fallback
from bertgpu.data.shards import ShardedCorpus, warn_if_unknown
from bertgpu.data.tokenizer import load_vocab
from bertgpu.errors import UserError


def describe(dataset: PretrainingDataset, vocab: list[str], index: int) -> dict[str, Any]:
    """Instance ``index`` of the dataset's epoch as plain values (what ``--json`` prints)."""
    example = dataset.example(index, word_starts=dataset.cfg.wwm)
    n = int(np.count_nonzero(example["attention_mask"]))  # a --pack row's mask numbers its documents
    ids = example["input_ids"][:n]
    valid = example["mlm_labels"] != IGNORE_INDEX
    labels = example["mlm_labels"][valid]
    out: dict[str, Any] = {
        "index": index,
        "epoch": dataset.epoch,
        "tokens": [vocab[i] for i in ids],
        "input_ids": ids.tolist(),
        "segment_ids": example["token_type_ids"][:n].tolist(),
        "masked_positions": example["mlm_positions"][valid].tolist(),
        "masked_labels": [vocab[i] for i in labels],
        "masked_label_ids": labels.tolist(),
        "is_random_next": bool(example["nsp_label"]),
    }
    if "word_starts" in example:
        out["word_starts"] = example["word_starts"][:n].astype(int).tolist()
    return out


def format_text(instance: dict[str, Any], nsp: bool) -> str:
    """An instance as lines of text: a header, then segment A and segment B (with NSP)."""
    starts = instance.get("word_starts")
    originals = dict(zip(instance["masked_positions"], instance["masked_labels"]))
    tokens = []
    for i, shown in enumerate(instance["tokens"]):
        original = originals.get(i, shown)
        if starts is not None and not starts[i] and original.startswith("##"):  # written inside its word
            original, shown = original[2:], shown.removeprefix("##")
        tokens.append(f"{shown}{{{original}}}" if i in originals else shown)
    first_b = instance["segment_ids"].index(1) if 1 in instance["segment_ids"] else len(tokens)
    if not nsp:
        pairing = "one segment (--no-nsp)"
    else:
        pairing = "B is random text" if instance["is_random_next"] else "B is the text that follows A"

    def join(part: range) -> str:
        words: list[str] = []
        for i in part:
            if words and starts is not None and not starts[i]:
                words[-1] += tokens[i]
            else:
                words.append(tokens[i])
        return " ".join(words)

    lines = [
        f"instance {instance['index']} of epoch {instance['epoch']}: {pairing}; {len(tokens)} tokens, "
        f"{len(instance['masked_positions'])} masked",
        f"  A: {join(range(first_b))}",
    ]
    if nsp:
        lines.append(f"  B: {join(range(first_b, len(tokens)))}")
    return "\n".join(lines)


def packed_fill_line(dataset: PretrainingDataset) -> str:
    """How full --pack's rows are: their real tokens ([CLS] and [SEP] included; no padding) over all rows."""
    real = dataset.fill()
    length = dataset.cfg.max_seq_length
    return (
        f"rows {real.mean() / length:.1%} real tokens on average ({real.mean():.1f} of {length}; "
        f"{int((real == length).sum()):,} of {len(real):,} rows full); "
    )


def instances(cfg: InspectConfig) -> Iterator[dict[str, Any]]:
    """The instances ``cfg`` asks for, as ``describe`` gives them."""
    dataset, vocab = _dataset(cfg)
    for index in range(cfg.index, min(cfg.index + cfg.n, len(dataset))):
        yield describe(dataset, vocab, index)


def _dataset(cfg: InspectConfig) -> tuple[PretrainingDataset, list[str]]:
    corpus = ShardedCorpus(cfg.data.data)
    vocab = load_vocab(corpus.vocab_path)
    dataset = PretrainingDataset(corpus, cfg.data, cfg.seed, vocab)
    dataset.set_epoch(cfg.epoch)
    if cfg.index >= len(dataset):
        raise UserError(
            f"--index {cfg.index} is past the last instance of epoch {cfg.epoch}: {cfg.data.data} gives "
            f"{len(dataset):,} instances there (0 to {len(dataset) - 1:,}) with these flags"
        )
    return dataset, vocab


def check(cfg: InspectConfig) -> None:
    """The flags on their own, before anything is read: the instances' (pretrain's), then which to show."""
    check_data(cfg.data)
    if cfg.epoch < 0 or cfg.index < 0:
        raise UserError(f"--epoch and --index must be at least 0, got {cfg.epoch} and {cfg.index}")
    if cfg.n < 1:
        raise UserError(f"--n must be at least 1, got {cfg.n}")


def run(cfg: InspectConfig, out: TextIO | None = None) -> None:
    """Print the instances ``cfg`` asks for to ``out`` (stdout), as text or JSON Lines."""
    check(cfg)
    out = out or sys.stdout
    dataset, vocab = _dataset(cfg)
    warn_wwm_fallback(dataset.corpus, cfg.data)
    warn_if_unknown(dataset.corpus.meta, cfg.data.data)
    d = cfg.data
    last = min(cfg.index + cfg.n, len(dataset))
    try:
        if not cfg.json:
            flags = (
                [
                    f"--seed {cfg.seed}",
                    f"--max-seq-length {d.max_seq_length}",
                    f"--max-predictions {d.max_predictions}",
                    f"--masked-lm-prob {d.masked_lm_prob:g}",
                    f"--short-seq-prob {d.short_seq_prob:g}",
                ]
                + ["--wwm"] * d.wwm
                + ["--no-nsp"] * (not d.nsp)
                + ["--pack"] * d.pack
                + [f"--pack-attention {d.pack_attention}"] * (d.pack and d.pack_attention != "document")
            )
            words = " (stored words: prepared with --zh-wwm)" if d.wwm and dataset.corpus.has_word_starts else ""
            print(
                f"{d.data}: epoch {cfg.epoch} has {len(dataset):,} instances with {' '.join(flags)}{words}; "
                + (packed_fill_line(dataset) if d.pack else "")
                + f"instances {cfg.index:,} to {last - 1:,} follow. A masked token is written SHOWN{{ORIGINAL}}: "
                "[MASK]{x} 80%, a random token{x} 10%, x{x} 10%"
                + ("; a word's tokens are written together (## dropped), words apart" if d.wwm else ""),
                file=out,
            )
        for index in range(cfg.index, last):
            instance = describe(dataset, vocab, index)
            print(
                json.dumps(instance, ensure_ascii=False) if cfg.json else "\n" + format_text(instance, d.nsp), file=out
            )
        out.flush()
    except BrokenPipeError:  # `bertgpu inspect ... | head`: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        sys.exit(0)
