"""One DataLoader for a whole pretraining run, its worker processes kept from epoch to epoch.

A DataLoader per epoch forks its workers anew each epoch (and each --balance change), and the device
waits while they start and fill their queues. Here the loader lives as long as the run, with
``persistent_workers``: the loop hands ``RunBatches`` each epoch's ``GlobalBatchSampler`` and iterates
the same loader again. Each index travels with its epoch (``EpochIndexed``), so a worker, which holds a
copy of the dataset made when it started, draws the instances of the epoch the loop is in.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator

import torch


class EpochIndexed(torch.utils.data.Dataset):
    """``dataset[(epoch, index)]``: instance ``index`` of ``epoch`` (``set_epoch`` first, where it changed)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        self.dataset.set_epoch(epoch)  # a no-op within an epoch
        return self.dataset[index]


class RunBatches(torch.utils.data.Sampler):
    """The loader's batch sampler for the whole run: the batches of the sampler ``set`` last, each index
    paired with that sampler's epoch."""

    def __init__(self):
        self.sampler, self.epoch = None, 0

    def set(self, sampler: torch.utils.data.Sampler, epoch: int) -> None:
        self.sampler, self.epoch = sampler, epoch

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.epoch
        for batch in self.sampler:
            yield [(epoch, i) for i in batch]


def _loader_worker_init(worker_id: int) -> None:
    """A forked loader worker leaves stop signals to its training process and closes the TCP connections it
    inherited (gloo's, the rendezvous store's): held open here, a killed rank's peers would learn of its death
    only when this worker notices its parent is gone (torch checks every 5 s), not at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: nothing inherited is closed, the peers learn of a death later
        return
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # not a socket (or the listing's own, already closed)
            continue
        family = sock.family
        sock.detach()  # the fd stays open until closed below: detach only stops this object owning it
        if family in (socket.AF_INET, socket.AF_INET6):
            os.close(fd)  # this process's copy only: the training process's connection stays open


def run_loader(dataset, workers: int, pin_memory: bool, seed: int) -> tuple[torch.utils.data.DataLoader, RunBatches]:
    """The run's DataLoader over ``dataset`` and the batch sampler to ``set`` before each ``iter(loader)``."""
    batches = RunBatches()
    loader = torch.utils.data.DataLoader(
        EpochIndexed(dataset),
        batch_sampler=batches,
        num_workers=workers,
        pin_memory=pin_memory,
        prefetch_factor=4 if workers else None,
        persistent_workers=workers > 0,
        worker_init_fn=_loader_worker_init if workers else None,
        # Forked, as under torchrun: our own launcher spawns the training processes, whose children would
        # otherwise be spawned too and import torch afresh (2-3 s per start on 2 cores).
        multiprocessing_context="fork" if workers and sys.platform == "linux" else None,
        # Its own generator: creating the iterator must not draw from the dropout RNG stream,
        # or a resumed run would drift from the uninterrupted one.
        generator=torch.Generator().manual_seed(seed),
    )
    return loader, batches
