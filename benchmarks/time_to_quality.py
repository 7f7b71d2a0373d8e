"""Time-to-quality: held-out masked-LM loss against wall-clock time, bertgpu against transformers.

The same corpus, vocab, model shape, sequence length, global batch, learning-rate schedule shape and
wall-clock budget, one after the other on this machine:

- **transformers** as its users pretrain: BertForMaskedLM, DataCollatorForLanguageModeling (15%,
  80/10/10), the text packed into blocks of --seq tokens as run_mlm does, Trainer's defaults (AdamW
  fused where torch has it, linear decay) with the same lr, warmup share and batch; variant
  ``transformers`` runs at the precision bertgpu's --recipe fast takes on this machine (``bf16=True`` where
  that is bf16: a CPU with bf16 instructions), ``transformers:fp32`` at the Trainer's default, fp32;
- **bertgpu** `pretrain --no-nsp` on 2 processes, once per --recipe asked for (bert, fast), and once per
  architecture of --arch (bert, modernbert: the same preset's depth, width and heads).

Each side's linear schedule is sized to the steps it can take in the budget (a 20-step calibration run
measures its speed first), and each side saves its weights every --every seconds of its run. With
--own-schedule, bertgpu instead runs as a user would: `--time-budget` sizes its schedule (no calibration
run) and --recipe fast chooses its learning rate and warmup (no --lr, --warmup); transformers' learning rate
then follows its clock the same way (warmup, linear decay to 0 at the budget, set each step by a callback), so
neither side's schedule depends on a calibration run measured under other load. Afterwards,
outside the clock, every saved model is evaluated the same way, through transformers' BertForMaskedLM:
masked-token cross-entropy over fixed, seeded maskings of held-out text (files never trained on),
packed as run_mlm packs. The headline is the time-to-quality ratio: the time transformers needs to
reach its final held-out loss, divided by the time bertgpu needs to reach that same loss.

    python benchmarks/time_to_quality.py --corpus DIR_OR_FILES... [--budget 300] [--variants transformers,bert,fast]
        [--arch bert,modernbert]

Without a transformers variant, the first run is the reference of the ratios.

A corpus: the Python documentation sources of Debian's python3.11-doc (`apt-get download python3.11-doc`,
`dpkg-deb -x python3.11-doc_*.deb DIR`, then DIR/usr/share/doc/python3.11/html/_sources).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BERTGPU = [sys.executable, "-m", "bertgpu"]

# The transformers side runs in a child process (its own clock, its own threads), fed with this program.
HF_CHILD = r"""
import json, sys, time
start = time.perf_counter()
import torch
from transformers import (BertConfig, BertForMaskedLM, BertTokenizerFast, DataCollatorForLanguageModeling, Trainer,
                          TrainerCallback, TrainingArguments)
args = json.loads(sys.argv[1])
torch.manual_seed(args["seed"])
blocks = torch.load(args["blocks"])
tokenizer = BertTokenizerFast.from_pretrained(args["tokenizer_dir"])
config = BertConfig(vocab_size=len(tokenizer), **args["shape"])
model = BertForMaskedLM(config)

class Blocks(torch.utils.data.Dataset):
    def __len__(self):
        return len(blocks)
    def __getitem__(self, i):
        return {"input_ids": blocks[i]}

class Saver(TrainerCallback):
    # Save every `every` seconds of the run (the clock paused while saving); stop at the budget.
    def __init__(self):
        self.next = args["every"]
        self.paused = 0.0
    def elapsed(self):
        return time.perf_counter() - start - self.paused
    def save(self, model, step):
        t0 = time.perf_counter()
        model.save_pretrained(f"{args['out']}/t{self.elapsed():08.1f}-step{step}")
        self.paused += time.perf_counter() - t0
    def on_step_begin(self, a, state, control, optimizer=None, **kw):
        # --own-schedule: the learning rate follows the clock (warmup, then linear decay to 0 at the budget),
        # as bertgpu's --time-budget does, in place of a schedule sized by a calibration run
        if args["clock"] and optimizer is not None:
            p, w = min(1.0, self.elapsed() / args["budget"]), args["warmup"]
            factor = max(p / w, 1e-3) if p < w else max(0.0, (1 - p) / (1 - w))
            for group in optimizer.param_groups:
                group["lr"] = args["lr"] * factor
    def on_step_end(self, a, state, control, model=None, **kw):
        if args["calibrate"]:
            return
        if self.elapsed() >= self.next:
            self.save(model, state.global_step)
            self.next += args["every"]
        if self.elapsed() >= args["budget"]:
            control.should_training_stop = True
    def on_train_end(self, a, state, control, model=None, **kw):
        if not args["calibrate"]:
            self.save(model, state.global_step)

collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
targs = TrainingArguments(output_dir=args["out"] + "/trainer", per_device_train_batch_size=args["batch"],
                          bf16=args["bf16"],
                          learning_rate=args["lr"], warmup_steps=0 if args["clock"] else int(args["warmup"] * args["steps"]),
                          max_steps=args["steps"],
                          weight_decay=0.01, lr_scheduler_type="constant" if args["clock"] else "linear", save_strategy="no", report_to=[],
                          logging_steps=10**9, use_cpu=True, seed=args["seed"], dataloader_num_workers=0,
                          disable_tqdm=True)
trainer = Trainer(model=model, args=targs, train_dataset=Blocks(), data_collator=collator, callbacks=[Saver()])
t0 = time.perf_counter()
trainer.train()
print(json.dumps({"seconds_per_step": (time.perf_counter() - t0) / args["steps"]}))
"""


def sh(*args, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], text=True, capture_output=True, cwd=ROOT, **kwargs)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(map(str, args))[:200]}\n{proc.stderr[-3000:]}")
    return proc


def split_corpus(inputs: list[str], work: Path, heldout_every: int) -> tuple[Path, Path]:
    """Files (sorted) into train.txt and heldout.txt: every heldout_every-th file is held out whole."""
    files = sorted(
        f
        for p in inputs
        for f in (glob.glob(f"{p}/**/*", recursive=True) if os.path.isdir(p) else [p])
        if os.path.isfile(f)
    )
    train, held = work / "train.txt", work / "heldout.txt"
    with open(train, "w", encoding="utf-8") as t, open(held, "w", encoding="utf-8") as h:
        for i, f in enumerate(files):
            text = Path(f).read_text(encoding="utf-8", errors="replace").strip()
            (h if i % heldout_every == heldout_every - 1 else t).write(text + "\n\n")
    return train, held


def pack(path: Path, tokenizer, seq: int):
    """run_mlm's group_texts: every line tokenized with [CLS]/[SEP], concatenated, cut into blocks of seq."""
    import torch

    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = [i for enc in tokenizer(lines)["input_ids"] for i in enc]
    n = len(ids) // seq
    return torch.tensor(ids[: n * seq]).view(n, seq)


def heldout_batches(blocks, tokenizer, maskings: int, seed: int):
    """Fixed maskings of the held-out blocks: DataCollatorForLanguageModeling under a seeded torch RNG."""
    import torch
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    torch.manual_seed(seed)
    out = []
    for _ in range(maskings):
        for start in range(0, len(blocks), 64):
            out.append(collator([{"input_ids": b} for b in blocks[start : start + 64]]))
    return out


def heldout_loss(model_dir: Path, batches) -> float:
    import torch
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()  # BertForMaskedLM or ModernBertForMaskedLM
    total = count = 0.0
    with torch.no_grad():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"]).logits
            valid = batch["labels"] != -100
            total += torch.nn.functional.cross_entropy(logits[valid], batch["labels"][valid], reduction="sum").item()
            count += valid.sum().item()
    return total / count


def bertgpu_precision() -> str:
    """The precision `bertgpu pretrain --recipe fast` takes on this machine's CPU (--precision auto)."""
    from bertgpu.training import cpu_has_native_bf16

    return "bf16" if cpu_has_native_bf16() else "fp32"


