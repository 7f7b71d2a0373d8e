"""Predicted data-parallel scaling efficiency at 8 and 64 GPUs, from a measured step and the real gradient size.

    python benchmarks/scaling_model.py                          # measure `base` on this machine
    python benchmarks/scaling_model.py --model large --batch-size 8 --steps 3

What it does:

1. Measures one process's training step (forward, backward, AdamW) of bertgpu's model on this
   machine (CPU, or the GPU where there is one), on a real batch: the compute time T of one step.
2. Counts the bytes each process hands to the gradient all-reduce per step, for every
   --grad-compression (``bertgpu.parallel.compression.bytes_per_step`` on the model's real parameter
   shapes: fp32 4 bytes per value, fp16/bf16 2, PowerSGD rank 4 its factors).
3. Models a ring all-reduce of G bytes over n GPUs whose links carry B bytes/s each, with latency a
   per hop: t(G) = 2(n-1)/n x G/B + 2(n-1) a. DDP overlaps it with the backward pass (2/3 of T) in
   25 MB buckets, so only what outlasts the backward pass is exposed, and never less than the
   last bucket's all-reduce: step = T + max(t(25 MB), t(G) - 2T/3). Without overlap, step = T + t(G).
   Efficiency = T / step: the share of perfect linear scaling.
4. Does the same with the compute time of NVIDIA's published BERT-large figure (580 sequences/s on one
   A100-80GB at sequence length 128, mixed precision: T = 64/580 s for 64 sequences per GPU, with
   fp16 gradients as AMP all-reduces them) and compares the 8-GPU prediction with NVIDIA's measured
   4,591 sequences/s on 8 (7.9x, 98.9%).

Links (per GPU, one direction; stated, not measured): NVLink 300 GB/s (A100's NVLink 3: 600 GB/s
both ways) with 2 us per hop, InfiniBand 400 Gb/s = 50 GB/s (one NIC per GPU) with 5 us, 25 GbE =
3.125 GB/s with 20 us. A flat ring: at 64 GPUs NVLink is a stand-in for a 64-GPU NVLink domain;
real 8-GPU nodes on InfiniBand behave close to the InfiniBand row. PowerSGD's own compute
(two small matmuls and an orthogonalisation per matrix) is not modelled; BENCHMARKS.md gives its
measured cost in step time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from common import ROOT
from corpora import bert_vocab

sys.path.insert(0, str(ROOT))

from bertgpu.data.pretraining import IGNORE_INDEX  # noqa: E402
from bertgpu.models.bert.config import BertConfig  # noqa: E402
from bertgpu.models.bert.model import BertForPreTraining  # noqa: E402
from bertgpu.parallel.compression import Compression, bytes_per_step  # noqa: E402
from bertgpu.tasks.bench import real_batch, time_steps  # noqa: E402

LINKS = {"NVLink": (300e9, 2e-6), "InfiniBand 400G": (50e9, 5e-6), "25 GbE": (3.125e9, 20e-6)}
GPUS = (8, 64)
BUCKET = 25 * 2**20  # DDP's default bucket_cap_mb
COMPRESSIONS = {
    "none (fp32)": Compression("none"),
    "fp16": Compression("fp16"),
    "bf16": Compression("bf16"),
    "powersgd r4": Compression("powersgd", rank=4, warmup=2),
}
NVIDIA = {"one_gpu_seq_s": 580.0, "eight_gpu_seq_s": 4591.0, "batch": 64}


def ring(bytes_: float, n: int, bandwidth: float, latency: float) -> float:
    return 2 * (n - 1) / n * bytes_ / bandwidth + 2 * (n - 1) * latency


def efficiency(compute: float, grad_bytes: float, n: int, link: str, overlap: bool) -> float:
    bandwidth, latency = LINKS[link]
    comm = ring(grad_bytes, n, bandwidth, latency)
    if overlap:
        exposed = max(ring(min(BUCKET, grad_bytes), n, bandwidth, latency), comm - 2 * compute / 3)
    else:
        exposed = comm
    return compute / (compute + exposed)


def measure(model_name: str, batch_size: int, seq: int, steps: int) -> tuple[float, BertForPreTraining, str]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = torch.bfloat16 if device.type == "cuda" else None
    vocab = bert_vocab()
    with tempfile.TemporaryDirectory() as tmp:
        batch = {k: v.to(device) for k, v in real_batch(vocab, batch_size, seq, 20, Path(tmp)).items()}
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset(model_name, vocab_size=30522), pad_vocab_multiple=64).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step():
        with torch.autocast(device.type, dtype=precision, enabled=precision is not None):
            mlm, nsp = model(
                batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["mlm_positions"]
            )
        loss = F.cross_entropy(
            mlm.float().flatten(0, 1), batch["mlm_labels"].flatten(), ignore_index=IGNORE_INDEX
        ) + F.cross_entropy(nsp.float(), batch["nsp_label"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = statistics.median(time_steps(step, steps, 1, device))
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    return seconds, model, where


def table(title: str, compute: float, params: list[torch.Tensor]) -> None:
    print(f"\n{title}")
    print("| gradients | bytes/step | GPUs | " + " | ".join(f"{link} (overlap / none)" for link in LINKS) + " |")
    print("|---|---|---|" + "---|" * len(LINKS))
    for name, compression in COMPRESSIONS.items():
        grad_bytes = bytes_per_step(params, compression, fsdp=False, step=10**9, dp=2)
        for n in GPUS:
            cells = [
                f"{100 * efficiency(compute, grad_bytes, n, link, True):.1f}% / "
                f"{100 * efficiency(compute, grad_bytes, n, link, False):.1f}%"
                for link in LINKS
            ]
            print(f"| {name} | {grad_bytes / 2**20:,.1f} MiB | {n} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    seconds, model, where = measure(args.model, args.batch_size, args.seq, args.steps)
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    print(
        f"measured: {args.model} ({n_params / 1e6:.1f}M trainable parameters), batch {args.batch_size} x {args.seq}, "
        f"one training step {seconds:.3f} s on {where}"
    )
    table(
        f"Predicted scaling efficiency, {args.model}, compute {seconds:.3f} s per step (measured here)", seconds, params
    )

    large = BertForPreTraining(BertConfig.preset("large", vocab_size=30522), pad_vocab_multiple=64)
    large_params = list(large.parameters())
    compute = NVIDIA["batch"] / NVIDIA["one_gpu_seq_s"]
    table(
        f"Predicted scaling efficiency, BERT-large at NVIDIA's A100 compute ({NVIDIA['one_gpu_seq_s']:.0f} seq/s, "
        f"64 sequences per GPU: {compute * 1000:.0f} ms per step)",
        compute,
        large_params,
    )
    fp16 = bytes_per_step(large_params, Compression("fp16"), fsdp=False, step=10**9, dp=2)
    predicted = efficiency(compute, fp16, 8, "NVLink", True)
    measured = NVIDIA["eight_gpu_seq_s"] / (8 * NVIDIA["one_gpu_seq_s"])
    print(
        f"\nBERT-large, 8 x A100 on NVLink, fp16 gradients, overlapped: predicted {100 * predicted:.1f}% "
        f"({8 * predicted * NVIDIA['one_gpu_seq_s']:,.0f} seq/s); NVIDIA measured {100 * measured:.1f}% "
        f"({NVIDIA['eight_gpu_seq_s']:,.0f} seq/s, {NVIDIA['eight_gpu_seq_s'] / NVIDIA['one_gpu_seq_s']:.1f}x)"
    )


if __name__ == "__main__":
    main()
