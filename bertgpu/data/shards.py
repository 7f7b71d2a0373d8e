"""Prepared data: the memory-mapped token shards that ``bertgpu prepare`` writes (``shard_writer``), read.

Tokenizing once up front keeps the training loop free of text processing. Layout of a prepared
directory:

- ``meta.json``: counts, the vocab fingerprint and the shard list;
- ``vocab.txt``: a copy of the vocab the ids refer to;
- per shard ``shard-NNNNN.tokens`` (raw uint16, or uint32 for vocabs over 65,535 tokens),
  ``shard-NNNNN.sentences`` (int64 cumulative token offsets, one per sentence plus a leading 0) and
  ``shard-NNNNN.documents`` (int64 cumulative sentence offsets, one per document plus a leading 0);
- with ``--zh-wwm`` also ``shard-NNNNN.words``: one bit per token, 1 where the token starts a word
  (``words``: Chinese words as jieba cuts them, and ``##`` pieces), packed 8 to a byte in token order,
  least significant bit first (``np.packbits(..., bitorder="little")``), the last byte padded with 0.

A document never crosses a shard, so a training example drawn from one document reads one file.
Format version 2 added the optional ``.words`` files (and ``word_starts`` in meta.json); version 1
directories, written before, are read as they are.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from functools import cached_property
from pathlib import Path

import numpy as np

from bertgpu.data.tokenizer import vocab_sha256
from bertgpu.errors import UserError

FORMAT = "bertgpu-shards"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: no .words files and no word_starts in meta.json
# The [UNK] share above which prepare refuses the data. With a vocab made for the text it is far below:
# 0.00% for bert-base-uncased's vocab on the Python reference, 0.36% for a 3,000-entry vocab trained on
# People's Daily (its rarest characters); a vocab made for other text gives 63% (bert-base-uncased's on
# People's Daily) to 99% (that Chinese vocab on English). 10% leaves room for corpora with some foreign
# script or symbols and still catches a wrong vocab.
MAX_UNK_SHARE = 0.10


def unk_share(meta: dict) -> float | None:
    """The share of a prepared corpus's tokens that are [UNK] (None for data prepared before it was counted)."""
    if meta.get("unk_tokens") is None or not meta.get("tokens"):
        return None
    return meta["unk_tokens"] / meta["tokens"]


def warn_if_unknown(meta: dict, data_dir: str | os.PathLike) -> None:
    """A warning when the data is mostly [UNK], which prepare only lets through with --max-unk-share."""
    share = unk_share(meta)
    if share is not None and share > MAX_UNK_SHARE:
        warnings.warn(
            f"{share:.1%} of the tokens of {data_dir} are [UNK]: its vocab does not fit the text, and a "
            "model learns little from it (prepare it again with a vocab trained by `bertgpu vocab`)",
            stacklevel=2,
        )


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