def run_transformers(work: Path, args, shape: dict, blocks_path: Path, tokenizer_dir: Path, precision: str) -> Path:
    out = work / f"transformers-{precision}"
    shutil.rmtree(out, ignore_errors=True)
    common = {
        "blocks": str(blocks_path),
        "vocab": str(tokenizer_dir / "vocab.txt"),
        "tokenizer_dir": str(tokenizer_dir),
        "shape": shape,
        "batch": args.batch,
        "lr": args.lr,
        "warmup": args.warmup,
        "seed": 0,
        "every": args.every,
        "budget": args.budget,
        "out": str(out),
        "bf16": precision == "bf16",
        "clock": args.own_schedule,
    }
    if args.own_schedule:  # the schedule follows the clock: no calibration, steps until the budget stops it
        print(f"transformers ({precision}): learning rate by the clock, stopped at the budget", flush=True)
        sh(sys.executable, "-c", HF_CHILD, json.dumps({**common, "steps": 10**7, "calibrate": False}))
        return out
    calib = sh(sys.executable, "-c", HF_CHILD, json.dumps({**common, "steps": 20, "calibrate": True}))
    per_step = json.loads(calib.stdout.strip().splitlines()[-1])["seconds_per_step"]
    steps = int(args.budget / per_step)
    print(f"transformers ({precision}): {per_step * 1000:.0f} ms/step -> a schedule of {steps} steps", flush=True)
    sh(sys.executable, "-c", HF_CHILD, json.dumps({**common, "steps": steps, "calibrate": False}))
    return out


