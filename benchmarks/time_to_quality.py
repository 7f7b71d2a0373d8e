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
import sys
from pathlib import Path

import corpora
from common import ROOT, bertgpu
from mlm_curves import curve, heldout_batches, pack
from time_to_quality_report import report
from time_to_quality_runs import bertgpu_precision, run_bertgpu, run_transformers


def split_corpus(inputs: list[str], work: Path, heldout_every: int) -> tuple[Path, Path]:
    """Files (sorted) into train.txt and heldout.txt: every heldout_every-th file is held out whole."""
    files = corpora.corpus_files(inputs)
    train, held = work / "train.txt", work / "heldout.txt"
    with open(train, "w", encoding="utf-8") as t, open(held, "w", encoding="utf-8") as h:
        for i, f in enumerate(files):
            text = Path(f).read_text(encoding="utf-8", errors="replace").strip()
            (h if i % heldout_every == heldout_every - 1 else t).write(text + "\n\n")
    return train, held


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

    from bertgpu.models import architectures

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


if __name__ == "__main__":
    main()
