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

from bertgpu import atomic
from bertgpu.checkpoints import checkpoint
from bertgpu.config import DataConfig, EvaluateConfig
from bertgpu.data.heldout import EvalSet
from bertgpu.data.pretraining import check_nsp_possible
from bertgpu.data.shards import ShardedCorpus
from bertgpu.data.tokenizer import vocab_sha256
from bertgpu.errors import UserError
from bertgpu.models import architectures
from bertgpu.models.config import EncoderConfig
from bertgpu.parallel import ParallelDims, launch
from bertgpu.paths import refuse_clobbering, refuse_existing
from bertgpu.tasks.checks import check_evaluate_flags
from bertgpu.tasks.model_dirs import load_masked_lm, model_directory
from bertgpu.tasks.prelaunch import run_local_workers
from bertgpu.training import evaluation
from bertgpu.training.precision import resolve_precision

DEFAULT_LENGTH = 128  # --max-seq-length 0 on prepared data: BERT's pretraining length


def is_prepared(path: str) -> bool:
    """Whether --data is a directory written by `bertgpu prepare` (not a labelled file)."""
    return Path(path).is_dir() and (Path(path) / "meta.json").is_file()


def _plan(cfg: EvaluateConfig) -> tuple[Path, EncoderConfig, ShardedCorpus, DataConfig]:
    """The model directory, its config, the data and the instances' settings; UserError on any mistake."""
    model_dir = model_directory(cfg.model)
    config = architectures.load_config(model_dir)
    corpus = ShardedCorpus(cfg.data)
    if not (model_dir / "vocab.txt").is_file() or vocab_sha256(model_dir / "vocab.txt") != corpus.vocab_sha256:
        raise UserError(
            f"{cfg.data} was prepared with another vocab than the model's ({model_dir / 'vocab.txt'}): "
            f"prepare the text with --vocab {model_dir / 'vocab.txt'}"
        )
    length = cfg.max_seq_length or min(DEFAULT_LENGTH, config.max_position_embeddings)
    if length > config.max_position_embeddings:
        raise UserError(f"--max-seq-length {length} is beyond the model's {config.max_position_embeddings} positions")
    # A run that trained no NSP head (--no-nsp) saved an untrained one: its figures would mean nothing, and
    # its instances were single segments, so evaluate on those.
    nsp = cfg.nsp and _run_trained_nsp(model_dir)
    data = DataConfig(data=cfg.data, max_seq_length=length, nsp=nsp, loader_workers=0)
    if data.nsp:
        check_nsp_possible(corpus)
    resolve_precision(cfg.precision, torch.device(launch.resolve_device(cfg.device)))
    return model_dir, config, corpus, data


def _run_trained_nsp(model_dir: Path) -> bool:
    """False when the bertgpu run that wrote ``model_dir`` pretrained without next-sentence prediction."""
    record = checkpoint.read_run_record(model_dir)
    data = record["config"].get("data") if record else None
    if not isinstance(data, dict) or "nsp" not in data:
        return True  # no bertgpu pretraining run (a Hugging Face directory): its head, if any, is taken as trained
    return bool(data["nsp"])


def data_relation(model_dir: Path, corpus: ShardedCorpus, data: str) -> tuple[str, str]:
    """What --data is to the run that wrote the checkpoint ``model_dir``: ("training", why) when it is the
    data the run trained on (the same shards: evaluating there measures a training loss, even where the run
    held out some of its documents, since these instances are drawn from all of them), ("held-out", why)
    when it is the run's --eval-data, ("other", why) when it is neither, ("unknown", "") when the model
    is no bertgpu pretraining checkpoint. The run's data is told by the identity its checkpoint recorded
    (``ShardedCorpus.identity``), or, in a checkpoint from before that, by the path its config names."""
    record = checkpoint.read_run_record(model_dir)
    if record is None or not (model_dir / checkpoint.STATE_NAME).is_file():
        return "unknown", ""
    try:
        saved = record["config"]
        run_data, run_eval_data = saved["data"]["data"], saved["heldout"]["eval_data"]
        fraction = saved["heldout"]["eval_fraction"]
        state = checkpoint.load_training_state(model_dir)
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return "unknown", ""

    def same(path: str, identity: str | None) -> bool:
        if identity is not None:
            return identity == corpus.identity
        try:  # a checkpoint that recorded no identity: the same directory, if its path still leads there
            return bool(path) and Path(path).resolve() == Path(data).resolve()
        except OSError:
            return False

    if same(run_data, state.get("data_identity")):
        held = state.get("heldout_documents")
        if held is not None:  # the held-out documents are among the instances' sources: still mostly training
            aside = (
                f" (it held out {len(held):,} documents, --eval-fraction {fraction:g}; these instances come from all)"
            )
        else:
            aside = ""
        return "training", f"the run's training data{aside}: this is a training loss, not a held-out one"
    if run_eval_data and same(run_eval_data, state.get("eval_data_identity")):
        return "held-out", "the run's held-out data (its --eval-data, never trained on)"
    return "other", f"other prepared data than the run's --data ({run_data})"


def run(cfg: EvaluateConfig) -> None:
    cfg = check_evaluate_flags(cfg)
    refuse_clobbering({"--output": cfg.output}, {"--model": cfg.model, "--data": cfg.data})
    refuse_existing("--output", cfg.output, cfg.overwrite)
    cfg = dataclasses.replace(cfg, device=launch.resolve_device(cfg.device))
    model_dir, _, corpus, _ = _plan(cfg)
    cfg = dataclasses.replace(cfg, model=str(model_dir))
    kind, why = data_relation(model_dir, corpus, cfg.data)
    if kind == "training":  # before the work: the figures will not mean what evaluate's usually do
        print(f"bertgpu: warning: {cfg.data} is {why}", file=sys.stderr, flush=True)
    run_local_workers(evaluate, cfg, cfg.nproc, cfg.device)


def evaluate(cfg: EvaluateConfig) -> dict[str, float]:
    env = launch.init(cfg.device)
    dims = ParallelDims(env.world_size)  # every process a data-parallel rank holding the whole model
    dims.build_mesh(env.device.type)
    model_dir, config, corpus, data = _plan(cfg)
    model, missing = load_masked_lm(model_dir, config, "masked-LM evaluation")
    has_nsp = architectures.of(config).nsp and not architectures.nsp_head_missing(model, missing)
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
    kind, why = data_relation(model_dir, corpus, cfg.data)
    result = {
        "model": str(model_dir),
        "data": cfg.data,
        "data_is": kind,  # to the run that wrote the checkpoint: training, held-out, other or unknown
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
            # evaluation.describe's line, whose "held-out instances" are pretraining's; here they are what --data is.
            line = evaluation.describe(0, metrics, len(eval_set)).split(" | ", 1)[1].rsplit(" | ", 1)[0]
            print(
                f"{model_dir} on {cfg.data}: {line} | {len(eval_set):,} instances" + (f" of {why}" if why else ""),
                flush=True,
            )
        if cfg.output:
            atomic.write_json(Path(cfg.output), result)
            print(f"metrics: {cfg.output}", file=sys.stderr if cfg.json else sys.stdout, flush=True)
    return result
