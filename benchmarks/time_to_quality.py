"""Time-to-quality: held-out masked-LM loss against wall-clock time, bertgpu against transformers.

The same corpus, vocab, model shape, sequence length, global batch, learning-rate schedule shape and
wall-clock budget, one after the other on this machine:

- **transformers** as its users pretrain: the masked-LM class of each architecture of --arch (BertForMaskedLM,
  ModernBertForMaskedLM) built from the config.json bertgpu writes for the same preset (the same shape),
  DataCollatorForLanguageModeling (15%, 80/10/10), the text packed into blocks of --seq tokens as run_mlm does,
  Trainer's defaults (AdamW fused where torch has it, linear decay) with the same warmup share and batch, at each
  learning rate of --hf-lr (its own best is the reference: each side at its own best rate); variant
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
packed as run_mlm packs. The headline, per architecture, is how far below the Trainer's best run bertgpu ends,
and the time-to-quality ratio: the time that Trainer run needs to reach its final held-out loss, divided by the
time bertgpu needs to reach that same loss.

    python benchmarks/time_to_quality.py --corpus DIR_OR_FILES... [--budget 300] [--variants transformers,bert,fast]
        [--arch bert,modernbert] [--hf-lr 5e-4,1e-3,2e-3] [--own-schedule]

Without a transformers variant, the first run is the reference of the ratios.

A corpus: the Python documentation sources of Debian's python3.11-doc (`apt-get download python3.11-doc`,
`dpkg-deb -x python3.11-doc_*.deb DIR`, then DIR/usr/share/doc/python3.11/html/_sources).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import common
from common import BERTGPU, PEERS, PY, ROOT, bertgpu, sh
from mlm_curves import curve, heldout_batches, loss_at, pack, time_to_reach

HF_CHILD = str(PEERS / "hf_trainer_mlm.py")  # the transformers side, in a process of its own


def split_corpus(inputs: list[str], work: Path, heldout_every: int) -> tuple[Path, Path]:
    """Files (sorted) into train.txt and heldout.txt: every heldout_every-th file is held out whole."""
    files = common.corpus_files(inputs)
    train, held = work / "train.txt", work / "heldout.txt"
    with open(train, "w", encoding="utf-8") as t, open(held, "w", encoding="utf-8") as h:
        for i, f in enumerate(files):
            text = Path(f).read_text(encoding="utf-8", errors="replace").strip()
            (h if i % heldout_every == heldout_every - 1 else t).write(text + "\n\n")
    return train, held


def bertgpu_precision() -> str:
    """The precision `bertgpu pretrain --recipe fast` takes on this machine's CPU (--precision auto)."""
    from bertgpu.precision import cpu_has_native_bf16

    return "bf16" if cpu_has_native_bf16() else "fp32"


def run_transformers(
    work: Path, args, config: dict, blocks_path: Path, tokenizer_dir: Path, precision: str, lr: float
) -> Path:
    """The Trainer on the masked-LM class of ``config`` (a config.json dict) at ``precision`` and peak rate ``lr``."""
    out = work / f"transformers-{config['model_type']}-{precision}-lr{lr:g}"
    shutil.rmtree(out, ignore_errors=True)
    spec = dict(blocks=str(blocks_path), tokenizer_dir=str(tokenizer_dir), config=config, batch=args.batch, lr=lr,
                warmup=args.warmup, seed=0, every=args.every, budget=args.budget, out=str(out), bf16=precision == "bf16",
                clock=args.own_schedule)  # fmt: skip
    if args.own_schedule:  # the schedule follows the clock: no calibration, steps until the budget stops it
        print(f"{out.name}: learning rate by the clock, stopped at the budget", flush=True)
        sh(PY, HF_CHILD, json.dumps({**spec, "steps": 10**7, "calibrate": False}))
        return out
    calib = sh(PY, HF_CHILD, json.dumps({**spec, "steps": 20, "calibrate": True}))
    per_step = json.loads(calib.stdout.strip().splitlines()[-1])["seconds_per_step"]
    steps = int(args.budget / per_step)
    print(f"{out.name}: {per_step * 1000:.0f} ms/step -> a schedule of {steps} steps", flush=True)
    sh(PY, HF_CHILD, json.dumps({**spec, "steps": steps, "calibrate": False}))
    return out


def timed_checkpoints(out: Path, start: float, cap: float = float("inf")) -> Path:
    """Name each checkpoint of the run in ``out`` by its time (``tSSSSSS.S-step-N``, at most ``cap``): when its
    directory appeared, from the start of the command (``start``, a perf_counter reading)."""
    for ckpt in sorted((out / "checkpoints").glob("step-*")):
        elapsed = ckpt.stat().st_mtime - (time.time() - (time.perf_counter() - start))
        ckpt.rename(out / f"t{min(elapsed, cap):08.1f}-{ckpt.name}")
    return out


