"""transfer.py's runs, each through the command line as a user runs it: a start's pretraining (``pretrain``), a
randomly initialised start (``random_bert``) and a fine-tuning tested on the held-out labels (``finetune``)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import common


def cli(*args, log: Path | None = None) -> None:
    t0 = time.perf_counter()
    common.bertgpu(*args, log=log)
    print(f"  bertgpu {args[0]} ... {time.perf_counter() - t0:.0f}s", flush=True)


def random_bert(path: Path, like: Path | None, vocab: Path, preset: str = "mini", arch: str = "bert") -> Path:
    """A randomly initialised directory of ``arch``: ``preset`` with ``vocab``, or the shape of the BERT at
    ``like``."""
    import torch

    from bertgpu.checkpoints.hf_dir import save_pretrained
    from bertgpu.models import architectures

    if path.exists():
        return path
    tokens = vocab.read_text(encoding="utf-8").splitlines()
    if like is None:
        config = architectures.preset(arch, preset, len(tokens), tokens)
    else:
        config = architectures.config_from_hf_dict(json.loads((like / "config.json").read_text()))
    torch.manual_seed(0)
    model = architectures.pretraining_model(config)
    save_pretrained(model, config, path, vocab_path=vocab, do_lower_case=True)
    return path


def pretrain(data: Path, model: str | Path, out: Path, args, steps: int, lr: float, arch: str = "bert") -> Path:
    """``steps`` at ``lr``, or with --pretrain-budget the recipe's own run within that time."""
    if not (out / "checkpoints").exists() or not any((out / "checkpoints").glob("step-*")):
        length = (
            common.flags(time_budget=args.pretrain_budget, save_every_minutes=5)
            if args.pretrain_budget
            else common.flags(steps=steps, lr=lr, warmup=0.06, save_every=max(steps // 4, 1))
        )
        cli(
            "pretrain",
            *common.flags(data=data, model=model, arch=arch, out=out, no_nsp=True, recipe="fast",
                          batch_size=args.batch // 2, nproc=2, eval_fraction=0.02, eval_instances=500, keep=1,
                          log_every=50, device="cpu", loader_workers=0, overwrite=True),
            *length,
            *args.pretrain_flags.split(),
            log=out.with_suffix(".log"),
        )  # fmt: skip
    newest = max((out / "checkpoints").glob("step-*"))
    evals = [r for r in common.log_records(out) if "eval_mlm_loss" in r]
    print(f"  {out.name}: held-out MLM loss " + ", ".join(f"{r['eval_mlm_loss']:.2f} @ {r['step']}" for r in evals))
    return newest


def finetune(
    start: Path, train: Path, test: Path, out: Path, seed: int, epochs: int, lr: float, own_defaults: bool = False
) -> dict:
    """Fine-tune ``start``, then test; with ``own_defaults`` as fine-tuning chooses (no --lr, --epochs, ...)."""
    chosen = {} if own_defaults else dict(epochs=epochs, lr=lr, warmup=0.1, batch_size=16)
    cli(
        "finetune",
        *common.flags(model=start, train=train, out=out, **chosen, nproc=2, max_seq_length=64, seed=seed,
                      device="cpu", save_total_limit=1, overwrite=True),
        log=out.with_suffix(".log"),
    )  # fmt: skip
    t0 = time.perf_counter()
    # beside the run, not in it: evaluate refuses to write inside the model it reads
    result = common.evaluate(out, test, out.with_name(f"{out.name}-test.json"), "--nproc", 2, "--device", "cpu")
    print(f"  bertgpu evaluate ... {time.perf_counter() - t0:.0f}s", flush=True)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # keep best/ only: the study writes many runs
    return {"accuracy": result["accuracy"], "f1": result["f1"]}
