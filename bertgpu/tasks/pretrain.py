"""`bertgpu pretrain`: masked LM + next-sentence prediction, data parallel over processes.

``run`` checks everything a user can get wrong before any process starts, then trains in this
process or in ``nproc`` workers. ``train`` is the whole training loop of one worker, top to bottom.

Nothing is lost: checkpoints are atomic; ``--resume`` (or a restart by torchrun/our launcher)
continues from the latest complete checkpoint with the model, optimizer, schedule, scaler, every
rank's RNG and the exact data position (epoch, step in epoch) restored, so the resumed run is the
uninterrupted run, bit for bit on CPU. SIGINT/SIGTERM finish the current step, write a checkpoint
and exit non-zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from .. import checkpoint, distributed
from ..config import PRESETS, ModelConfig, PretrainConfig
from ..data.pretraining import IGNORE_INDEX, GlobalBatchSampler, PretrainingDataset, check_nsp_possible
from ..data.shards import ShardedCorpus
from ..data.tokenizer import load_vocab, vocab_sha256
from ..errors import UserError
from ..model import BertForPreTraining, training_flops_per_sequence
from ..training import (LaggedFlags, RunLog, StopSignal, Throughput, allow_tf32, autocast, build_optimizer,
                        build_schedule, console_is_tty, format_rate, gather_rng_states, ignore_stop_signals,
                        peak_flops, resolve_precision, restore_rng_state, skip_if)


@dataclass
class Plan:
    """What ``check`` worked out from the config: the model to build and where its weights come from."""

    model_config: ModelConfig
    init_from: Path | None  # a BERT directory whose weights to start from
    lowercase: bool


def _check_same_vocab(model_dir: Path, corpus: ShardedCorpus, data_dir: str) -> None:
    if (model_dir / "vocab.txt").exists() and vocab_sha256(model_dir / "vocab.txt") != corpus.vocab_sha256:
        raise UserError(f"{data_dir} was prepared with another vocab than the model's ({model_dir / 'vocab.txt'}); "
                        f"run `bertgpu prepare` with --vocab {model_dir / 'vocab.txt'}")


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
            if (path / "model.safetensors").exists() or (path / "pytorch_model.bin").exists():
                init_from = path
            _check_same_vocab(path, corpus, cfg.data.data)
        if mcfg.vocab_size != corpus.vocab_size:
            raise UserError(f"model vocab_size {mcfg.vocab_size} ({model}) differs from the data's vocab of "
                            f"{corpus.vocab_size} tokens ({cfg.data.data}): the data was prepared with another vocab")
    if cfg.data.max_seq_length > mcfg.max_position_embeddings:
        raise UserError(f"--max-seq-length {cfg.data.max_seq_length} is beyond the model's "
                        f"{mcfg.max_position_embeddings} positions (max_position_embeddings)")
    if cfg.data.nsp:
        check_nsp_possible(corpus)
    if cfg.dropout is not None:
        mcfg = dataclasses.replace(mcfg, hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout)
    resume_from = checkpoint.latest_checkpoint(cfg.out) if cfg.resume else None
    if resume_from is not None:
        _check_same_vocab(resume_from, corpus, cfg.data.data)
    return Plan(mcfg, init_from, bool(corpus.meta.get("lowercase", True)))


def check_run_dir(cfg: PretrainConfig) -> None:
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (cfg.overwrite or cfg.resume):
        raise UserError(f"run directory {out} is not empty; pass --resume to continue the run there, "
                        "or --overwrite to start afresh")


def run(cfg: PretrainConfig) -> None:
    """Check, then train here (one process, or one worker of torchrun) or in local workers."""
    cfg = dataclasses.replace(cfg, device=distributed.resolve_device(cfg.device))
    check(cfg)
    if distributed.restart_count() == 0:
        check_run_dir(cfg)
    if distributed.launched_externally():
        distributed.worker_main(train, cfg)
        return
    nproc = distributed.resolve_nproc(cfg.nproc, cfg.device)
    if nproc == 1 and cfg.max_restarts == 0:
        distributed.worker_main(train, cfg)
    else:
        distributed.launch(distributed.worker_main, (train, cfg), nproc, max_restarts=cfg.max_restarts)


def train(cfg: PretrainConfig) -> Path:
    env = distributed.init(cfg.device)
    # A restart by torchrun --max-restarts (or our --max-restarts) resumes by itself.
    resume = cfg.resume or distributed.restart_count() > 0
    plan = check(dataclasses.replace(cfg, resume=resume))
    device, world = env.device, env.world_size
    run_dir = Path(cfg.out)
    if env.is_main:
        checkpoint.open_run_dir(run_dir, start_afresh=cfg.overwrite and not resume)
    distributed.barrier()
    resume_from = checkpoint.latest_checkpoint(run_dir) if resume else None

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
    model = BertForPreTraining(plan.model_config, pad_vocab_multiple=cfg.pad_vocab_multiple)
    if resume_from is not None or plan.init_from is not None:
        checkpoint.load_weights(model, resume_from or plan.init_from)
    model.to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world > 1 else None
    net = ddp or model
    if cfg.compile:
        net = torch.compile(net, dynamic=False)  # every batch has the same shapes: one graph
    torch.manual_seed(cfg.seed + 1 + env.rank)  # dropout: a generator of this rank's own

    precision = resolve_precision(cfg.precision, device)
    optimizer = build_optimizer(model, cfg.optim, device)
    schedule = build_schedule(optimizer, cfg.optim)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    allow_tf32(device)
    # Running sums since the last log line, on the device (no host sync for them inside a step):
    # mlm loss, mlm correct, masked, nsp loss, nsp correct, sequences, real tokens.
    sums = torch.zeros(7, dtype=torch.float64, device=device)
    step, epoch, in_epoch = 0, 0, 0
    if resume_from is not None:
        state = checkpoint.load_training_state(resume_from)
        checkpoint.check_optimizer_state(optimizer, state["optimizer"], resume_from)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        scaler.load_state_dict(state["scaler"])
        step, epoch, in_epoch = state["step"], state["position"]["epoch"], state["position"]["step_in_epoch"]
        restore_rng_state(state["rng"], env.rank, world, device)
        if env.is_main:
            sums += state["log_sums"].to(device)

    L = cfg.data.max_seq_length
    meter = Throughput(training_flops_per_sequence(plan.model_config, L, cfg.data.max_predictions),
                       peak_flops(device, precision), world)
    log = RunLog(run_dir, env.is_main, start_step=step)
    if env.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        how = f"resuming from {resume_from} at step {step}" if resume_from else "starting"
        print(f"bertgpu pretrain: {n_params / 1e6:.1f}M parameters, {world} process(es) on {device.type}, "
              f"{precision}, global batch {global_batch} = {b} x {world} x {accum}, "
              f"{len(dataset):,} instances in epoch {epoch}; {how}", flush=True)
    bar = tqdm(total=cfg.optim.steps, initial=step, disable=not (env.is_main and console_is_tty()), unit="step")
    write = tqdm.write if not bar.disable else (lambda line: print(line, flush=True))

    def save(reason: str = "") -> Path:
        rngs = gather_rng_states(device)
        log_sums = sums.clone()
        distributed.all_reduce_sum(log_sums)
        path = run_dir / "checkpoints" / f"step-{step:07d}"
        if env.is_main:
            state = {"position": {"epoch": epoch, "step_in_epoch": in_epoch}, "optimizer": optimizer.state_dict(),
                     "schedule": schedule.state_dict(), "scaler": scaler.state_dict(), "rng": rngs,
                     "log_sums": log_sums.cpu(), "world_size": world}
            path = checkpoint.save_checkpoint(run_dir, step, model, plan.model_config, state, cfg,
                                              vocab_path=corpus.vocab_path, do_lower_case=plan.lowercase, keep=cfg.keep)
        distributed.barrier()
        return path

    def read_flags(due: list[tuple[int, list[float]]]) -> bool:
        """Count skipped steps, stop after too many in a row; return whether a rank was asked to stop."""
        nonlocal skipped, bad_in_a_row
        stop_now = False
        for flag_step, (stop_flag, was_bad) in due:
            stop_now |= stop_flag > 0
            if not was_bad:
                bad_in_a_row = 0
                continue
            skipped += 1
            bad_in_a_row += 1
            if env.is_main:
                write(f"step {flag_step}: non-finite loss or gradient, step skipped ({skipped} so far)")
            if precision != "fp16" and bad_in_a_row >= cfg.max_bad_steps:
                flags.flush()
                path = save()
                raise UserError(f"the loss was not finite for {bad_in_a_row} steps in a row (up to step {flag_step}); "
                                f"stopped with the last good weights in {path}; lower --lr or check the data")
        return stop_now

    stop = StopSignal()
    window, bad_in_a_row, skipped = 0, 0, 0
    flags = LaggedFlags(device)
    saved = resume_from
    batches = None
    try:
        while step < cfg.optim.steps:
            dataset.set_epoch(epoch)
            sampler = GlobalBatchSampler(len(dataset), b, world, env.rank, accum, cfg.seed, epoch, start_step=in_epoch)
            loader = torch.utils.data.DataLoader(
                dataset, batch_sampler=sampler, num_workers=cfg.data.loader_workers, pin_memory=device.type == "cuda",
                prefetch_factor=4 if cfg.data.loader_workers else None,
                worker_init_fn=ignore_stop_signals if cfg.data.loader_workers else None,
                # Its own generator: creating the iterator must not draw from the dropout RNG stream,
                # or a resumed run would drift from the uninterrupted one.
                generator=torch.Generator().manual_seed(cfg.seed))
            batches = iter(loader)
            while in_epoch < sampler.steps and step < cfg.optim.steps:
                micro = [{k: v.to(device, non_blocking=True) for k, v in next(batches).items()} for _ in range(accum)]
                # One small all-reduce per step: the global batch's masked-token count (the MLM loss is
                # normalised by it) and whether any rank was asked to stop.
                counts = torch.stack([sum((mb["mlm_labels"] != IGNORE_INDEX).sum() for mb in micro).float(),
                                      torch.full((), float(stop.signum > 0), device=device)])
                distributed.all_reduce_sum(counts)
                n_masked = counts[0]
                step_sums = torch.zeros_like(sums)
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
                        step_sums += torch.stack([
                            mlm_loss, ((mlm_logits.argmax(-1) == labels) & valid).sum(), valid.sum(),
                            nsp_loss, (nsp_logits.argmax(-1) == mb["nsp_label"]).sum(),
                            torch.full((), len(mb["input_ids"]), device=device), mb["attention_mask"].sum()]).double()
                scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                           cfg.optim.clip if cfg.optim.clip > 0 else float("inf"))
                # A non-finite gradient (identical on every rank: it is all-reduced) skips the step on the
                # device; with fp16 the scaler does the same itself. No host sync inside the step.
                bad = (~torch.isfinite(grad_norm)).float()
                if precision != "fp16":
                    skip_if(optimizer, bad)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                schedule.step()
                step += 1
                in_epoch += 1
                window += 1
                bar.update(1)
                sums += torch.where(bad > 0, 0.0, step_sums)  # a skipped step's loss is not logged
                # This step's flags on the CPU, the previous step's on a GPU (read then, they cost no wait);
                # all of them before a checkpoint, so that it accounts for every step it holds.
                due = flags.push(step, torch.stack([counts[1], bad]))
                if step % cfg.save_every == 0 or step == cfg.optim.steps or any(f[0] for _, f in due):
                    due += flags.flush()
                stop_now = read_flags(due)

                if step % cfg.log_every == 0 or step == cfg.optim.steps:
                    distributed.all_reduce_sum(sums)
                    s = sums.tolist()
                    sums.zero_()
                    mlm = s[0] / max(s[2], 1)
                    nsp = s[3] / max(s[5], 1)
                    values = {"loss": mlm + nsp, "mlm_loss": mlm, "mlm_acc": s[1] / max(s[2], 1), "nsp_loss": nsp,
                              "nsp_acc": s[4] / max(s[5], 1), "lr": schedule.get_last_lr()[0],
                              "global_batch": global_batch, "epoch": epoch, "skipped_steps": skipped,
                              **meter.rates(window, int(s[5]), int(s[6]))}
                    window = 0
                    line = (f"step {step}/{cfg.optim.steps} | loss {values['loss']:.4f} | mlm {mlm:.4f} "
                            f"acc {values['mlm_acc']:.3f}")
                    if cfg.data.nsp:
                        line += f" | nsp {nsp:.4f} acc {values['nsp_acc']:.3f}"
                    line += (f" | lr {values['lr']:.2e} | batch {global_batch} | {values['steps_per_s']:.2f} steps/s"
                             f" | {format_rate(values['seq_per_s'])} seq/s | {format_rate(values['tokens_per_s'])} tok/s")
                    if "mfu" in values:
                        line += f" | mfu {100 * values['mfu']:.1f}%"
                    log.log(step, values, line, write=write)

                if step % cfg.save_every == 0 or step == cfg.optim.steps or stop_now:
                    saved = save()
                if stop_now:
                    name = signal.Signals(stop.signum).name if stop.signum else "a signal on another rank"
                    raise distributed.Interrupted(
                        f"stopped by {name} after step {step}; checkpoint {saved}. "
                        "Run the same command with --resume to continue.", stop.signum or signal.SIGTERM)
            batches = loader = None  # let this epoch's DataLoader workers go
            if in_epoch >= sampler.steps:
                epoch, in_epoch = epoch + 1, 0
    finally:
        if batches is not None and hasattr(batches, "_shutdown_workers"):
            batches._shutdown_workers()  # stop DataLoader workers now, not during interpreter exit
        stop.restore()
        bar.close()
        log.close()
    if env.is_main:
        first, last = log.first_and_last("mlm_loss")
        if first is not None:
            print(f"mlm loss {first:.4f} -> {last:.4f} over steps {log.first_step}-{step}", flush=True)
        print(f"checkpoint: {saved}  (a Hugging Face BERT directory: "
              f"transformers.BertForPreTraining.from_pretrained('{saved}'))", flush=True)
    return saved
