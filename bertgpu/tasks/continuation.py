"""Continued pretraining: a pretrained model (``pretrain --model DIR`` with weights) trained on, not started afresh.

Its schedule is ``recipe.continuation``'s. What the start lacks is named here (``Start``): a sentence encoder such as
all-MiniLM-L6-v2 ships its encoder alone, so its masked-LM head (BERT's transform and bias; the decoder is the word
embeddings, tied as always) and NSP head start from the initialisation. A fresh head's first gradients are those of a
random predictor, and they flow into the encoder at once; ``EncoderHold`` keeps them out while the learning rate warms
up: the fresh heads train alone, the encoder held still, and it moves only once the heads read its features (LP-FT,
Kumar et al. 2022: a head fitted before the whole model is tuned distorts the pretrained features less). Measured on
MiniLM: docs/pretrain.md, Continued pretraining.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bertgpu.checkpoints import hf_dir
from bertgpu.training.drift import Drift
from bertgpu.training.plan import BudgetSteps, FixedSteps


def _parts(names: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """The modules (or lone parameters) of ``names`` under ``prefixes``, one level below the prefix:
    cls.predictions.transform.dense.weight -> cls.predictions.transform; cls.predictions.bias stays."""
    parts: list[str] = []
    for name in names:
        prefix = next(p for p in prefixes if name.startswith(p))
        head = prefix.rstrip(".")
        part = f"{head}.{name[len(head) :].lstrip('.').split('.')[0]}"
        if part not in parts:
            parts.append(part)
    return parts


def fresh_bias(model: Any, missing: list[str]) -> bool:
    """Whether ``missing`` (names ``model``, a pretraining model, lacked when loaded) holds its masked-LM bias."""
    bias, params = model.mlm_output_bias(), dict(model.named_parameters())
    return bias is not None and any(params.get(name) is bias for name in missing)


class Start:
    """The pretrained start of a continued run: ``path`` (a model directory), and the parameters of ``model``
    (the pretraining model, built) that its weights lack, from the file's keys (``hf_dir.missing_weights``)."""

    def __init__(self, path: Path, model: Any):
        self.path = path
        self.missing = hf_dir.missing_weights(model, path)
        self.mlm = [n for n in self.missing if n.startswith(model.mlm_head_prefixes)]
        self.nsp = [n for n in self.missing if model.nsp_head_prefixes and n.startswith(model.nsp_head_prefixes)]
        self.fresh_bias = fresh_bias(model, self.mlm)
        self.other = [n for n in self.missing if n not in self.mlm and n not in self.nsp]
        self.fresh_lr: tuple[float, str] | None = None  # the fresh heads' peak rate and whence (``lr_factor``)

    def lr_factor(self, peak: float, fresh_lr: tuple[float, str]) -> Callable[[str], float] | None:
        """The rate of each parameter as a multiple of the run's ``peak`` (``optim.build_optimizer``'s
        ``lr_factor``): the fresh heads' ``fresh_lr`` (``recipe.fresh_head_lr``), the rest the run's; None when
        nothing is fresh or the rates are one."""
        if not self.missing or fresh_lr[0] == peak or peak <= 0:
            return None
        self.fresh_lr = fresh_lr
        factor, fresh = fresh_lr[0] / peak, set(self.missing)
        return lambda name: factor if name in fresh else 1.0

    @property
    def fresh_mlm_head(self) -> bool:
        """Whether the masked-LM head (or a part of it) starts from the initialisation."""
        return bool(self.mlm)

    def holds(self, head_warmup: bool, steps: FixedSteps) -> bool:
        """Whether the encoder is held while fresh heads warm up (``EncoderHold``): a masked-LM head to warm up,
        ``head_warmup`` (no --no-head-warmup), and a warmup of a step at least in ``steps`` (the run's plan)."""
        return self.fresh_mlm_head and head_warmup and steps.in_warmup(0)

    def words(self, model: Any, cfg: Any, steps: FixedSteps, measured: Drift | None, evaluated: bool) -> str:
        """What the start line adds on a continuation of ``model`` (``cfg``: its PretrainConfig, ``steps``: its
        plan): the heads the start lacks and the hold, and the harm signal (``measured``: the run's ``Drift``, if
        any; ``evaluated``: whether the run has a held-out set)."""
        held = ""
        if self.holds(cfg.head_warmup, steps):
            by_time = isinstance(steps, BudgetSteps) and steps.optim.warmup < 1
            held = (
                f"the warmup ({steps.optim.warmup:.0%} of the time budget)"
                if by_time
                else f"the warmup's {steps.optim.warmup_steps} steps"
            )
        heads = self.describe(model, cfg.mlm_bias_init, cfg.data.nsp, held)
        if measured is not None:
            signal = (
                f"each evaluation compares the encoder's mean-pooled states on {len(measured)} held-out sequences "
                "with the start's (start CKA, 1 = unchanged; the step-0 evaluation is the start's own loss)"
            )
        elif not evaluated:
            signal = "how far the encoder moves is measured at each evaluation: give --eval-fraction or --eval-data"
        else:
            signal = "how far the encoder moves is not measured (--tp, --pp, or under 8 held-out sequences)"
        return f" (continued pretraining{'; ' + heads if heads else ''}; {signal})"

    def describe(self, model: Any, bias_init: str, nsp: bool, hold: str) -> str:
        """The start line's words for the heads the start lacks and what is done about them ("" when it has all):
        ``bias_init`` the --mlm-bias-init a fresh bias took, ``nsp`` whether NSP trains, ``hold`` how long the
        encoder is held while they warm up ("the warmup's 12 steps"; "": not held)."""
        if not self.missing:
            return ""
        said = []
        if self.mlm:
            parts = ", ".join(_parts(self.mlm, model.mlm_head_prefixes))
            how = "the decoder tied to the word embeddings"
            if self.fresh_bias:
                how += ", the bias " + (
                    "at the text's token frequencies (--mlm-bias-init unigram)"
                    if bias_init == "unigram"
                    else "at zeros"
                )
            said.append(f"no masked-LM head ({parts}): started fresh, {how}")
        if self.nsp:
            parts = ", ".join(p.rstrip(".") for p in model.nsp_head_prefixes)
            said.append(f"no NSP head ({parts}): started fresh" + ("" if nsp else ", unused under --no-nsp"))
        if self.other:  # bert.pooler.dense.weight: its layer
            said.append(f"no {', '.join(dict.fromkeys(n.rsplit('.', 1)[0] for n in self.other))}: started fresh")
        line = "its checkpoint has " + "; ".join(said)
        if self.fresh_lr is not None:
            line += f"; the fresh heads at peak lr {self.fresh_lr[0]:.3g} ({self.fresh_lr[1]})"
        if hold:
            line += f"; the fresh heads train alone for {hold}, the encoder held still (--no-head-warmup: not held)"
        elif self.mlm:
            line += "; the encoder trains beside them from step 1"
        return line


