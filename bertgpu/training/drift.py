"""How far continued pretraining has moved an encoder from its start: the harm signal the held-out loss cannot give.

A pretrained model continued at a from-scratch rate can lose what it learned while its held-out masked-LM loss reads
the same as a gentle run's (issue 60: MiniLM continued at 1.4e-3 and at 1e-4 both ended at 7.43; fine-tuned, the
first scored 0.361, the second 0.969). What the first run destroyed is the encoder's representation of text, which
the loss of a head trained on top of it does not see. So a continuation compares representations: at every
held-out evaluation, the mean-pooled last hidden states of a fixed set of held-out sequences (the first
``SEQUENCES`` of the evaluation set, their masks undone: the text as a classifier would read it) against those of
the start, by linear CKA (Kornblith et al. 2019, "Similarity of Neural Network Representations Revisited"):

    CKA(X, Y) = <Kc, Lc> / (|Kc| |Lc|),   Kc, Lc the centered Gram matrices X X^T, Y Y^T of the n sequences

1 when the sequences lie as they did relative to one another (any rotation or scaling of the space keeps it: a
fine-tuned head learns those anew), towards 0 as the geometry is lost. Centering removes the one direction all of a
BERT's sentence vectors share, which keeps a plain cosine similarity high whatever happens. The start is kept as its
centered Gram matrix (n x n, not a copy of the model), computed once before step 1 and saved in every checkpoint, so
that a resumed run measures against the same start.

Every process runs the same forward passes on the same sequences (FSDP's all-gathers need every rank), so all get
the same figure; the layouts that cut the encoder's output apart (--tp, --pp) do not measure it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bertgpu.data.heldout import EvalSet
from bertgpu.data.pretraining import IGNORE_INDEX
from bertgpu.training.precision import autocast

KEY = "eval_start_cka"  # the log's and the model card's name of the figure
SEQUENCES = 256  # held-out sequences compared: a few seconds of forward passes, a Gram matrix of 0.5 MB
MIN_SEQUENCES = 8  # fewer: CKA of a handful of points says little
STATE_KEY = "drift_start_gram"  # the checkpoint's (training_state.pt) copy of the start's centered Gram matrix
# Below this similarity the encoder has lost much of its start's geometry: one warning says so. MiniLM on the Python
# reference (docs/pretrain.md: Continued pretraining): 0.97-0.99 after 20-40 steps at 1e-4, 0.21 after 20 steps at
# 1.4e-3; a long gentle run moves further, so the line sits well below the gentle figures.
WARN_BELOW = 0.5
_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "mlm_positions")


def centered_gram(features: torch.Tensor) -> torch.Tensor:
    """The centered Gram matrix (float64, n x n) of ``features`` [n, h]: the inner products of the sequences'
    vectors after the mean vector is taken off."""
    x = features.double()
    x = x - x.mean(0, keepdim=True)
    return x @ x.T


def cka(gram_a: torch.Tensor, gram_b: torch.Tensor) -> float:
    """Linear CKA of two centered Gram matrices of the same sequences, in [0, 1] (0 where either is all zeros)."""
    norms = gram_a.norm() * gram_b.norm()
    return float((gram_a * gram_b).sum() / norms) if norms > 0 else 0.0


def unmasked(instance: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A pretraining instance with its masked (and randomly replaced) tokens put back: the text itself."""
    ids = np.array(instance["input_ids"], copy=True)
    labels, positions = np.asarray(instance["mlm_labels"]), np.asarray(instance["mlm_positions"])
    kept = labels != IGNORE_INDEX
    ids[positions[kept]] = labels[kept]
    return {**instance, "input_ids": ids}


def measurable(layout: Any) -> bool:
    """Whether every process of ``layout`` (a ParallelDims) computes the whole encoder output of a sequence."""
    return layout.tp == 1 and layout.pp == 1


class Drift:
    """The similarity of the encoder to its start on the first SEQUENCES sequences of ``eval_set``.

    ``start``: the start's centered Gram matrix saved by a checkpoint (a resumed run), else None: the first
    measurement (the step-0 evaluation, before step 1) takes the model's as it is then. ``keep``: the state every
    checkpoint of the run saves (the task's ``fixed``), where the start's goes under STATE_KEY once known. (Not
    computed before the run's optimizer exists: a forward pass before it leaves FSDP's optimizer state unreadable.)"""

    def __init__(self, eval_set: EvalSet, start: torch.Tensor | None, keep: dict[str, Any], sequences: int = SEQUENCES):
        self.instances = [unmasked(eval_set.instance(k)) for k in range(min(sequences, len(eval_set)))]
        self.start, self.keep = start, keep
        if start is not None:
            keep[STATE_KEY] = start
        self.warned = False

    def __len__(self) -> int:
        return len(self.instances)

    @torch.no_grad()
    def features(self, net: Any, device: torch.device, batch_size: int, precision: str) -> torch.Tensor:
        """The mean over its real tokens of each sequence's last hidden states [n, hidden], from ``net`` (a
        ParallelModel of a pretraining model): its whole forward pass runs (as the held-out evaluation's), and a
        hook on the bare encoder (``EncoderModel.base_prefix``) keeps the hidden states."""
        model = net.model
        encoder = model.get_submodule(model.base_prefix.rstrip(".")) if model.base_prefix else model
        kept: list[torch.Tensor] = []
        hook = encoder.register_forward_hook(
            lambda module, args, output: kept.append(output[0] if isinstance(output, tuple) else output)
        )
        was_training = net.training
        net.eval()
        pooled = []
        try:
            with torch.compiler.set_stance("force_eager"):  # as evaluate_mlm: no recompiling for these shapes
                for first in range(0, len(self.instances), batch_size):
                    rows = self.instances[first : first + batch_size]
                    batch = {k: v.to(device) for k, v in torch.utils.data.default_collate(rows).items()}
                    kept.clear()
                    with autocast(precision, device):
                        net(*(batch[k] for k in _INPUTS))
                    mask = (batch["attention_mask"] > 0).unsqueeze(-1).float()  # --pack numbers its documents
                    hidden = kept[-1].float()
                    pooled.append((hidden * mask).sum(1) / mask.sum(1).clamp(min=1))
        finally:
            hook.remove()
            net.train(was_training)
        return torch.cat(pooled).cpu()

    def measure(self, net: Any, device: torch.device, batch_size: int, precision: str) -> dict[str, float]:
        """``{KEY: similarity}`` of the model now to the start; the first call of a run not resumed measures the
        start itself (every process calls this together)."""
        now = centered_gram(self.features(net, device, batch_size, precision))
        if self.start is None:
            self.start = self.keep[STATE_KEY] = now
        return {KEY: cka(now, self.start)}

    def note(self, similarity: float, step: int) -> tuple[str, str]:
        """What the evaluation line of ``step`` adds: the figure, and once, below WARN_BELOW, a warning line."""
        text = f" | start CKA {similarity:.3f}"
        if similarity >= WARN_BELOW or self.warned:
            return text, ""
        self.warned = True
        return text, (
            f"\nbertgpu: warning: at step {step:,} the encoder's representations have moved far from its start's "
            f"(CKA {similarity:.2f} on {len(self)} held-out sequences; 1 = unchanged): fine-tuned, it may score below "
            "the model it started from; continued pretraining usually takes ~1e-4 (--lr)"
        )
