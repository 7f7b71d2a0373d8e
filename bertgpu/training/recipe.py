"""`--recipe fast`: the values it sets, bf16 on CPUs, and its learning rate and warmup for the model's size and batch
(and its architecture: the model config's ``fast_lr_factor``, ``fast_adam_beta2`` and ``fast_warmup``).

BERT's default peak rate, 1e-4, is right for `base` at BERT's batch of 256 and far too low for the small
models and batches a short run uses. The fast recipe takes the rate that reached the lowest held-out loss in
``benchmarks/lr_sweep.py`` (BENCHMARKS.md: short fixed-step runs per size at a global batch of ``SWEEP_BATCH``)
for the model's size, interpolated between the sizes swept by the parameters of the encoder's layers, and
scales it to the run's global batch with ``--lr-scaling`` (sqrt unless linear is asked for). The sweep's runs
were short (120-300 steps at tiny and mini): the architecture's config scales its rate for the runs the recipe
serves (BERT by 1, ModernBERT by 2) and sets the warmup. A ``--lr`` or
``--warmup`` the user gives wins (as for every value of the recipe: one that differs from the BERT default).

A continuation (``--model`` a directory with weights: a pretrained model trained on) takes neither recipe's rate:
both choose ``CONTINUATION_LR`` at ``CONTINUATION_BATCH`` and ``CONTINUATION_WARMUP`` (docs/pretrain.md: Continued
pretraining), its fresh heads ``fresh_head_lr``, and a rate the user gives far above it is warned about
(``continuation_warning``).

Every decision the recipe makes is here: the data and model values it sets where a run is planned
(``apply_fast_recipe``, which ``tasks/pretrain.run`` calls first), bf16 on CPUs that compute it (``cpu_bf16``), and
the learning rate and warmup (``choose``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

from bertgpu.models import architectures
from bertgpu.training.batch import scaled_lr

# The global batch of the sweep: the table's rates are for this batch.
SWEEP_BATCH = 32
# Peak learning rate at SWEEP_BATCH by (layers, hidden): the lowest held-out loss in the sweep (BENCHMARKS.md;
# within 0.01 nats of it, the larger rate: the runs the recipe serves are longer than the sweep's). tiny and mini
# ran at batch 32, 300 and 120 steps; small, medium and base at batch 8 (60, 30, 12 steps), their rates brought to
# 32 by the square-root rule. medium's and base's best were the largest rates tried.
SWEPT_LR: dict[str, tuple[tuple[int, int], float]] = {
    "tiny": ((2, 128), 1e-3),
    "mini": ((4, 256), 1e-3),
    "small": ((4, 512), 1e-3),
    "medium": ((8, 512), 1e-3),
    "base": ((12, 768), 5e-4),
}
# Continued pretraining (a pretrained start, not a --resume): the peak rate and warmup of task-adaptive pretraining
# (Gururangan et al. 2020, "Don't Stop Pretraining": RoBERTa-base continued at 1e-4 with a 6% warmup, batch 256),
# whatever the recipe, not a from-scratch rate: a pretrained encoder sits where a from-scratch rate throws it out
# (issue 60: MiniLM continued at --recipe fast's 1.41e-3 fine-tuned to 0.361 where it scored 0.969 as shipped).
# The paper's rate is for its batch: linearly scaled to the run's global batch (--lr-scaling linear from
# CONTINUATION_BATCH), each example moves the encoder as much as in the paper. Unscaled, 1e-4 at batch 32 moved
# MiniLM to start CKA 0.84 in 10 minutes, past where its pooler fits (a pair task lost 2.7 points; docs/
# experiments.md); at 1.25e-5 it stays at 0.985. One rate for every size: the sweep's from-scratch rates differ by 2x
# from tiny to base, small beside the 10x a from-scratch rate is above this one, and a continuation exists not to
# move far. The heads the start lacks learn at a from-scratch rate (``fresh_head_lr``).
CONTINUATION_LR = 1e-4
CONTINUATION_BATCH = 256
CONTINUATION_WARMUP = 0.06
# A peak rate above this multiple of CONTINUATION_LR on a pretrained start is a from-scratch one: warned about.
FROM_SCRATCH_FACTOR = 3


def fast_recipe(cfg: Any) -> bool:
    """Whether ``cfg`` (a PretrainConfig) is a pretraining run under --recipe fast."""
    return cfg.recipe == "fast"


def cpu_bf16(cfg: Any) -> bool:
    """Whether --precision auto takes bf16 autocast on a CPU that multiplies bf16 in hardware
    (``precision.resolve_precision``): under --recipe fast, the one decision every part that resolves the
    precision asks for."""
    return fast_recipe(cfg)


def apply_fast_recipe(cfg: Any) -> Any:
    """``cfg`` (a PretrainConfig) as --recipe fast plans it: each field the user did not give changed
    (``PretrainConfig.gave``; a flag given wins, even at BERT's default value; docs/pretrain.md: The fast
    recipe), some to the values of ``cfg.arch``'s architecture. Applying it twice changes nothing more."""
    if not fast_recipe(cfg):
        return cfg
    cfg = copy.deepcopy(cfg)
    arch = architectures.CONFIGS.get(cfg.arch, architectures.CONFIGS[architectures.DEFAULT])
    data = cfg.data
    if not data.nsp and not cfg.gave("pack", data.pack, False):
        data.pack = True  # no sequence mostly padding: 117 real tokens of 128 instead of 39 on short documents
    if not cfg.gave("masked_lm_prob", data.masked_lm_prob, 0.15):
        data.masked_lm_prob = 0.3  # MosaicBERT: 30% masking beats 15%
        if not cfg.gave("max_predictions", data.max_predictions, 20):  # BERT's 20 slots for 15% of 128
            data.max_predictions = max(20, -(-round(0.3 * data.max_seq_length) // 8) * 8)
    if cfg.dropout is None:
        cfg.dropout = 0.0  # Cramming: no dropout when every token is seen about once
    if not cfg.gave("mlm_bias_init", cfg.mlm_bias_init, "zeros"):
        cfg.mlm_bias_init = arch.fast_mlm_bias_init  # BERT: start on the unigram plateau, not at log(vocab)
    return cfg


def with_arch(cfg: Any, arch: str) -> Any:
    """``cfg`` (a PretrainConfig built for --arch's default) as a run of ``arch``, the architecture of the directory
    or config.json it continues from: the values --recipe fast takes from the architecture chosen again for it (the
    masked-LM bias), where the user gave none."""
    again = {} if "mlm_bias_init" in cfg.given else {"mlm_bias_init": _default(cfg, "mlm_bias_init")}
    return apply_fast_recipe(dataclasses.replace(cfg, arch=arch, **again))


def _layer_params(layers: int, hidden: int) -> float:
    """The weights of the encoder's layers (4 h^2 of attention, 8 h^2 of feed-forward each): what sets the size."""
    return 12 * layers * hidden**2


def swept_lr(model: Any) -> tuple[float, str]:
    """The sweep's peak learning rate at SWEEP_BATCH for ``model``, and where it comes from."""
    layers, hidden = model.num_hidden_layers, model.hidden_size
    points = sorted((_layer_params(*shape), lr, name) for name, (shape, lr) in SWEPT_LR.items())
    size = _layer_params(layers, hidden)
    for n, lr, name in points:
        if math.isclose(n, size, rel_tol=0.02) and (layers, hidden) == SWEPT_LR[name][0]:
            return lr, f"{name}'s"
    if size <= points[0][0]:
        return points[0][1], f"{points[0][2]}'s (the smallest size swept)"
    if size >= points[-1][0]:
        return points[-1][1], f"{points[-1][2]}'s (the largest size swept)"
    (n0, lr0, a), (n1, lr1, b) = next((p, q) for p, q in zip(points, points[1:]) if p[0] <= size <= q[0])
    t = (math.log(size) - math.log(n0)) / (math.log(n1) - math.log(n0))
    lr = math.exp(math.log(lr0) + t * (math.log(lr1) - math.log(lr0)))
    return float(f"{lr:.2g}"), f"between {a}'s and {b}'s by size"


def from_scratch_lr(model: Any) -> tuple[float, str]:
    """--recipe fast's peak rate at SWEEP_BATCH for ``model`` from scratch, and where it comes from: the sweep's
    (``swept_lr``) times the architecture's ``fast_lr_factor``, to 2 significant figures."""
    lr, where = swept_lr(model)
    factor = model.fast_lr_factor
    return (float(f"{lr * factor:.2g}"), f"{factor:g} x {where}") if factor != 1 else (lr, where)


def _default(config: Any, name: str) -> Any:
    """The default of field ``name`` of ``config`` (a dataclass: an OptimConfig, a PretrainConfig)."""
    return next(f.default for f in dataclasses.fields(config) if f.name == name)


def choose(cfg: Any, model: Any, continued: bool = False) -> tuple[Any, str]:
    """The optimizer settings (an OptimConfig) of the pretraining run ``cfg`` (a PretrainConfig) of ``model`` (an
    EncoderConfig): its --lr before --lr-scaling, and, where --recipe fast chose the learning rate, Adam's beta2 (the
    architecture's) or the warmup, why (for the start line; empty otherwise). A ``continued`` run (a pretrained start)
    takes the continuation's rate and warmup under either recipe (``continuation``)."""
    optim = cfg.optim
    if continued:
        return continuation(cfg, model)
    if not fast_recipe(cfg):
        return optim, ""
    beta2 = model.fast_adam_beta2  # the architecture's (its config class's)
    chose = []
    if not cfg.gave("lr", optim.lr, _default(optim, "lr")):
        lr, where = from_scratch_lr(model)
        scaling = optim.lr_scaling if optim.lr_scaling != "none" else "sqrt"
        optim = dataclasses.replace(optim, lr=lr, lr_scaling=scaling, reference_batch=SWEEP_BATCH)
        chose.append(f"lr {lr:g}, {where} best at batch {SWEEP_BATCH} in the lr sweep of BENCHMARKS.md")
    if beta2 != optim.adam_beta2 and not cfg.gave("adam_beta2", optim.adam_beta2, _default(optim, "adam_beta2")):
        optim = dataclasses.replace(optim, adam_beta2=beta2)
        chose.append(f"Adam beta2 {beta2:g} ({model.title}'s)")
    if not cfg.gave("warmup", optim.warmup, _default(optim, "warmup")):
        optim = dataclasses.replace(optim, warmup=model.fast_warmup)
        chose.append(f"a {model.fast_warmup:.0%} warmup")
    if not chose:
        return optim, ""
    flags = "--lr, --adam-beta2, --warmup" if optim.adam_beta2 != cfg.optim.adam_beta2 else "--lr, --warmup"
    return optim, f"(--recipe fast chose {' and '.join(chose)}; {flags} override)"


def for_continuation(cfg: Any) -> Any:
    """``cfg`` (a PretrainConfig) of a continued run: a masked-LM bias its start lacks (a sentence encoder's) starts
    at the text's token frequencies (--mlm-bias-init unigram), whatever the recipe, unless the flag is given. At a
    continuation's rate a bias moves about the rate a step: from zeros it would take tens of thousands of steps to
    reach log frequencies of -5 to -15, which the decoder's other half, the tied word embeddings, would learn
    instead, moving the encoder."""
    if cfg.gave("mlm_bias_init", cfg.mlm_bias_init, _default(cfg, "mlm_bias_init")):
        return cfg
    return dataclasses.replace(cfg, mlm_bias_init="unigram")


def continuation(cfg: Any, model: Any) -> tuple[Any, str]:
    """``choose`` for a continued run: CONTINUATION_LR and CONTINUATION_WARMUP where the user gave no --lr or
    --warmup (under --recipe fast also the architecture's Adam beta2), and why, for the start line."""
    optim, chose, lr_chosen = cfg.optim, [], False
    if not cfg.gave("lr", optim.lr, _default(optim, "lr")):
        optim, lr_chosen = dataclasses.replace(optim, lr=CONTINUATION_LR), True
        if not cfg.gave("lr_scaling", optim.lr_scaling, _default(optim, "lr_scaling")):
            optim = dataclasses.replace(optim, lr_scaling="linear", reference_batch=CONTINUATION_BATCH)
        chose.append(f"lr {CONTINUATION_LR:g} at batch {optim.reference_batch}")
    beta2 = model.fast_adam_beta2
    if (
        fast_recipe(cfg)
        and beta2 != optim.adam_beta2
        and not cfg.gave("adam_beta2", optim.adam_beta2, _default(optim, "adam_beta2"))
    ):
        optim = dataclasses.replace(optim, adam_beta2=beta2)
        chose.append(f"Adam beta2 {beta2:g} ({model.title}'s)")
    if not cfg.gave("warmup", optim.warmup, _default(optim, "warmup")):
        optim = dataclasses.replace(optim, warmup=CONTINUATION_WARMUP)
        chose.append(f"a {CONTINUATION_WARMUP:.0%} warmup")
    if not chose:
        return optim, ""
    why = ", task-adaptive pretraining's (Gururangan et al. 2020), not a from-scratch rate" if lr_chosen else ""
    flags = "--lr, --adam-beta2, --warmup" if optim.adam_beta2 != cfg.optim.adam_beta2 else "--lr, --warmup"
    return optim, (
        f"(a continuation of a pretrained model: --recipe {cfg.recipe} chose {' and '.join(chose)}{why}; "
        f"{flags} override)"
    )


def fresh_head_lr(cfg: Any, model: Any, global_batch: int) -> tuple[float, str]:
    """The peak rate of the parameters a continued run's start lacks (its fresh heads) at ``global_batch``, and
    whence: --fresh-head-lr, or the from-scratch rate --recipe fast takes for ``model``'s size (the sweep's,
    times the architecture's factor, square-root scaled from SWEEP_BATCH). A random head needs a from-scratch rate
    to learn in the run's few hundred steps; at the encoder's continuation rate it stays near its initialisation
    and keeps feeding the encoder a random predictor's gradients."""
    if cfg.fresh_head_lr is not None:
        return cfg.fresh_head_lr, "--fresh-head-lr"
    peak = scaled_lr(from_scratch_lr(model)[0], global_batch, "sqrt", SWEEP_BATCH)
    return float(f"{peak:.3g}"), "the from-scratch rate for its size; --fresh-head-lr overrides"


def continuation_warning(lr: float, peak: float, scaling: str) -> str | None:
    """One line when a continued run's peak rate ``peak`` (its --lr ``lr`` after --lr-scaling ``scaling``) is a
    from-scratch one: above FROM_SCRATCH_FACTOR x CONTINUATION_LR (only a --lr the user gave gets there)."""
    if peak <= FROM_SCRATCH_FACTOR * CONTINUATION_LR:
        return None
    given = f"--lr {lr:g}" + (f" (peak {peak:.3g} after --lr-scaling {scaling})" if scaling != "none" else "")
    return (
        f"{given} on a pretrained model: continued pretraining usually takes ~{CONTINUATION_LR:g}; a from-scratch rate "
        "can erase what it learned (the evaluations' start CKA shows how far the encoder moves)"
    )
