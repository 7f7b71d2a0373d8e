"""`bertgpu evaluate --model CKPT --data PREPARED_DIR`: held-out masked-LM metrics of any BERT, no training.

The evaluation set is built as ``pretrain --eval-data`` builds it (``EvalSet``: the same seed, the same
instances, masked the same way), so checkpoints of different runs, and local Hugging Face BERTs with a
masked-LM head, are compared on the very same masked tokens. The instances are shared by the processes
(``--nproc``), each holding the whole model; the figures do not depend on how many there are.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from .. import architectures, atomic, evaluation
from ..config import DataConfig, EvaluateConfig, ModelConfig
from ..data.heldout import EvalSet
from ..data.pretraining import check_nsp_possible
from ..data.shards import ShardedCorpus
from ..data.tokenizer import vocab_sha256
from ..errors import UserError
from ..parallel import ParallelDims, launch
from ..paths import refuse_clobbering
from ..precision import resolve_precision
from .common import run_local_workers
from .model_dirs import load_masked_lm, model_directory

DEFAULT_LENGTH = 128  # --max-seq-length 0 on prepared data: BERT's pretraining length


def is_prepared(path: str) -> bool:
    """Whether --data is a directory written by `bertgpu prepare` (not a labelled file)."""
    return Path(path).is_dir() and (Path(path) / "meta.json").is_file()


def _plan(cfg: EvaluateConfig) -> tuple[Path, ModelConfig, ShardedCorpus, DataConfig]:
    """The model directory, its config, the data and the instances' settings; UserError on any mistake."""
    model_dir = model_directory(cfg.model)
    config = ModelConfig.load(model_dir)
    corpus = ShardedCorpus(cfg.data)
    if not (model_dir / "vocab.txt").is_file() or vocab_sha256(model_dir / "vocab.txt") != corpus.vocab_sha256:
        raise UserError(
            f"{cfg.data} was prepared with another vocab than the model's ({model_dir / 'vocab.txt'}): "
            f"prepare the text with --vocab {model_dir / 'vocab.txt'}"
        )
    length = cfg.max_seq_length or min(DEFAULT_LENGTH, config.max_position_embeddings)
    if length > config.max_position_embeddings:
        raise UserError(f"--max-seq-length {length} is beyond the model's {config.max_position_embeddings} positions")
    data = DataConfig(data=cfg.data, max_seq_length=length, nsp=cfg.nsp, loader_workers=0)
    if data.nsp:
        check_nsp_possible(corpus)
    resolve_precision(cfg.precision, torch.device(launch.resolve_device(cfg.device)))
    return model_dir, config, corpus, data


def run(cfg: EvaluateConfig) -> None:
    refuse_clobbering({"--output": cfg.output}, {"--model": cfg.model, "--data": cfg.data})
    cfg = dataclasses.replace(cfg, device=launch.resolve_device(cfg.device))
    model_dir, *_ = _plan(cfg)
    cfg = dataclasses.replace(cfg, model=str(model_dir))
    run_local_workers(evaluate, cfg, cfg.nproc, cfg.device)


def evaluate(cfg: EvaluateConfig) -> dict[str, float]:
    env = launch.init(cfg.device)
    dims = ParallelDims(env.world_size)  # every process a data-parallel rank holding the whole model
    dims.build_mesh(env.device.type)
    model_dir, config, corpus, data = _plan(cfg)
    model, missing = load_masked_lm(model_dir, config, "masked-LM evaluation")
    has_nsp = architectures.of(config).nsp and not any(n.startswith("cls.seq_relationship") for n in missing)
    eval_set = EvalSet(corpus, data, cfg.seed, cfg.eval_instances, str(cfg.data))
    eval_set.check_enough(dims.dp)
    metrics = evaluation.evaluate_mlm(
        model.to(env.device),
        eval_set,
        dims,
        env.device,
        cfg.batch_size,
        data.nsp and has_nsp,
        resolve_precision(cfg.precision, env.device),
    )
    result = {
        "model": str(model_dir),
        "data": cfg.data,
        "instances": len(eval_set),
        "seed": cfg.seed,
        "max_seq_length": data.max_seq_length,
        "nsp_instances": data.nsp,
        **metrics,
    }
    if env.is_main:
        if cfg.json:
            print(json.dumps(result), flush=True)
        else:
            print(
                f"{model_dir} on {cfg.data}: " + evaluation.describe(0, metrics, len(eval_set)).split(" | ", 1)[1],
                flush=True,
            )
        if cfg.output:
            atomic.write_json(Path(cfg.output), result)
            print(f"metrics: {cfg.output}", file=sys.stderr if cfg.json else sys.stdout, flush=True)
    return result
