"""The sections the commands' configs are built from (``bertgpu.config``), and how a flag is declared: ``opt``, a
dataclass field that carries its help. Pretraining's data, optimizer, parallel layout, held-out evaluation and the
run's own mechanics (``RunConfig``); fine-tuning's adapters and its own defaults of the optimizer and the run; the
flags several commands share. Declarations only: the checks of their values are ``bertgpu.tasks.checks``'s.

Field metadata used by the CLI generator:
    help     the flag's help text (the only place an option is documented)
    flag     the flag name, when it is not ``--field-name``
    choices  the allowed values
    positional / nargs   for positional arguments
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bertgpu.models.architectures import LORA_CHOICES


def opt(default: Any = dataclasses.MISSING, help: str = "", **meta: Any) -> Any:
    """A dataclass field that carries its CLI help (and optional flag/choices) as metadata."""
    meta["help"] = help
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


# Flags that several commands share, each documented once here.
DEVICE_CHOICES = ["auto", "cpu", "cuda"]
PRECISIONS = ["auto", "fp32", "bf16", "fp16"]


def nproc_opt() -> Any:
    return opt(0, "processes to start (0: one per GPU, or 1 on CPU); ignored under torchrun")


def precision_opt() -> Any:
    return opt(
        "auto",
        "auto: bf16 on GPUs that support it (and, under pretrain's --recipe fast, on CPUs with bf16 instructions: "
        "AVX512-BF16 or AMX), else fp32",
        choices=PRECISIONS,
    )


def seed_opt() -> Any:
    return opt(42, "seed for data order, masking, pairing and initialisation")


def batch_size_opt(default: int, what: str) -> Any:
    return opt(
        default,
        f"{what} per data-parallel rank per micro-step: one number for every rank, or one per rank "
        "(48,16: unequal GPUs; the global batch is their sum x --grad-accum)",
        cli_type=str,
    )


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


@dataclass
class RunConfig:
    """How a training run runs, whatever it trains: processes, device, precision, seed, batches,
    checkpoints, logs and restarts. The defaults and help here are pretraining's; fine-tuning's are
    ``FinetuneRunConfig``'s (the same fields, so ``tasks.common.Session`` reads either)."""

    nproc: int = nproc_opt()
    device: str = opt("auto", "where to train", choices=DEVICE_CHOICES)
    batch_size: int | tuple[int, ...] = batch_size_opt(32, "sequences")
    grad_accum: int = opt(1, "micro-steps per optimizer step")
    precision: str = precision_opt()
    seed: int = seed_opt()
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
    ignore_memory_estimate: bool = opt(
        False,
        "start a run whose batch is estimated, before its first step, to need more memory than the device has "
        "free (the machine's available memory on CPU, the GPU's free memory), which is otherwise refused: the "
        "estimate is an order of magnitude, not a precise limit",
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
    fp8_recipe: str = opt(
        "tensorwise",
        "with --fp8: torchao's scaling of the float8 casts, tensorwise (one scale per tensor: the fastest) or rowwise "
        "(one per row: closer to bf16, a little slower); either skips the first and last encoder layers and the heads",
        choices=["tensorwise", "rowwise"],
    )
    compile_step: bool = opt(
        False,
        "with --compile and one process: the gradient clipping, the optimizer step and the zeroing of the gradients "
        "compiled too, and with CUDA graphs the whole step (every micro-batch's forward and backward, then the "
        "update) replayed as one graph, gradient accumulation included (--precision bf16 or fp32; --optimizer adamw "
        "or lamb); off until measured on a GPU (docs/bench.md)",
    )
    bf16_stream: bool = opt(
        False,
        "under --precision bf16, the encoder layers' residual stream and LayerNorms in bf16 (LayerNorm's statistics "
        "still accumulated in fp32; its weights kept in fp32 and cast): half the bytes of every residual add, "
        "LayerNorm and saved activation; off: they stay fp32 as autocast leaves them; off until measured "
        "(docs/bench.md)",
    )
    autotune: bool = opt(
        False,
        "with --compile: Inductor's max-autotune GEMM templates with epilogue fusion (bias and GELU computed in the "
        "matmul's kernel, forward and backward), each matmul's kernel chosen by timing it at the first step (longer "
        "compilation); off until measured on a GPU (docs/bench.md)",
    )
    document_bounds: bool = opt(
        False,
        "with --pack's per-document attention on a GPU: the variable-length kernel's document bounds built once per "
        "batch from the rows' document numbers (B x L values) instead of in every layer from the [B, 1, L, L] "
        "block-diagonal mask; the same attention; off until measured (docs/bench.md)",
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


# Fine-tuning's sections. Its defaults are those of transformers' Trainer (see bertgpu.config).
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
        f"target_modules (by the end of the module name): {', '.join(LORA_CHOICES)} "
        f"(default: {LORA_TARGETS})",
    )
    quantize: str | None = opt(
        None,
        "store the frozen encoder's linear layers in 8-bit (int8, LLM.int8()) or 4-bit "
        "(nf4: NormalFloat4 with double quantisation, as QLoRA) through bitsandbytes, "
        "with --lora-rank (needs bitsandbytes: pip install 'bertgpu[quant]')",
        choices=QUANTIZE,
    )

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


@dataclass
class FinetuneRunConfig(RunConfig):
    """``RunConfig`` with fine-tuning's defaults and help (transformers' Trainer's batch of 8)."""

    batch_size: int | tuple[int, ...] = batch_size_opt(8, "examples")
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


TASK_NAMES = ["classification", "token-classification", "question-answering", "regression", "multi-label"]


@dataclass
class TaskConfig:
    """Which fine-tuning task (bertgpu/finetuning/, one module each), and each task's own settings."""

    task: str = opt(
        "",
        "classification (a label per text or pair), token-classification (a tag per word: NER, POS; CoNLL or JSONL "
        "tokens/tags), question-answering (a span of a context: SQuAD v1.1/v2.0 JSON or JSONL), regression (a number "
        "per text or pair) or multi-label (several labels per text); default: read from the data where it says so "
        "unambiguously (a CoNLL file, SQuAD JSON, several labels per row, non-integer numbers), else classification; "
        "evaluate and predict: the fine-tuned model's own",
        choices=["", *TASK_NAMES],
    )
    doc_stride: int = opt(
        128, "question-answering: tokens that consecutive windows of a long context share (transformers' run_qa.py)"
    )
    max_answer_length: int = opt(30, "question-answering: the longest answer, in tokens")
    n_best: int = opt(20, "question-answering: start and end candidates kept per window")
    null_threshold: float = opt(
        0.0, "question-answering on v2.0 data: answer nothing when the null score beats the best span's by more"
    )
    label_separator: str = opt("|", "multi-label: what separates a row's label names (or give a JSON list)")
    threshold: str = opt(
        "",
        "multi-label: the probability from which a label is predicted (default 0.5; auto: the one with the best "
        "micro F1 on the evaluation data; predict: the fine-tuned model's)",
    )
