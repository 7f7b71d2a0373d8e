"""The model card: a README.md in every checkpoint and best/ directory, as the Hugging Face Hub shows one.

What the model is, how it was trained (data, steps, recipe, layout), its metrics and how to load it,
from the run's config (the same dataclass saved beside it as bertgpu.json), so the card never says
something the run did not do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bertgpu.models import architectures
from bertgpu.models.config import EncoderConfig
from bertgpu.training.batch import scaled_lr


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class RunFacts:
    """What a card says of its run beside the run's config: the ``step`` it is at, the ``layout`` it ran on, the
    ``metrics`` to show, each with the step it was measured at (the newest logged and held-out values for
    pretraining, the epoch's evaluation for fine-tuning); the ``precision`` the run used (the config's when None)
    and ``asked_precision`` the --precision given (auto); ``time_budget`` the --time-budget that planned the
    steps; ``global_batch`` the batch --lr-scaling scaled the learning rate to."""

    step: int
    layout: str
    metrics: dict[str, tuple[Any, int]] | None = None
    precision: str | None = None
    asked_precision: str | None = None
    time_budget: str = ""
    global_batch: int | None = None


def render(task: str, run_config: Any, model_config: EncoderConfig, facts: RunFacts) -> str:
    """The card's Markdown. ``task`` is ``pretrain`` or ``finetune``; ``run_config`` the config as the run ran
    (``tasks.common.Checkpoints.ran_config``: the learning rate and warmup --recipe fast chose, the steps planned);
    ``facts`` the step, layout, metrics and precision (``RunFacts``). Paths are shown as the user gave them."""
    step, layout, metrics, time_budget = facts.step, facts.layout, facts.metrics, facts.time_budget
    precision, asked_precision, global_batch = facts.precision, facts.asked_precision, facts.global_batch
    cfg = dataclasses.asdict(run_config)
    run = cfg["run"]
    used, asked = precision or run["precision"], asked_precision or run["precision"]
    run = {**run, "precision": used if used == asked else f"{used} (--precision {asked})"}
    m = model_config
    arch = architectures.of(m)
    shape = (
        f"{m.num_hidden_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads, "
        f"intermediate {m.intermediate_size}, vocab {m.vocab_size:,}, {m.max_position_embeddings} positions"
    )
    front = ["---", "library_name: transformers", "tags:", f"- {arch.name}", "- bertgpu"]
    if task == "pretrain":
        data, optim = cfg["data"], cfg["optim"]
        objective = "masked LM" + (" + next-sentence prediction" if data["nsp"] else "")
        masking = (
            f"{data['masked_lm_prob']:.0%} of the tokens ({'whole words' if data['wwm'] else 'word pieces'}), "
            "80% [MASK] / 10% random / 10% kept, drawn afresh every epoch"
        )
        title = f"A {arch.title} pretrained with bertgpu"
        steps = f"{step:,} of {optim['steps']:,}" + (f" planned by --time-budget {time_budget}" if time_budget else "")
        what = f"A {arch.title} encoder with its pretraining heads ({objective}), at step {steps}."
        recipe = [
            ("data", data["data"]),
            ("model", cfg["model"]),
            ("objective", objective),
            ("recipe", _recipe(cfg)),
            ("masking", masking),
            ("sequence length", data["max_seq_length"]),
            ("steps", steps),
            ("batch size per rank", run["batch_size"]),
            ("accumulation", _accumulation(run)),
            (
                "optimizer",
                f"{optim['optimizer']}, {_peak_lr(optim, global_batch)}, {_warmup(optim['warmup'])}, "
                f"weight decay {optim['weight_decay']:g}, clip {optim['clip']:g}",
            ),
            ("precision", run["precision"]),
            ("layout", layout),
            ("seed", run["seed"]),
        ]
        model_class, tokenizer = arch.masked_lm_class, "AutoTokenizer" if arch.tokenizer_json else "BertTokenizer"
        load = (
            f"from transformers import {', '.join(sorted((model_class, tokenizer)))}\n"
            f"model = {model_class}.from_pretrained(PATH)\ntokenizer = {tokenizer}.from_pretrained(PATH)\n"
        )
        check = 'bertgpu fill-mask PATH "a sentence with [MASK] in it"'
        front.append("pipeline_tag: fill-mask")
    else:
        labels = ", ".join((m.id2label or {}).values())
        kind = (cfg.get("task_options") or {}).get("task") or "classification"
        title, head, pipeline_tag, call, check = CARD_TASKS[kind]
        what = f"{arch.title} with a {head} head" + (
            f" for the labels {labels}" if kind in ("classification", "multi-label", "token-classification") else ""
        )
        what += f", after step {step:,}; metrics as `bertgpu evaluate` and `metrics.json` report them for {kind}."
        recipe = [
            ("task", kind),
            ("base model", cfg["model"]),
            ("training data", cfg["train"]),
            ("evaluation data", cfg["eval"] or f"{cfg['eval_split'] or 0.1:g} of the training data"),
            ("epochs", cfg["epochs"]),
            ("sequence length", cfg["max_seq_length"]),
            ("batch size per rank", run["batch_size"]),
            ("accumulation", _accumulation(run)),
            (
                "learning rate",
                f"{_lr(cfg['optim']['lr'])} (AdamW), warmup {cfg['optim']['warmup']:g}, "
                f"weight decay {cfg['optim']['weight_decay']:g}",
            ),
            ("dropout", _value(cfg.get("dropout"))),
            *[("pooling", arch.pooling_words[cfg.get("pooling") == "mean"])] * (head == "sequence-classification"),
            ("LoRA rank", cfg["adapter"]["lora_rank"] or "none (full fine-tuning)"),
            ("precision", run["precision"]),
            ("layout", layout),
            ("seed", run["seed"]),
        ]
        load = f"from transformers import pipeline\n{call}\n"
        if (
            architectures.pooling_of(m) == "mean"
            and not arch.hf_reads_mean_pooling
            and head == "sequence-classification"
        ):
            load = _mean_pooled_use(cfg["max_seq_length"] or m.max_position_embeddings)
        front.append(f"pipeline_tag: {pipeline_tag}")
    lines = [
        *front,
        "---",
        "",
        f"# {title}",
        "",
        what,
        "",
        f"Architecture: {shape}.",
        "",
        "## Training",
        "",
        "| setting | value |",
        "| --- | --- |",
    ]
    lines += [f"| {name} | {_value(value)} |" for name, value in recipe]
    if metrics:
        lines += ["", "## Metrics", "", "| metric | value | at step |", "| --- | --- | --- |"]
        lines += [
            f"| {name} | {_value(value)} | {at:,} |"
            for name, (value, at) in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        if "eval_start_cka" in metrics:  # a continuation's (training.drift)
            lines += [
                "",
                "eval_start_cka: how alike this encoder's representations of held-out text are to those of the model "
                "it continued from (linear CKA of the mean-pooled last hidden states; 1 = unchanged, well below 1: "
                "what that model learned may be lost).",
            ]
    lines += [
        "",
        "## Use",
        "",
        "PATH is this directory.",
        "",
        "```python",
        load.rstrip(),
        "```",
        "",
        "```bash",
        check,
        "```",
        "",
        "The full configuration of the run is in `bertgpu.json`.",
        "",
    ]
    return "\n".join(lines)


# Each fine-tuning task's card: its title, head, Hugging Face pipeline tag, the pipeline call and the bertgpu command.
CARD_TASKS = {
    "classification": (
        "A text classifier fine-tuned with bertgpu",
        "sequence-classification",
        "text-classification",
        'classify = pipeline("text-classification", model=PATH)\nclassify("a text")',
        'bertgpu predict --model PATH "a text"',
    ),
    "regression": (
        "A text regression model fine-tuned with bertgpu",
        "sequence-classification",
        "text-classification",
        'score = pipeline("text-classification", model=PATH, function_to_apply="none")\nscore("a text")',
        'bertgpu predict --model PATH "a text"',
    ),
    "multi-label": (
        "A multi-label text classifier fine-tuned with bertgpu",
        "sequence-classification",
        "text-classification",
        'classify = pipeline("text-classification", model=PATH, top_k=None)  # a sigmoid per label\nclassify("a text")',
        'bertgpu predict --model PATH "a text"',
    ),
    "token-classification": (
        "A token classifier (named entities, tags) fine-tuned with bertgpu",
        "token-classification",
        "token-classification",
        'tag = pipeline("token-classification", model=PATH, aggregation_strategy="first")\ntag("a sentence")',
        'bertgpu predict --model PATH "a sentence"',
    ),
    "question-answering": (
        "An extractive question-answering model fine-tuned with bertgpu",
        "question-answering",
        "question-answering",
        'answer = pipeline("question-answering", model=PATH)\nanswer(question="a question", context="a text")',
        'bertgpu predict --model PATH "a question" "a text holding the answer"',
    ),
}


def _mean_pooled_use(max_length: int) -> str:
    """The "Use" code of a classifier of the mean of the last hidden states that transformers' own class does not
    pool so (BERT's BertForSequenceClassification, and so pipeline("text-classification"), reads the pooler, which
    fine-tuning did not train: near-chance answers, issue 60). It pools as ``bertgpu predict`` does: the encoder in
    transformers, the mean over the real tokens, the classifier layer's weights from the checkpoint (tests: the
    same probabilities as predict, 1e-4)."""
    return f"""# This classifier reads the mean of the last hidden states (classifier_pooling mean in
