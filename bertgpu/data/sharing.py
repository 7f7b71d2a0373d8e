"""How a global batch is shared between the data-parallel ranks.

Rank r takes ``sizes[r]`` of the global batch's slots, spread over the batch in proportion: the j-th
of rank r's slots sits (j + 1/2) / sizes[r] of the way through it. Each rank's share is then a sample
of the whole batch (of its lengths, under length grouping), not its first or last part, and equal
sizes give DistributedSampler's stride: rank r takes slots r, r + n, r + 2n, ... Every slot has
exactly one owner, so every instance of a global batch is trained exactly once per step, whatever
the sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def owners(sizes: Sequence[int]) -> np.ndarray:
    """The owning rank of each slot of a global batch of ``sum(sizes)``."""
    keys = sorted(((j + 0.5) / size, rank) for rank, size in enumerate(sizes) for j in range(size))
    return np.array([rank for _, rank in keys], dtype=np.int64)


def share(batch: np.ndarray, sizes: Sequence[int], rank: int) -> np.ndarray:
    """Rank ``rank``'s share of ``batch``: a global batch of ``sum(sizes)`` items, or a shorter last one,
    shared in the same proportions (``shares_of``)."""
    return batch[owners(shares_of(len(batch), sizes)) == rank]


def split(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` slots split in proportion to ``weights``, each rank at least one when there are enough
    (the largest remainders take what is left): a short last global batch shared as a full one would
    be, or per-rank sizes in proportion to measured speeds."""
    n = len(weights)
    floor = 1 if total >= n else 0
    spare = total - floor * n
    raw = [spare * w / sum(weights) for w in weights]
    sizes = [floor + int(r) for r in raw]
    for i in sorted(range(n), key=lambda i: (-(raw[i] - int(raw[i])), i))[: total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def shares_of(length: int, sizes: Sequence[int]) -> list[int]:
    """Each rank's share of a global batch of ``length`` items (``sizes`` for a full one)."""
    return list(sizes) if length == sum(sizes) else split(length, sizes)