class EncoderHold:
    """The encoder of ``model`` (a pretraining model spread over the processes: ``ParallelModel.model``) held still
    while ``plan`` (``plan.FixedSteps``) is in its warmup: the fresh heads train alone.

    Each held parameter's gradient is zeroed as it is computed (so that clipping's global norm is the heads'),
    and taken away before the optimizer steps (so that the optimizer skips the parameter: no weight decay, and
    Adam's moments and step count start when the encoder joins, as in a fresh optimizer). The step is the
    ``schedule``'s count (the steps done, a resumed run's included). Register it after the optimizer state is
    restored: torch.distributed.checkpoint fills an empty state with a step of its own."""

    def __init__(self, model: Any, optimizer: torch.optim.Optimizer, schedule: Any, plan: Any):
        tied = model.tied_embedding[0] if model.tied_embedding else None  # the pipeline's last stage's copy
        self.params = [
            p
            for name, p in model.named_parameters()
            if p.requires_grad and (name.startswith(model.encoder_prefixes) or name == tied)
        ]
        self.schedule, self.plan = schedule, plan
        self.hooks = [p.register_hook(self._zero) for p in self.params]
        self.step_hook = optimizer.register_step_pre_hook(self._drop)

    def holding(self) -> bool:
        return self.plan.in_warmup(self.schedule.last_epoch)

    def _zero(self, grad: torch.Tensor) -> torch.Tensor | None:
        return torch.zeros_like(grad) if self.holding() else None

    def _drop(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.holding():
            for p in self.params:
                p.grad = None
        elif self.hooks:  # the hold is over for good (the step count only grows): no hook needed on any gradient
            for hook in self.hooks:
                hook.remove()
            self.hooks = []
