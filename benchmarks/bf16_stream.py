"""--bf16-stream on a CPU with bf16 instructions: the held-out masked-LM loss after a short fixed run with the encoder
layers' residual stream and LayerNorms in bf16, against the same run with them in fp32 (autocast's default), both
under --precision bf16 (docs/bench.md, "What the switches of issue 59 are expected to buy").

    nice -n 19 .venv/bin/python benchmarks/bf16_stream.py               # tiny, 150 steps of 16 x 128, seeds 0 and 1
    nice -n 19 .venv/bin/python benchmarks/bf16_stream.py --steps 4 --seeds 0   # the script's own check

The data are the Python reference every CPython carries (``bertgpu.data.samples``), 10% of its documents held out;
the vocab is bert-base-uncased's where installed, else one trained on that text. Same seed, data order, masking and
schedule on both sides: only --bf16-stream differs. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import corpora
import reporting
from common import bertgpu, log_records, work_directory


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--work", default="")
    args = ap.parse_args()
    from bertgpu.training.precision import cpu_has_native_bf16

    if not cpu_has_native_bf16():
        sys.exit("benchmarks/bf16_stream.py: this CPU has no bf16 instructions (AVX512-BF16 or AMX): bf16 is emulated")
    work, _tmp = work_directory(Path(args.work) if args.work else None, "bf16-stream-")
    from bertgpu.data import samples

    corpus = samples.write_english_corpus(work / "vocab-corpus.txt")
    data = corpora.english_data(work, "text", 1, corpora.bert_sized_vocab(work, corpus, corpora.BERT_VOCAB))
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for stream in (False, True):
            out = work / f"run-{seed}-{'bf16' if stream else 'fp32'}"
            started = time.perf_counter()
            bertgpu("pretrain", "--data", data, "--out", out, "--overwrite", "--model", args.model, "--device", "cpu",
                    "--nproc", "1", "--precision", "bf16", "--recipe", "fast", "--steps", args.steps,
                    "--batch-size", args.batch_size, "--max-seq-length", args.seq, "--eval-fraction", "0.1",
                    "--eval-instances", "256", "--log-every", max(1, args.steps // 4), "--save-every", 100000,
                    "--seed", seed, "--loader-workers", "1", *(["--bf16-stream"] if stream else []))  # fmt: skip
            seconds = time.perf_counter() - started
            records = log_records(out)
            evals = [r["eval_mlm_loss"] for r in records if "eval_mlm_loss" in r]
            train = [r["seq_per_s"] for r in records if "seq_per_s" in r][1:] or [0.0]
            rows.append((str(seed), "bf16" if stream else "fp32 (autocast's)", f"{evals[-1]:.4f}",
                         f"{sum(train) / len(train):.1f}", f"{seconds:.0f} s"))  # fmt: skip
    print(
        f"--bf16-stream: {args.model}, {args.steps} steps of {args.batch_size} x {args.seq}, --recipe fast, "
        "--precision bf16, on the CPU; held-out masked-LM loss of 256 instances of 10% held-out documents"
    )
    columns = ("seed", "residual stream and LayerNorm", "held-out MLM loss", "seq/s (after the first window)", "run")
    print("\n".join(reporting.markdown_table(columns, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
