"""The transformers side of gpu_check.py's time-to-quality race, in its own process (``python THIS SPEC_JSON``):
BertForMaskedLM (sdpa) through torch.compile, bf16 autocast, fused AdamW, the same linear warm-up and decay, on
bertgpu's batches of the same config (same instances, same masking, same order), then evaluated by bertgpu's own
evaluation. Prints one JSON line: training seconds, process seconds, held-out masked-LM loss, sequences/s.
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

T0 = time.perf_counter()  # the process's start: the compilation and imports count
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bertgpu from the checkout, as the parent


def main() -> None:
    import torch
    import transformers

    from bertgpu.config import DataConfig, HeldOutConfig, OptimConfig, PretrainConfig, RunConfig
    from bertgpu.data.pretraining import IGNORE_INDEX, GlobalBatchSampler, PretrainingDataset
    from bertgpu.data.shards import ShardedCorpus
    from bertgpu.data.tokenizer import load_vocab
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.parallel.dims import ParallelDims
    from bertgpu.tasks.pretrain import heldout_split
    from bertgpu.training import evaluation
    from bertgpu.training.batch import peak_lr
    from bertgpu.training.optim import build_optimizer, build_schedule
    from bertgpu.training.precision import allow_tf32, autocast

    a = json.loads(sys.argv[1])
    device = torch.device(a["device"])
    allow_tf32(device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    cfg = PretrainConfig(
        model=a["model"],
        out="unused",
        data=DataConfig(data=a["data"], max_seq_length=a["seq"], nsp=False, pack=True),
        heldout=HeldOutConfig(eval_fraction=0.1, eval_instances=a["eval_instances"]),
        optim=OptimConfig(lr=float(a["lr"]), steps=a["steps"], warmup=0.1),
        run=RunConfig(seed=a["seed"], batch_size=a["batch"]),
    )
    corpus = ShardedCorpus(a["data"])
    train_text, eval_set, _ = heldout_split(cfg, corpus, None, 1)
    dataset = PretrainingDataset(train_text, cfg.data, a["seed"], load_vocab(corpus.vocab_path))
    mcfg = BertConfig.preset(a["model"], vocab_size=corpus.vocab_size, max_position_embeddings=max(512, a["seq"]))
    torch.manual_seed(a["seed"])
    model = transformers.BertForMaskedLM(transformers.BertConfig(**mcfg.to_hf_dict(), attn_implementation="sdpa")).to(
        device
    )
    optim = dataclasses.replace(cfg.optim, lr=peak_lr(cfg.optim, a["batch"]))  # as bertgpu's: the same peak
    opt = build_optimizer(model, optim, device)  # the same AdamW (fused), decay groups, betas and eps
    schedule = build_schedule(opt, optim)
    forward = torch.compile(model) if device.type == "cuda" else model
    step, epoch = 0, 0
    model.train()
    start = time.perf_counter()
    while step < a["steps"]:
        dataset.set_epoch(epoch)
        sampler = GlobalBatchSampler(len(dataset), [a["batch"]], 0, 1, a["seed"], epoch)
        for indices in sampler:
            b = {k: v.to(device) for k, v in torch.utils.data.default_collate([dataset[i] for i in indices]).items()}
            labels = torch.full_like(b["input_ids"], IGNORE_INDEX)
            valid = b["mlm_labels"] != IGNORE_INDEX
            rows = torch.arange(len(labels), device=device)[:, None].expand_as(valid)
            labels[rows[valid], b["mlm_positions"][valid]] = b["mlm_labels"][valid]
            with autocast(precision, device):
                loss = forward(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=labels).loss
            loss.backward()
            if optim.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            schedule.step()
            step += 1
            if step == a["steps"]:
                break
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    trained = time.perf_counter() - start
    ours = BertForPreTraining(mcfg)
    missing, unexpected = ours.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("pooler" in k or "seq_relationship" in k for k in missing), (missing, unexpected)
    ours.next_sentence = False
    metrics = evaluation.evaluate_mlm(ours.to(device), eval_set, ParallelDims(1), device, a["batch"], False, precision)
    print(
        json.dumps(
            {
                "train_s": trained,
                "process_s": start - T0 + trained,
                "eval_mlm_loss": metrics["eval_mlm_loss"],
                "seq_per_s": a["steps"] * a["batch"] / trained,
            }
        )
    )


if __name__ == "__main__":
    main()
