"""The checks of a command's flags, before anything starts: what a value forbids alone or with another flag of its
command, one line each (a UserError naming the flags). What needs the data, the model or the machine is each
command's own ``check()``.

Each command's run calls its check first (``check_pretrain_flags``, ``check_finetune_flags``, ...), so a config
built in Python (``bertgpu.pretrain(PretrainConfig(...))``) is checked as one from the flags or a --config file;
each returns the config with its values in their one form (--batch-size 48,16 as a tuple, predict's lone - as
--input -). The flags of pretraining's instances are checked by ``data.pretraining.check_data`` (inspect shares
them), prepare's by ``data.shard_writer.check_prepare``.
"""

from __future__ import annotations

import dataclasses

from bertgpu.config import (
    AdapterConfig,
    BenchConfig,
    DataConfig,
    EvaluateConfig,
    FillMaskConfig,
    FinetuneConfig,
    HeldOutConfig,
    OptimConfig,
    ParallelConfig,
    PredictConfig,
    PretrainConfig,
    RunConfig,
)
from bertgpu.data.pretraining import check_data
from bertgpu.errors import UserError
from bertgpu.models.architectures import CONFIGS
from bertgpu.tasks.prelaunch import parse_nnodes
from bertgpu.training.batch import parse_batch_sizes
from bertgpu.training.budget import parse_duration


def check_nproc(nproc: int) -> None:
    """--nproc below 0 is named as such (it was read as a world of -1 processes: a layout error on flags never
    given)."""
    if nproc < 0:
        raise UserError(f"--nproc must be at least 1, got {nproc} (or 0: one per GPU, or 1 on CPU)")


def check_length(max_seq_length: int, allow_auto: bool) -> None:
    """--max-seq-length of a classifier's examples (``allow_auto``: 0, the length it was fine-tuned with)."""
    if allow_auto and max_seq_length == 0:
        return
    if max_seq_length < 8:
        raise UserError(f"--max-seq-length must be at least 8, got {max_seq_length}")


def check_optim(optim: OptimConfig) -> None:
    if optim.steps < 1:
        raise UserError(f"--steps must be at least 1, got {optim.steps}")
    if optim.lr is not None and optim.lr <= 0:  # None: fine-tuning's default by the model's width
        raise UserError(f"--lr must be positive, got {optim.lr}")
    if optim.reference_batch < 1:
        raise UserError(f"--reference-batch must be at least 1, got {optim.reference_batch}")
    if not 0 <= optim.rmsprop_alpha < 1:
        raise UserError(f"--rmsprop-alpha must be in [0, 1), got {optim.rmsprop_alpha}")


def check_parallel(parallel: ParallelConfig) -> None:
    """The parallel flags on their own; how they fit the processes and the model is ``parallel.layout``'s."""
    if parallel.tp < 1:
        raise UserError(f"--tp must be at least 1, got {parallel.tp}")
    if parallel.pp < 1:
        raise UserError(f"--pp must be at least 1, got {parallel.pp}")
    if parallel.pp_microbatches < 0 or parallel.pp_stages_per_rank < 0:
        raise UserError("--pp-microbatches and --pp-stages-per-rank must be at least 0 (0: the default)")
    if parallel.powersgd_rank < 1:
        raise UserError(f"--powersgd-rank must be at least 1, got {parallel.powersgd_rank}")
    if parallel.powersgd_warmup < 0:
        raise UserError(f"--powersgd-warmup must be at least 0, got {parallel.powersgd_warmup}")
    if parallel.pp_stages_per_rank > 1 and parallel.pp_schedule != "interleaved-1f1b":
        raise UserError(
            f"--pp-stages-per-rank {parallel.pp_stages_per_rank} needs --pp-schedule interleaved-1f1b "
            f"({parallel.pp_schedule} runs one stage per process)"
        )


def check_heldout(heldout: HeldOutConfig) -> None:
    if heldout.eval_data and heldout.eval_fraction:
        raise UserError("--eval-data and --eval-fraction contradict each other: choose one")
    if heldout.eval_fraction and not 0 < heldout.eval_fraction <= 0.5:
        raise UserError(f"--eval-fraction must be in (0, 0.5], not {heldout.eval_fraction:g}")
    if heldout.eval_every < 0 or heldout.eval_instances < 1 or heldout.eval_batch_size < 0:
        raise UserError("--eval-every and --eval-batch-size must be at least 0, --eval-instances at least 1")