def run_bertgpu(work: Path, args, data: Path, variant: str, arch: str = "bert") -> Path:
    """``variant``: a recipe, optionally with more flags after a colon (``bert:--pack``)."""
    if args.own_schedule:
        return run_bertgpu_budget(work, args, data, variant, arch)
    recipe, _, extra = variant.partition(":")
    name = variant if arch == "bert" else f"{arch}-{variant}"
    out = work / ("bertgpu-" + "".join(c if c.isalnum() else "-" for c in name).strip("-"))
    shutil.rmtree(out, ignore_errors=True)
    flags = [
        "pretrain",
        "--data",
        data,
        "--model",
        args.model,
        "--arch",
        arch,
        "--no-nsp",
        "--recipe",
        recipe,
        *extra.split(),
        "--nproc",
        "2",
        "--batch-size",
        args.batch // 2,
        "--max-seq-length",
        args.seq,
        "--lr",
        args.lr,
        "--warmup",
        args.warmup,
        "--device",
        "cpu",
        "--log-every",
        "10",
        "--seed",
        "0",
        "--overwrite",
    ]
    calib = sh(*BERTGPU, *flags, "--out", work / "calibrate", "--steps", 40, "--save-every", 1000)
    last = [json.loads(line) for line in (work / "calibrate" / "log.jsonl").read_text().splitlines()][-1]
    steps = int(args.budget * last["steps_per_s"])
    print(
        f"bertgpu --arch {arch} --recipe {recipe} {extra}: {1000 / last['steps_per_s']:.0f} ms/step -> a schedule "
        f"of {steps} steps",
        flush=True,
    )
    del calib
    save_every = max(1, int(args.every * last["steps_per_s"]))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [
            *BERTGPU,
            *map(str, flags),
            "--out",
            str(out),
            "--steps",
            str(steps),
            "--save-every",
            str(save_every),
            "--keep",
            "100000",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=args.budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the run saves a checkpoint and stops
        proc.wait()
    # A checkpoint's time: when its directory appeared, from the start of the command.
    for ckpt in sorted((out / "checkpoints").glob("step-*")):
        elapsed = ckpt.stat().st_mtime - (time.time() - (time.perf_counter() - start))
        ckpt.rename(out / f"t{min(elapsed, args.budget + 30):08.1f}-{ckpt.name}")
    return out


def run_bertgpu_budget(work: Path, args, data: Path, variant: str, arch: str = "bert") -> Path:
    """bertgpu as a user runs it: `--time-budget` and the recipe's own learning rate and warmup."""
    recipe, _, extra = variant.partition(":")
    name = variant if arch == "bert" else f"{arch}-{variant}"
    out = work / ("bertgpu-budget-" + "".join(c if c.isalnum() else "-" for c in name).strip("-"))
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        *BERTGPU, "pretrain", "--data", data, "--model", args.model, "--arch", arch, "--no-nsp", "--recipe", recipe,
        *extra.split(),
        "--nproc", "2", "--batch-size", args.batch // 2, "--max-seq-length", args.seq, "--device", "cpu",
        "--log-every", "10", "--seed", "0", "--time-budget", f"{args.budget:g}s",
        "--save-every-minutes", f"{args.every / 60:g}", "--keep", "100000", "--out", out,
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(list(map(str, cmd)), cwd=ROOT, capture_output=True, text=True, timeout=args.budget + 600)
    took = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"bertgpu failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    first = proc.stdout.splitlines()[0]
    print(
        f"bertgpu --recipe {recipe} {extra} --time-budget {args.budget:g}s: the command took {took:.0f} s", flush=True
    )
    print(f"  {first}", flush=True)
    (out / "stdout.txt").write_text(proc.stdout)
    for ckpt in sorted((out / "checkpoints").glob("step-*")):
        elapsed = ckpt.stat().st_mtime - (time.time() - (time.perf_counter() - start))
        ckpt.rename(out / f"t{elapsed:08.1f}-{ckpt.name}")
    return out


def curve(run_dir: Path, batches) -> list[tuple[float, float]]:
    points = []
    for d in sorted(p for p in run_dir.iterdir() if re.fullmatch(r"t\d{6}\.\d-.*", p.name)):
        points.append((float(d.name[1:9]), heldout_loss(d, batches)))
    return points


def time_to_reach(points: list[tuple[float, float]], target: float) -> float | None:
    """The first time the curve (linearly interpolated) is at or below ``target``."""
    prev = None
    for t, loss in points:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return t
            (t0, l0) = prev
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
        prev = (t, loss)
    return None


def loss_at(points: list[tuple[float, float]], t: float) -> float:
    """The curve's loss at time ``t`` (linear between checkpoints; the last point's after the end)."""
    prev = None
    for when, loss in points:
        if when >= t:
            if prev is None:
                return loss
            return prev[1] + (loss - prev[1]) * (t - prev[0]) / (when - prev[0])
        prev = (when, loss)
    return points[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="+", required=True)
    parser.add_argument("--work", default="/tmp/bertgpu-ttq")
    parser.add_argument("--budget", type=float, default=300, help="wall-clock seconds per run")
    parser.add_argument("--every", type=float, default=30, help="save every N seconds of a run")
    parser.add_argument("--model", default="mini")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=float, default=0.06)
    parser.add_argument(
        "--variants",
        default="transformers,bert,fast",
        help="comma-separated: transformers (at bertgpu's precision), transformers:fp32 (the Trainer's default), "
        "or a bertgpu recipe with more flags after a colon",
    )
    parser.add_argument(
        "--arch", default="bert", help="comma-separated bertgpu architectures, each run with every bertgpu variant"
    )
    parser.add_argument("--heldout-every", type=int, default=20)
    parser.add_argument("--reuse", action="store_true", help="keep the data and curves already in --work")
    parser.add_argument(
        "--own-schedule",
        action="store_true",
        help="bertgpu runs with --time-budget and its recipe's own lr and warmup (no calibration, no --lr/--warmup)",
    )
    parser.add_argument("--plot", default=str(ROOT / "benchmarks" / "time_to_quality.png"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    import torch
    from transformers import BertTokenizerFast

    from bertgpu.config import PRESETS

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    train, held = split_corpus(args.corpus, work, args.heldout_every)
    vocab = work / "vocab.txt"
    reuse = args.reuse and (work / "blocks.pt").exists()  # a later run in the same --work: the same data
    if not reuse:
        sh(*BERTGPU, "vocab", train, "--size", args.vocab_size, "--out", vocab, "--overwrite")
    data = work / "data"
    if not reuse:
        sh(*BERTGPU, "prepare", train, "--vocab", vocab, "--out", data, "--overwrite", "--workers", "2")
    # transformers 5 builds an empty vocab from BertTokenizerFast(vocab_file=...): load a directory instead
    tokenizer_dir = work / "tokenizer"
    tokenizer_dir.mkdir(exist_ok=True)
    (tokenizer_dir / "vocab.txt").write_bytes(vocab.read_bytes())
    (tokenizer_dir / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True})
    )
    tokenizer = BertTokenizerFast.from_pretrained(tokenizer_dir)
    assert tokenizer("the [MASK] statement")["input_ids"][1] == tokenizer.vocab["the"], "tokenizer not loaded"
    blocks = torch.load(work / "blocks.pt") if reuse else pack(train, tokenizer, args.seq)
    torch.save(blocks, work / "blocks.pt")
    held_blocks = pack(held, tokenizer, args.seq)[:512]
    batches = heldout_batches(held_blocks, tokenizer, maskings=2, seed=1234)
    layers, hidden, heads = PRESETS[args.model]
    shape = {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
        "max_position_embeddings": 512,
    }
    print(
        f"corpus: {len(blocks):,} training blocks of {args.seq}, {len(held_blocks)} held-out blocks; "
        f"model {args.model}, vocab {args.vocab_size}, batch {args.batch}, lr {args.lr:g}, budget {args.budget:g}s",
        flush=True,
    )

    runs, curves = {}, {}
    if reuse and (work / "curves.json").exists():  # the runs measured before, kept beside the new ones
        curves = json.loads((work / "curves.json").read_text())
    for variant in args.variants.split(","):
        if variant.startswith("transformers"):
            precision = variant.partition(":")[2] or bertgpu_precision()
            name = f"transformers ({precision}{', its default' if precision == 'fp32' else ''})"
            name += f" run {sum(n.startswith(name) for n in curves) + 1}" if name in curves else ""
            runs[name] = run_transformers(work, args, shape, work / "blocks.pt", tokenizer_dir, precision)
        else:
            recipe, _, extra = variant.partition(":")
            for arch in args.arch.split(","):
                label = f"bertgpu{'' if args.arch == 'bert' else ' --arch ' + arch} --recipe {recipe} {extra}".strip()
                runs[label] = run_bertgpu(work, args, data, variant, arch)
                curves[label] = curve(
                    runs[label], batches
                )  # after each run: a stopped benchmark keeps what it measured
                print(f"{label}: held-out loss {curves[label][-1][1]:.3f} at {curves[label][-1][0]:.0f} s", flush=True)
                (work / "curves.json").write_text(json.dumps(curves, indent=1))
            continue
        name = list(runs)[-1]
        curves[name] = curve(runs[name], batches)  # after each run: a stopped benchmark keeps what it measured
        print(f"{name}: held-out loss {curves[name][-1][1]:.3f} at {curves[name][-1][0]:.0f} s", flush=True)
        (work / "curves.json").write_text(json.dumps(curves, indent=1))
    report(curves, args)