def run_dir(work: Path, prefix: str, variant: str, arch: str) -> Path:
    """An empty directory for one bertgpu run, named after its variant (and architecture, unless bert)."""
    name = variant if arch == "bert" else f"{arch}-{variant}"
    out = work / (prefix + "".join(c if c.isalnum() else "-" for c in name).strip("-"))
    shutil.rmtree(out, ignore_errors=True)
    return out


def run_bertgpu(work: Path, args, data: Path, variant: str, arch: str = "bert") -> Path:
    """``variant``: a recipe, optionally with more flags after a colon (``bert:--pack``)."""
    if args.own_schedule:
        return run_bertgpu_budget(work, args, data, variant, arch)
    recipe, _, extra = variant.partition(":")
    out = run_dir(work, "bertgpu-", variant, arch)
    flags = [
        "pretrain",
        *common.flags(data=data, model=args.model, arch=arch, no_nsp=True, recipe=recipe),
    ]
    flags += common.flags(nproc=2, batch_size=args.batch // 2, max_seq_length=args.seq, lr=args.lr, warmup=args.warmup,
                          device="cpu", log_every=10, seed=0, overwrite=True)  # fmt: skip
    flags += extra.split()  # last, so that a variant's flag wins over the race's (argparse keeps the last)
    bertgpu(*flags, "--out", work / "calibrate", "--steps", 40, "--save-every", 1000)
    last = common.log_records(work / "calibrate")[-1]
    steps = int(args.budget * last["steps_per_s"])
    print(
        f"bertgpu --arch {arch} --recipe {recipe} {extra}: {1000 / last['steps_per_s']:.0f} ms/step -> a schedule "
        f"of {steps} steps",
        flush=True,
    )
    save_every = max(1, int(args.every * last["steps_per_s"]))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*BERTGPU, *flags, *common.flags(out=out, steps=steps, save_every=save_every, keep=100000)],
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
    return timed_checkpoints(out, start, args.budget + 30)