def check_run(run: RunConfig) -> RunConfig:
    """The flags of a training run's own mechanics (batches, restarts, elastic machines, wall-clock checkpoints),
    shared by pretrain and finetune; ``run`` with its --batch-size parsed. The checks of --save-every and
    --log-every stay with each command: their messages differ."""
    run = dataclasses.replace(run, batch_size=parse_batch_sizes(run.batch_size))
    if run.grad_accum < 1:
        raise UserError(f"--grad-accum must be at least 1, got {run.grad_accum}")
    if run.resume and run.overwrite:
        raise UserError("--resume and --overwrite contradict each other: choose one")
    check_nproc(run.nproc)
    if run.global_batch < 0:
        raise UserError(f"--global-batch must be positive, got {run.global_batch}")
    if run.global_batch and run.grad_accum != 1:
        raise UserError(
            f"--global-batch {run.global_batch} and --grad-accum {run.grad_accum}: give one of them (the "
            "accumulation steps are derived from --global-batch)"
        )
    if run.rdzv_last_call < 0:
        raise UserError(f"--rdzv-last-call must be at least 0 seconds, got {run.rdzv_last_call}")
    if run.rdzv_heartbeat < 1:
        raise UserError(f"--rdzv-heartbeat must be at least 1 second, got {run.rdzv_heartbeat}")
    if run.save_every_minutes < 0:
        raise UserError(f"--save-every-minutes must be at least 0, got {run.save_every_minutes:g}")
    low, high = parse_nnodes(run.nnodes)
    if high > 1 and not run.rdzv_endpoint:
        raise UserError(
            f"--nnodes {run.nnodes} needs --rdzv-endpoint HOST:PORT: the address (one of the machines, a port free "
            "there) where the machines of the run meet, the same on every machine"
        )
    if run.rdzv_endpoint and ":" not in run.rdzv_endpoint:
        raise UserError(f"--rdzv-endpoint {run.rdzv_endpoint}: give HOST:PORT, e.g. node1:29500")
    return run


def check_adapter(adapter: AdapterConfig) -> None:
    if adapter.lora_rank is None:
        given = [
            flag
            for flag, value in (
                ("--lora-alpha", adapter.lora_alpha),
                ("--lora-dropout", adapter.lora_dropout),
                ("--lora-targets", adapter.lora_targets),
                ("--quantize", adapter.quantize),
            )
            if value not in (None, "")
        ]
        if given:
            raise UserError(
                f"{given[0]} needs --lora-rank R: it applies to LoRA fine-tuning (the frozen base model's adapters)"
            )
        return
    if adapter.lora_rank < 1:
        raise UserError(f"--lora-rank must be at least 1, got {adapter.lora_rank} (leave it out for full fine-tuning)")
    if adapter.lora_alpha is not None and adapter.lora_alpha <= 0:
        raise UserError(f"--lora-alpha must be positive, got {adapter.lora_alpha:g}")
    if adapter.lora_dropout is not None and not 0 <= adapter.lora_dropout < 1:
        raise UserError(f"--lora-dropout must be in [0, 1), got {adapter.lora_dropout:g}")
    if adapter.lora_targets and not adapter.targets:
        raise UserError(f"--lora-targets {adapter.lora_targets!r} names no layer")


def check_step_switches(compile: bool, compile_step: bool, autotune: bool, precision: str, optimizer: str) -> None:
    """--compile-step and --autotune (issue 59's switches) with the flags they need."""
    for flag, on in (("--compile-step", compile_step), ("--autotune", autotune)):
        if on and not compile:
            raise UserError(f"{flag} needs --compile (it changes what torch.compile makes of the step)")
    if compile_step and precision == "fp16":
        raise UserError(
            "--compile-step runs with --precision bf16 or fp32 (fp16's loss scaler reads its state on the host)"
        )
    if compile_step and optimizer == "rmsprop":
        raise UserError("--compile-step runs with --optimizer adamw or lamb (torch's RMSprop skips a step on the host)")


def check_pretrain_flags(cfg: PretrainConfig) -> PretrainConfig:
    # The sections first, in the order of their fields (as when each checked itself on being built).
    check_data(cfg.data)
    check_optim(cfg.optim)
    check_parallel(cfg.parallel)
    check_heldout(cfg.heldout)
    cfg = dataclasses.replace(cfg, run=check_run(cfg.run))
    if cfg.time_budget:
        parse_duration(cfg.time_budget)
        if cfg.gave("steps", cfg.optim.steps, OptimConfig.steps):
            raise UserError("--time-budget and --steps contradict each other: give one (the budget sizes the steps)")
    if cfg.run.save_every < 1 or cfg.run.log_every < 1:
        raise UserError("--save-every and --log-every must be at least 1")
    if cfg.dropout is not None and not 0 <= cfg.dropout < 1:
        raise UserError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.pad_vocab_multiple < 1:
        raise UserError(f"--pad-vocab-multiple must be at least 1, got {cfg.pad_vocab_multiple}")
    if cfg.peak_tflops < 0:
        raise UserError(f"--peak-tflops must be positive, got {cfg.peak_tflops}")
    check_step_switches(cfg.run.compile, cfg.run.compile_step, cfg.run.autotune, cfg.run.precision, cfg.optim.optimizer)
    arch = CONFIGS.get(cfg.arch)
    if arch is not None and not arch.nsp and cfg.data.nsp:
        raise UserError(
            f"--arch {cfg.arch} trains masked LM only ({arch.title} has no next-sentence head): add --no-nsp"
        )
    return cfg