def report(curves: dict[str, list[tuple[float, float]]], args) -> None:
    """One table per transformers run (the equal-precision one first): each run's final held-out loss, and
    the time it needs to reach that transformers run's final loss."""
    peers = sorted((name for name in curves if name.startswith("transformers")), key=lambda n: "default" in n)
    for peer_name in peers or [None]:
        peer = curves.get(peer_name) if peer_name else None
        print(f"\n{f'against {peer_name}' if peer_name else ''}")
        print(
            f"| run | held-out MLM loss at the end | below the peer | at {args.budget:g} s of the command | "
            "time to the peer's final loss | ratio |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        target = peer[-1][1] if peer else None
        peer_time = time_to_reach(peer, target) if peer else None
        for name, points in curves.items():
            reach = time_to_reach(points, target) if target is not None else None
            ratio = f"{peer_time / reach:.2f}x" if reach and peer_time else "not reached"
            below = f"{target - points[-1][1]:+.3f}" if target is not None else ""
            print(
                f"| {name} | {points[-1][1]:.3f} (at {points[-1][0]:.0f} s) | {below} | "
                f"{loss_at(points, args.budget):.3f} | "
                f"{f'{reach:.0f} s' if reach else 'not reached'} | {ratio} |"
            )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(pip install matplotlib for the plot)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in curves.items():
        ax.plot([t for t, _ in points], [loss for _, loss in points], marker="o", label=name)
    for peer_name in peers:
        ax.axhline(curves[peer_name][-1][1], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("wall-clock seconds (2 CPU cores)")
    ax.set_ylabel("held-out masked-token loss (nats)")
    ax.set_title(f"{args.model} ({args.arch}), vocab {args.vocab_size}, batch {args.batch}, seq {args.seq}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
