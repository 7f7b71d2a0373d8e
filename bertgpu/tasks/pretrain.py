"""`bertgpu pretrain`: masked LM + next-sentence prediction, data parallel over processes.

``run`` checks everything a user can get wrong before any process starts, then trains in this
process or in ``nproc`` workers. ``train`` is the whole training loop of one worker, top to bottom.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from .. import checkpoint, distributed
from ..config import ModelConfig, PretrainConfig, PRESETS
from ..data.pretraining import IGNORE_INDEX, GlobalBatchSampler, PretrainingDataset
from ..data.shards import ShardedCorpus
from ..data.tokenizer import load_vocab, vocab_sha256
from ..errors import UserError
from ..model import BertForPreTraining, training_flops_per_sequence
from ..training import (RunLog, Throughput, autocast, build_optimizer, build_schedule, console_is_tty,
                        format_rate, peak_flops, resolve_precision)


@dataclass
class Plan:
    """What ``check`` worked out from the config: the model to build and where its weights come from."""

    model_config: ModelConfig
    init_from: Path | None  # a BERT directory whose weights to start from
    lowercase: bool


def check(cfg: PretrainConfig) -> Plan:
    """Every user mistake we can see before training, as a UserError. No side effects."""
    corpus = ShardedCorpus(cfg.data.data)
    init_from = None
    model = cfg.model
    if model in PRESETS:
        mcfg = ModelConfig.preset(model, vocab_size=corpus.vocab_size)
    else:
        path = Path(model)
        if not path.exists():
            raise UserError(f"--model {model}: not a preset ({', '.join(PRESETS)}) and no such file or directory")
        mcfg = ModelConfig.load(path)
        if path.is_dir():
            if (path / "model.safetensors").exists():
                init_from = path
            if (path / "vocab.txt").exists() and vocab_sha256(path / "vocab.txt") != corpus.vocab_sha256:
                raise UserError(f"{cfg.data.data} was prepared with another vocab than the model's "
                                f"({path / 'vocab.txt'}); run `bertgpu prepare` with --vocab {path / 'vocab.txt'}")
        if mcfg.vocab_size != corpus.vocab_size:
            raise UserError(f"model vocab_size {mcfg.vocab_size} ({model}) differs from the data's vocab of "
                            f"{corpus.vocab_size} tokens ({cfg.data.data}): the data was prepared with another vocab")
    if cfg.data.max_seq_length > mcfg.max_position_embeddings:
        raise UserError(f"--max-seq-length {cfg.data.max_seq_length} is beyond the model's "
                        f"{mcfg.max_position_embeddings} positions (max_position_embeddings)")
    if cfg.dropout is not None:
        mcfg = dataclasses.replace(mcfg, hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout)
    return Plan(mcfg, init_from, bool(corpus.meta.get("lowercase", True)))


def check_run_dir(cfg: PretrainConfig) -> None:
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not cfg.overwrite:
        raise UserError(f"run directory {out} is not empty; pass --overwrite to start afresh there")


def run(cfg: PretrainConfig) -> None:
    """Check, then train here (one process, or one worker of torchrun) or in local workers."""
    cfg = dataclasses.replace(cfg, device=distributed.resolve_device(cfg.device))
    check(cfg)
    check_run_dir(cfg)
    if distributed.launched_externally():
        distributed.worker_main(train, cfg)
        return
    nproc = distributed.resolve_nproc(cfg.nproc, cfg.device)
    if nproc == 1:
        distributed.worker_main(train, cfg)
    else:
        distributed.launch(distributed.worker_main, (train, cfg), nproc)


def train(cfg: PretrainConfig) -> Path:
    env = distributed.init(cfg.device)
    plan = check(cfg)
    device, world = env.device, env.world_size
    run_dir = Path(cfg.out)
    if env.is_main:
        if cfg.overwrite and run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    distributed.barrier()

    # Data: one global order per epoch; this rank reads only its share of each global batch.
    corpus = ShardedCorpus(cfg.data.data)
    dataset = PretrainingDataset(corpus, cfg.data, cfg.seed, load_vocab(corpus.vocab_path))
    b, accum = cfg.batch_size, cfg.grad_accum
    global_batch = b * world * accum
    if len(dataset) < global_batch:
        raise UserError(f"{cfg.data.data} gives {len(dataset)} instances per epoch, fewer than one global batch "
                        f"of {global_batch} (batch size {b} x {world} processes x {accum} accumulation)")

    # Model: the same initial weights on every rank (same seed; DDP also broadcasts rank 0's).
    torch.manual_seed(cfg.seed)
    model = BertForPreTraining(plan.model_config)
    if plan.init_from is not None:
        checkpoint.load_weights(model, plan.init_from)
    model.to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world > 1 else None
    net = ddp or model
    torch.manual_seed(cfg.seed + 1 + env.rank)  # dropout: a generator of this rank's own

    precision = resolve_precision(cfg.precision, device)
    optimizer = build_optimizer(model, cfg.optim, device)
    schedule = build_schedule(optimizer, cfg.optim)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    L = cfg.data.max_seq_length
    meter = Throughput(training_flops_per_sequence(plan.model_config, L, cfg.data.max_predictions),
                       peak_flops(device, precision), world)
    log = RunLog(run_dir, env.is_main)
    if env.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"bertgpu pretrain: {n_params / 1e6:.1f}M parameters, {world} process(es) on {device.type}, "
              f"{precision}, global batch {global_batch} = {b} x {world} x {accum}, "
              f"{len(dataset):,} instances in epoch 0", flush=True)
    bar = tqdm(total=cfg.optim.steps, disable=not (env.is_main and console_is_tty()), unit="step")
    # Running sums on the device (no host sync inside a step): mlm loss, mlm correct, masked,
    # nsp loss, nsp correct, sequences, real tokens.
    sums = torch.zeros(7, dtype=torch.float64, device=device)
    first_loss = last_loss = None
    step, epoch, saved = 0, 0, None
    window = 0

    while step < cfg.optim.steps:
        dataset.set_epoch(epoch)
        sampler = GlobalBatchSampler(len(dataset), b, world, env.rank, accum, cfg.seed, epoch)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=cfg.data.loader_workers,
                                             pin_memory=device.type == "cuda",
                                             prefetch_factor=4 if cfg.data.loader_workers else None)
        batches = iter(loader)
        for in_epoch in range(1, sampler.steps + 1):
            micro = [{k: v.to(device, non_blocking=True) for k, v in next(batches).items()} for _ in range(accum)]
            # The MLM loss is normalised by the masked-token count of the whole global batch.
            n_masked = sum((mb["mlm_labels"] != IGNORE_INDEX).sum() for mb in micro).float()
            distributed.all_reduce_sum(n_masked)
            for i, mb in enumerate(micro):
                sync = ddp is None or i == accum - 1
                with (contextlib.nullcontext() if sync else ddp.no_sync()), autocast(precision, device):
                    mlm_logits, nsp_logits = net(mb["input_ids"], mb["token_type_ids"], mb["attention_mask"],
                                                 mb["mlm_positions"])
                mlm_logits, labels = mlm_logits.float().flatten(0, 1), mb["mlm_labels"].flatten()
                mlm_loss = F.cross_entropy(mlm_logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
                loss = mlm_loss / n_masked
                if cfg.data.nsp:
                    nsp_loss = F.cross_entropy(nsp_logits.float(), mb["nsp_label"], reduction="sum")
                    loss = loss + nsp_loss / global_batch
                else:
                    nsp_loss = torch.zeros((), device=device)
                # DDP averages gradients over processes; scale so the result is the global-batch loss's.
                scaler.scale(loss * world).backward()
                with torch.no_grad():
                    valid = labels != IGNORE_INDEX
                    sums += torch.stack([
                        mlm_loss, ((mlm_logits.argmax(-1) == labels) & valid).sum(), valid.sum(),
                        nsp_loss, (nsp_logits.argmax(-1) == mb["nsp_label"]).sum(),
                        torch.tensor(len(labels) // cfg.data.max_predictions, device=device),
                        mb["attention_mask"].sum()]).double()
            if cfg.optim.clip > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip)
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window += 1
            bar.update(1)

            if step % cfg.log_every == 0 or step == cfg.optim.steps:
                distributed.all_reduce_sum(sums)
                s = sums.tolist()
                sums.zero_()
                mlm = s[0] / max(s[2], 1)
                nsp = s[3] / max(s[5], 1)
                values = {"loss": mlm + nsp, "mlm_loss": mlm, "mlm_acc": s[1] / max(s[2], 1), "nsp_loss": nsp,
                          "nsp_acc": s[4] / max(s[5], 1), "lr": schedule.get_last_lr()[0],
                          "global_batch": global_batch, "epoch": epoch,
                          **meter.rates(window, int(s[5]), int(s[6]))}
                window = 0
                first_loss = values["mlm_loss"] if first_loss is None else first_loss
                last_loss = values["mlm_loss"]
                if not math.isfinite(values["loss"]):
                    raise UserError(f"the loss became {values['loss']} at step {step}; lower --lr or use fp32/bf16")
                line = (f"step {step}/{cfg.optim.steps} | loss {values['loss']:.4f} | mlm {mlm:.4f} "
                        f"acc {values['mlm_acc']:.3f}")
                if cfg.data.nsp:
                    line += f" | nsp {nsp:.4f} acc {values['nsp_acc']:.3f}"
                line += (f" | lr {values['lr']:.2e} | batch {global_batch} | {values['steps_per_s']:.2f} steps/s"
                         f" | {format_rate(values['seq_per_s'])} seq/s | {format_rate(values['tokens_per_s'])} tok/s")
                if "mfu" in values:
                    line += f" | mfu {100 * values['mfu']:.1f}%"
                log.log(step, values, line, write=tqdm.write if bar.disable is False else _print)

            if step % cfg.save_every == 0 or step == cfg.optim.steps:
                saved = checkpoint.save_checkpoint(
                    run_dir, step, model, optimizer, schedule, scaler, cfg, plan.model_config,
                    vocab_path=corpus.vocab_path, do_lower_case=plan.lowercase,
                    position={"epoch": epoch, "step_in_epoch": in_epoch},
                    is_main=env.is_main, keep=cfg.keep)
                distributed.barrier()
            if step == cfg.optim.steps:
                break
        del batches, loader
        epoch += 1
    bar.close()
    log.close()
    if env.is_main:
        print(f"mlm loss {first_loss:.4f} -> {last_loss:.4f} over {step} steps", flush=True)
        print(f"checkpoint: {saved}  (a Hugging Face BERT directory: "
              f"transformers.BertForPreTraining.from_pretrained('{saved}'))", flush=True)
    return saved


def _print(line: str) -> None:
    print(line, flush=True)