def check_finetune_flags(cfg: FinetuneConfig) -> FinetuneConfig:
    check_optim(cfg.optim)
    check_adapter(cfg.adapter)
    check_parallel(cfg.parallel)
    cfg = dataclasses.replace(cfg, run=check_run(cfg.run))
    if cfg.epochs is not None and cfg.epochs < 1:  # None: fine-tuning's default by the data's size
        raise UserError(f"--epochs must be at least 1, got {cfg.epochs}")
    if cfg.save_total_limit < 0 or cfg.run.log_every < 1:
        raise UserError("--save-total-limit must be at least 0 and --log-every at least 1")
    if cfg.eval and cfg.eval_split is not None:
        raise UserError("--eval and --eval-split contradict each other: choose one")
    if cfg.eval_split is not None and not 0 < cfg.eval_split < 1:
        # 0 used to fall back to the default 0.1 silently; fine-tuning picks best/ on held-out data, so it needs some
        raise UserError(
            f"--eval-split must be a fraction between 0 and 1 (exclusive), not {cfg.eval_split:g}: "
            "fine-tuning evaluates every epoch to choose best/; give --eval FILE to hold out nothing "
            "of --train"
        )
    if cfg.run.save_every < 1:
        raise UserError(f"--save-every must be at least 1, got {cfg.run.save_every}")
    if cfg.dropout is not None and not 0 <= cfg.dropout < 1:
        raise UserError(f"--dropout must be in [0, 1), got {cfg.dropout:g}")
    check_length(cfg.max_seq_length, allow_auto=False)
    return cfg


def check_evaluate_flags(cfg: EvaluateConfig) -> EvaluateConfig:
    if cfg.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {cfg.batch_size}")
    if cfg.eval_instances < 1:
        raise UserError(f"--eval-instances must be at least 1, got {cfg.eval_instances}")
    check_nproc(cfg.nproc)
    check_length(cfg.max_seq_length, allow_auto=True)
    return cfg


def check_predict_flags(cfg: PredictConfig) -> PredictConfig:
    if cfg.texts == ["-"] and not cfg.input:  # the usual spelling of stdin, not a text "-" to classify
        cfg = dataclasses.replace(cfg, texts=[], input="-")
    if cfg.input and cfg.texts:
        raise UserError("give either texts to classify or --input FILE, not both")
    if not cfg.input and not cfg.texts:
        raise UserError("give texts to classify (or a text and its pair text), or --input FILE")
    if cfg.output and not cfg.input:
        raise UserError("--output goes with --input FILE; texts given on the command line are printed")
    if cfg.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {cfg.batch_size}")
    check_length(cfg.max_seq_length, allow_auto=True)
    return cfg


def check_fill_mask_flags(cfg: FillMaskConfig) -> FillMaskConfig:
    if isinstance(cfg.text, str):  # FillMaskConfig(text="...") from Python: one text
        cfg = dataclasses.replace(cfg, text=[cfg.text] if cfg.text else [])
    if cfg.top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {cfg.top_k}")
    if bool(cfg.text) == bool(cfg.input):
        raise UserError("give texts with [MASK] or --input FILE (one text per line), not both nor neither")
    return cfg


def check_bench_flags(cfg: BenchConfig) -> BenchConfig:
    if cfg.batch_size < 1 or cfg.steps < 1:
        raise UserError("--batch-size and --steps must be at least 1")
    if not 0 <= cfg.dropout < 1:
        raise UserError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.peak_tflops < 0:
        raise UserError(f"--peak-tflops must be positive, got {cfg.peak_tflops}")
    check_step_switches(cfg.compile is not False, cfg.compile_step, cfg.autotune, cfg.precision, "adamw")
    if cfg.compiled_only and cfg.compile is False:
        raise UserError("--compiled-only times bertgpu --compile alone: leave out --no-compile")
    # The batch is pretraining instances of --seq-len tokens: their checks, in pretrain's words as they always were.
    check_data(DataConfig(data="", max_seq_length=cfg.seq_len, max_predictions=cfg.max_predictions))
    return cfg
