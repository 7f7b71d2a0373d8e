"""Each rank's dropout RNG streams: gathered into a checkpoint, and restored from one on resume.

The states are saved for every rank in rank order, with the degrees of parallelism that placed them; a
resumed run on the same layout continues each stream where it stood, one on another layout seeds anew.
"""

from __future__ import annotations

import torch

from bertgpu.parallel.launch import all_gather_object


def gather_rng_states(device: torch.device, layout: tuple[int, ...]) -> dict:
    """Every rank's dropout RNG state (CPU, and CUDA on a GPU), in rank order, for a checkpoint;
    ``layout`` (the degrees of parallelism) says which rank holds which stream."""
    return {
        "layout": list(layout),
        "states": all_gather_object(
            {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}
        ),
    }


def restore_rng_state(saved: dict, rank: int, layout: tuple[int, ...], device: torch.device, seed: int) -> None:
    """This rank's RNG from ``gather_rng_states``. On another layout the streams start anew, seeded
    by ``seed`` (the same on the processes of a tensor-parallel group, so their dropout agrees)."""
    if list(saved.get("layout", ())) != list(layout):
        torch.manual_seed(seed)
        return
    state = saved["states"][rank]
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