class ShardedCorpus:
    """A prepared directory, read-only: sentence lengths and document bounds in memory, tokens memory-mapped.

    Pickles as its directory alone, so DataLoader workers reopen the files themselves instead of
    receiving copies of the index arrays.
    """

    def __init__(self, data_dir: str | os.PathLike):
        self.data_dir = Path(data_dir)
        self.meta = _read_meta(self.data_dir)
        self.vocab_path = self.data_dir / "vocab.txt"
        self.vocab_sha256: str = self.meta["vocab_sha256"]
        self.vocab_size: int = self.meta["vocab_size"]
        self.num_documents: int = self.meta["documents"]
        self.num_sentences: int = self.meta["sentences"]
        self.num_tokens: int = self.meta["tokens"]
        self._dtype = token_dtype(self.vocab_size)
        self._check_files()
        counts = [s["sentences"] for s in self.meta["shards"]]
        self._shard_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._maps: list[tuple[np.memmap, np.memmap]] | None = None
        self._word_maps: list[np.memmap] | None = None

    @property
    def identity(self) -> str:
        """What tells these shards apart from other prepared data: the SHA-256 of their meta.json's values
        (the vocab's hash, the counts of every shard, the input files). A copy of the directory, or the same
        files prepared again alike, has the same identity; a checkpoint records its run's (evaluate reads it)."""
        return hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode("utf-8")).hexdigest()

    @property
    def has_word_starts(self) -> bool:
        """Whether the data was prepared with ``--zh-wwm``: which tokens start a word is stored (``word_starts``)."""
        return bool(self.meta.get("word_starts"))

    def __getstate__(self) -> dict:
        return {"data_dir": self.data_dir}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["data_dir"])

    def _path(self, shard: dict, kind: str) -> Path:
        return self.data_dir / f"{shard['name']}.{kind}"

    def _check_files(self) -> None:
        """Catch a truncated or mixed-up directory here rather than as garbage tokens mid-training."""
        if vocab_sha256(self.vocab_path) != self.vocab_sha256:
            raise UserError(
                f"{self.vocab_path} does not match the vocab in {self.data_dir / 'meta.json'}; re-run `bertgpu prepare`"
            )
        for shard in self.meta["shards"]:
            expected = {
                "tokens": shard["tokens"] * self._dtype.itemsize,
                "sentences": (shard["sentences"] + 1) * 8,
                "documents": (shard["documents"] + 1) * 8,
            }
            if self.has_word_starts:
                expected["words"] = (shard["tokens"] + 7) // 8
            for kind, size in expected.items():
                path = self._path(shard, kind)
                actual = path.stat().st_size if path.is_file() else None
                if actual != size:
                    found = "is missing" if actual is None else f"has {actual:,} bytes, expected {size:,}"
                    raise UserError(
                        f"{path} {found}: the prepared corpus is incomplete or damaged; re-run `bertgpu prepare`"
                    )

    @cached_property
    def sentence_lengths(self) -> np.ndarray:
        """Tokens per sentence (int32), over all shards in order."""
        parts = [np.diff(np.fromfile(self._path(s, "sentences"), dtype=np.int64)) for s in self.meta["shards"]]
        return np.concatenate(parts).astype(np.int32)

    @cached_property
    def doc_offsets(self) -> np.ndarray:
        """Global sentence index where each document starts, plus the total (int64, ``num_documents + 1``)."""
        parts = [
            np.fromfile(self._path(s, "documents"), dtype=np.int64)[:-1] + start
            for s, start in zip(self.meta["shards"], self._shard_starts)
        ]
        return np.concatenate([*parts, [self.num_sentences]]).astype(np.int64)

    def _locate(self, start_sentence: int, end_sentence: int) -> tuple[int, int, int]:
        """(shard, first token, end token) of global sentences ``[start, end)``, token offsets within the shard."""
        shard = int(np.searchsorted(self._shard_starts, start_sentence, side="right")) - 1
        if not (0 <= shard < len(self.meta["shards"])) or not (
            start_sentence < end_sentence <= self._shard_starts[shard + 1]
        ):
            raise IndexError(f"sentences [{start_sentence}, {end_sentence}) are empty, out of range or span two shards")
        if self._maps is None:
            self._maps = [
                (
                    np.memmap(self._path(s, "tokens"), dtype=self._dtype, mode="r"),
                    np.memmap(self._path(s, "sentences"), dtype=np.int64, mode="r"),
                )
                for s in self.meta["shards"]
            ]
        offsets = self._maps[shard][1]
        base = self._shard_starts[shard]
        return shard, int(offsets[start_sentence - base]), int(offsets[end_sentence - base])

    def tokens(self, start_sentence: int, end_sentence: int) -> np.ndarray:
        """Token ids (int64) of global sentences ``[start, end)``, which must lie in one shard.

        Any range inside one document does, since documents never cross shards.
        """
        shard, first, end = self._locate(start_sentence, end_sentence)
        return self._maps[shard][0][first:end].astype(np.int64)

    def word_starts(self, start_sentence: int, end_sentence: int) -> np.ndarray:
        """Whether each token of sentences ``[start, end)`` starts a word (bool), as ``tokens`` gives them.

        Only for data prepared with ``--zh-wwm`` (``has_word_starts``).
        """
        if not self.has_word_starts:
            raise ValueError(f"{self.data_dir} was prepared without --zh-wwm: it stores no word starts")
        shard, first, end = self._locate(start_sentence, end_sentence)
        if self._word_maps is None:
            self._word_maps = [np.memmap(self._path(s, "words"), dtype=np.uint8, mode="r") for s in self.meta["shards"]]
        packed = self._word_maps[shard][first // 8 : (end + 7) // 8]
        skip = first % 8
        return np.unpackbits(packed, bitorder="little")[skip : skip + end - first].astype(bool)


def _read_meta(data_dir: Path) -> dict:
    """``meta.json`` of a prepared directory, checked for the format this code reads."""
    path = data_dir / "meta.json"
    if data_dir.is_file():
        raise UserError(
            f"{data_dir} is a corpus file, not prepared data: run `bertgpu prepare {data_dir} --vocab "
            "VOCAB --out DATA_DIR` first and give DATA_DIR"
        )
    if not data_dir.is_dir():
        raise UserError(f"prepared data directory {data_dir} does not exist; create it with `bertgpu prepare`")
    if not path.is_file():
        if (data_dir / "config.json").is_file() or (data_dir / "checkpoints").is_dir():  # --model and --data swapped?
            raise UserError(
                f"{data_dir} is a model or a run directory, not prepared data (no meta.json): give the directory "
                "`bertgpu prepare` wrote"
            )
        raise UserError(f"{data_dir} is not a prepared corpus (no meta.json); create it with `bertgpu prepare`")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}); re-run `bertgpu prepare`") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{path}: not a {FORMAT} meta file; create the directory with `bertgpu prepare`")
    if meta.get("version") not in READABLE_VERSIONS:
        raise UserError(
            f"{path}: format version {meta.get('version')}, this bertgpu reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}; re-run `bertgpu prepare`"
        )
    return meta