# config.json), which transformers' BertForSequenceClassification and pipeline("text-classification")
# ignore: they read the pooler, which fine-tuning left untrained, and give other answers. This pools as
# `bertgpu predict` does (or, with bertgpu: from bertgpu import Classifier; Classifier.load(PATH)("a text")).
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(PATH)
encoder = AutoModel.from_pretrained(PATH).eval()  # the encoder alone: the classifier layer is read below
weights = load_file(f"{{PATH}}/model.safetensors")
weight, bias = weights["classifier.weight"], weights["classifier.bias"]


def classify(texts, pairs=None):
    batch = tokenizer(texts, pairs, padding=True, truncation=True, max_length={max_length}, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    probs = ((hidden * mask).sum(1) / mask.sum(1) @ weight.T + bias).softmax(-1)
    return [{{"label": encoder.config.id2label[int(k)], "score": float(p[k])}} for p, k in zip(probs, probs.argmax(-1))]


classify(["a text"])
"""


def _peak_lr(optim: dict[str, Any], global_batch: int | None) -> str:
    """``peak lr 0.0005 (--lr 0.001 scaled sqrt from batch 32 to 8)``: the rate the run peaked at."""
    lr, scaling = optim["lr"], optim.get("lr_scaling", "none")
    if scaling == "none" or not global_batch:
        return f"peak lr {lr:g}" if scaling == "none" else f"lr {lr:g} before --lr-scaling {scaling}"
    peak = scaled_lr(lr, global_batch, scaling, optim["reference_batch"])
    return f"peak lr {peak:.3g} (--lr {lr:g} scaled {scaling} from batch {optim['reference_batch']} to {global_batch})"


def _warmup(warmup: float) -> str:
    """``warmup 0.06 (6% of the run)`` or ``warmup 100 steps``."""
    return f"warmup {warmup:g} steps" if warmup >= 1 else f"warmup {warmup:g} ({warmup * 100:g}% of the run)"


def _lr(lr: Any) -> str:
    return "the width's default" if lr is None else f"{lr:g}"


def _recipe(cfg: dict[str, Any]) -> str:
    """``fast: packed sequences, dropout 0`` (docs/pretrain.md: The fast recipe)."""
    layout = "one document per sequence"
    if cfg["data"].get("pack"):  # a run saved before --pack-attention attended across its row
        within = cfg["data"].get("pack_attention", "row") == "document"
        layout = "packed sequences" + (", attention within each document" if within else "")
    dropout = "as the model config" if cfg.get("dropout") is None else f"{cfg['dropout']:g}"
    return f"{cfg.get('recipe', 'bert')}: {layout}, dropout {dropout}"


def _accumulation(run: dict[str, Any]) -> Any:
    """--grad-accum, or what --global-batch made of it (it depends on the layout of each start)."""
    goal = run.get("global_batch")
    return f"derived from the global batch {goal}" if goal else run["grad_accum"]