def run_bertgpu_budget(work: Path, args, data: Path, variant: str, arch: str = "bert") -> Path:
    """bertgpu as a user runs it: `--time-budget` and the recipe's own learning rate and warmup."""
    recipe, _, extra = variant.partition(":")
    out = run_dir(work, "bertgpu-budget-", variant, arch)
    cmd = [
        *BERTGPU, "pretrain", "--data", data, "--model", args.model, "--arch", arch, "--no-nsp", "--recipe", recipe,
        "--nproc", "2", "--batch-size", args.batch // 2, "--max-seq-length", args.seq, "--device", "cpu",
        "--log-every", "10", "--seed", "0", "--time-budget", f"{args.budget:g}s",
        "--save-every-minutes", f"{args.every / 60:g}", "--keep", "100000", "--out", out,
        *extra.split(),  # last, so that a variant's flag wins over the race's (argparse keeps the last)
    ]  # fmt: skip
    start = time.perf_counter()
    proc = sh(*cmd, timeout=args.budget + 600)
    took = time.perf_counter() - start
    first = proc.stdout.splitlines()[0]
    print(
        f"bertgpu --recipe {recipe} {extra} --time-budget {args.budget:g}s: the command took {took:.0f} s", flush=True
    )
    print(f"  {first}", flush=True)
    (out / "stdout.txt").write_text(proc.stdout)
    return timed_checkpoints(out, start)


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
    parser.add_argument(
        "--hf-lr",
        default="",
        help="comma-separated peak learning rates of the Trainer runs (default: --lr); the best is the reference",
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

    from bertgpu import architectures

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    train, held = split_corpus(args.corpus, work, args.heldout_every)
    vocab = work / "vocab.txt"
    reuse = args.reuse and (work / "blocks.pt").exists()  # a later run in the same --work: the same data
    if not reuse:
        bertgpu("vocab", train, "--size", args.vocab_size, "--out", vocab, "--overwrite")
    data = work / "data"
    if not reuse:
        bertgpu("prepare", train, "--vocab", vocab, "--out", data, "--overwrite", "--workers", "2")
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
    tokens = vocab.read_text(encoding="utf-8").splitlines()
    archs = args.arch.split(",")
    configs = {arch: architectures.preset(arch, args.model, len(tokens), tokens).to_hf_dict() for arch in archs}
    print(
        f"corpus: {len(blocks):,} training blocks of {args.seq}, {len(held_blocks)} held-out blocks; "
        f"model {args.model}, vocab {args.vocab_size}, batch {args.batch}, lr {args.lr:g}, budget {args.budget:g}s",
        flush=True,
    )

    curves, kinds = {}, {}  # each run's curve, and (architecture, side) of each
    if reuse and (work / "curves.json").exists():  # the runs measured before, kept beside the new ones
        curves = json.loads((work / "curves.json").read_text())
        kinds = json.loads((work / "kinds.json").read_text()) if (work / "kinds.json").exists() else {}

    def measured(name: str, run: Path, arch: str, side: str) -> None:
        """The run's curve, kept after each run: a stopped benchmark keeps what it measured."""
        curves[name], kinds[name] = curve(run, batches), [arch, side]
        if not curves[name]:
            sys.exit(f"{name}: the run saved no model within --budget {args.budget:g} s (raise --budget)")
        print(f"{name}: held-out loss {curves[name][-1][1]:.3f} at {curves[name][-1][0]:.0f} s", flush=True)
        (work / "curves.json").write_text(json.dumps(curves, indent=1))
        (work / "kinds.json").write_text(json.dumps(kinds, indent=1))

    hf_lrs = [float(x) for x in args.hf_lr.split(",")] if args.hf_lr else [args.lr]
    for variant in filter(None, args.variants.split(",")):  # --variants "" with --reuse: report what was measured
        for arch in archs:
            if variant.startswith("transformers"):
                precision = variant.partition(":")[2] or bertgpu_precision()
                hf_class = configs[arch]["architectures"][0].replace("ForPreTraining", "ForMaskedLM")
                for lr in hf_lrs:
                    name = f"transformers {hf_class} ({precision}{', its default' if precision == 'fp32' else ''})"
                    name += f" lr {lr:g}"
                    name += f" run {sum(n.startswith(name) for n in curves) + 1}" if name in curves else ""
                    run = run_transformers(work, args, configs[arch], work / "blocks.pt", tokenizer_dir, precision, lr)
                    measured(name, run, arch, f"transformers:{precision}")
                continue
            recipe, _, extra = variant.partition(":")
            label = f"bertgpu{'' if args.arch == 'bert' else ' --arch ' + arch} --recipe {recipe} {extra}".strip()
            measured(label, run_bertgpu(work, args, data, variant, arch), arch, "bertgpu")
    report(curves, kinds, args)


def report(curves: dict[str, list[tuple[float, float]]], kinds: dict[str, list[str]], args) -> None:
    """Per architecture, one table per precision of its Trainer runs (the equal-precision one first) against
    the best of them (each side at its own best learning rate): each run's final held-out loss, how far
    below the peer's it ends, and the time it needs to reach the peer's final loss."""
    kind = {name: kinds.get(name, ["bert", "transformers" if name.startswith("transformers") else "bertgpu"])
            for name in curves}  # fmt: skip
    archs = args.arch.split(",")  # the architectures asked for: their tables, and their curves in the plot
    curves = {name: points for name, points in curves.items() if kind[name][0] in archs}
    hlines = []
    for arch in dict.fromkeys(kind[name][0] for name in curves):
        runs = [name for name in curves if kind[name][0] == arch]
        sides = sorted({kind[n][1] for n in runs if kind[n][1].startswith("transformers")}, key=lambda s: "fp32" in s)
        for side in sides or [None]:
            peers = [n for n in runs if kind[n][1] == side]
            peer_name = min(peers, key=lambda n: curves[n][-1][1]) if peers else None
            peer = curves[peer_name] if peer_name else None
            hlines += [peer[-1][1]] if peer else []
            print(f"\n{arch}" + (f": against {peer_name}, the best of {len(peers)} Trainer run(s)" if peer else ""))
            print(
                f"| run | held-out MLM loss at the end | below the peer | at {args.budget:g} s of the command | "
                "time to the peer's final loss | ratio |"
            )
            print("| --- | --- | --- | --- | --- | --- |")
            target = peer[-1][1] if peer else None
            peer_time = time_to_reach(peer, target) if peer else None
            for name in runs:
                points = curves[name]
                reach = time_to_reach(points, target) if target is not None else None
                ratio = f"{peer_time / reach:.2f}x" if reach and peer_time else "not reached"
                below = f"{target - points[-1][1]:+.3f}" if target is not None else ""
                print(
                    f"| {name} | {points[-1][1]:.3f} (at {points[-1][0]:.0f} s) | {below} | "
                    f"{loss_at(points, args.budget):.3f} | "
                    f"{f'{reach:.0f} s' if reach else 'not reached'} | {ratio} |"
                )
    title = f"{args.model} ({args.arch}), vocab {args.vocab_size}, batch {args.batch}, seq {args.seq}"
    if common.plot_curves(curves, args.plot, "wall-clock seconds (2 CPU cores)", "held-out masked-token loss (nats)",
                          title, hlines):  # fmt: skip
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
