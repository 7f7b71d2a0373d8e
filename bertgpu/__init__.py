"""bertgpu: BERT from raw text to a fine-tuned classifier, on one CPU, one GPU or many.

The Python API mirrors the commands::

    from bertgpu import train_vocab, prepare, pretrain, PretrainConfig, DataConfig, OptimConfig
    from bertgpu import finetune, FinetuneConfig, Classifier
    train_vocab(["corpus/"], size=30522, out="vocab.txt")
    prepare(["corpus/"], vocab="vocab.txt", out_dir="data")
    pretrain(PretrainConfig(model="tiny", out="run", data=DataConfig(data="data")))  # run=RunConfig(nproc=2)
    finetune(FinetuneConfig(model="run/checkpoints/step-0001000", train="train.csv", out="clf"))
    Classifier.load("clf/best")("a text")   # {"label": ..., "score": ...}

Names are imported lazily, so ``import bertgpu`` stays cheap.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "ModelConfig": "bertgpu.config",
    "PretrainConfig": "bertgpu.config",
    "DataConfig": "bertgpu.config",
    "OptimConfig": "bertgpu.config",
    "RunConfig": "bertgpu.config",
    "FinetuneConfig": "bertgpu.config",
    "AdapterConfig": "bertgpu.config",
    "UserError": "bertgpu.errors",
    "Tokenizer": "bertgpu.data.tokenizer",
    "ShardedCorpus": "bertgpu.data.shards",
    "BertModel": "bertgpu.model",
    "BertForPreTraining": "bertgpu.model",
    "BertForSequenceClassification": "bertgpu.model",
    "ModernBertConfig": "bertgpu.config",
    "ModernBertModel": "bertgpu.modernbert",
    "ModernBertForMaskedLM": "bertgpu.modernbert",
    "ModernBertForSequenceClassification": "bertgpu.modernbert",
    "load_pretrained": "bertgpu.hf_dir",
    "save_pretrained": "bertgpu.hf_dir",
    "Classifier": "bertgpu.classifier",
}

__all__ = [*_EXPORTS, "train_vocab", "prepare", "pretrain", "finetune", "__version__"]


# The commands as functions. Each first stops a worker process that is re-running a script without
# `if __name__ == "__main__":` (workers are spawned, so they import the script again).


def train_vocab(*args, **kwargs):
    """Run `bertgpu vocab` from Python (see bertgpu.data.tokenizer.train_vocab)."""
    from .data.tokenizer import train_vocab
    from .parallel.launch import refuse_when_reimported

    refuse_when_reimported()
    return train_vocab(*args, **kwargs)


def prepare(*args, **kwargs):
    """Run `bertgpu prepare` from Python (see bertgpu.data.shards.prepare)."""
    from .data.shard_writer import prepare
    from .parallel.launch import refuse_when_reimported

    refuse_when_reimported()
    return prepare(*args, **kwargs)


def pretrain(cfg):
    """Run `bertgpu pretrain` from Python with a PretrainConfig (starts cfg.run.nproc workers if asked)."""
    from .parallel.launch import refuse_when_reimported
    from .tasks.pretrain import run

    refuse_when_reimported()
    return run(cfg)


def finetune(cfg):
    """Run `bertgpu finetune` from Python with a FinetuneConfig (starts cfg.run.nproc workers if asked)."""
    from .parallel.launch import refuse_when_reimported
    from .tasks.finetune import run_finetune

    refuse_when_reimported()
    return run_finetune(cfg)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bertgpu' has no attribute {name!r}")
