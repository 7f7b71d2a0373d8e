"""bertgpu: BERT from raw text to a fine-tuned classifier, on one CPU, one GPU or many.

The Python API mirrors the commands::

    from bertgpu import train_vocab, prepare, pretrain, PretrainConfig, DataConfig, OptimConfig
    from bertgpu import finetune, FinetuneConfig, Classifier
    train_vocab(["corpus/"], size=30522, out="vocab.txt")
    prepare(["corpus/"], vocab="vocab.txt", out_dir="data")
    pretrain(PretrainConfig(model="tiny", out="run", data=DataConfig(data="data")))  # run=RunConfig(nproc=2)
    finetune(FinetuneConfig(model="run/checkpoints/step-0001000", train="train.csv", out="clf"))
    Classifier.load("clf/best")("a text")   # {"label": ..., "score": ...}
    finetune(FinetuneConfig(model="run/", train="train.conll", out="ner"))  # any task: NER, QA, regression, ...
    evaluate(EvaluateConfig(model="ner", data="test.conll"))              # its metrics; predict(PredictConfig(...))

Names are imported lazily, so ``import bertgpu`` stays cheap.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "BertConfig": "bertgpu.models.bert.config",
    "PretrainConfig": "bertgpu.config",
    "DataConfig": "bertgpu.config",
    "OptimConfig": "bertgpu.config",
    "RunConfig": "bertgpu.config",
    "FinetuneConfig": "bertgpu.config",
    "EvaluateConfig": "bertgpu.config",
    "PredictConfig": "bertgpu.config",
    "AdapterConfig": "bertgpu.config",
    "UserError": "bertgpu.errors",
    "Tokenizer": "bertgpu.data.tokenizer",
    "ShardedCorpus": "bertgpu.data.shards",
    "BertModel": "bertgpu.models.bert.model",
    "BertForPreTraining": "bertgpu.models.bert.model",
    "BertForSequenceClassification": "bertgpu.models.bert.model",
    "ModernBertConfig": "bertgpu.models.modernbert.config",
    "ModernBertModel": "bertgpu.models.modernbert.model",
    "ModernBertForMaskedLM": "bertgpu.models.modernbert.model",
    "ModernBertForSequenceClassification": "bertgpu.models.modernbert.model",
    "load_pretrained": "bertgpu.checkpoints.hf_dir",
    "save_pretrained": "bertgpu.checkpoints.hf_dir",
    "Classifier": "bertgpu.tasks.classifier",
}

# The names of earlier releases, kept: BERT's configuration was ModelConfig.
_ALIASES = {"ModelConfig": "BertConfig"}

__all__ = [*_EXPORTS, *_ALIASES, "train_vocab", "prepare", "pretrain", "finetune", "evaluate", "predict", "__version__"]


# The commands as functions. Each first stops a worker process that is re-running a script without
# `if __name__ == "__main__":` (workers are spawned, so they import the script again).


def train_vocab(*args, **kwargs):
    """Run `bertgpu vocab` from Python (see bertgpu.data.tokenizer.train_vocab)."""
    from bertgpu.data.tokenizer import train_vocab
    from bertgpu.parallel.launch import refuse_when_reimported

    refuse_when_reimported()
    return train_vocab(*args, **kwargs)


def prepare(*args, **kwargs):
    """Run `bertgpu prepare` from Python (see bertgpu.data.shard_writer.prepare; its keywords are
    PrepareOptions' fields: workers, lowercase, shard_tokens, overwrite, progress, strict, ...)."""
    from bertgpu.data.shard_writer import prepare
    from bertgpu.parallel.launch import refuse_when_reimported

    refuse_when_reimported()
    return prepare(*args, **kwargs)


def pretrain(cfg):
    """Run `bertgpu pretrain` from Python with a PretrainConfig (starts cfg.run.nproc workers if asked)."""
    from bertgpu.parallel.launch import refuse_when_reimported
    from bertgpu.tasks.pretrain import run

    refuse_when_reimported()
    return run(cfg)


def finetune(cfg):
    """Run `bertgpu finetune` from Python with a FinetuneConfig (starts cfg.run.nproc workers if asked)."""
    from bertgpu.parallel.launch import refuse_when_reimported
    from bertgpu.tasks.finetune import run_finetune

    refuse_when_reimported()
    return run_finetune(cfg)


def evaluate(cfg):
    """Run `bertgpu evaluate` from Python with an EvaluateConfig: any task's metrics, printed and written to
    cfg.output (default: eval_results.json beside the model)."""
    from bertgpu.parallel.launch import refuse_when_reimported
    from bertgpu.tasks import evaluate_mlm, predict

    refuse_when_reimported()
    return evaluate_mlm.run(cfg) if evaluate_mlm.is_prepared(cfg.data) else predict.run_evaluate(cfg)


def predict(cfg):
    """Run `bertgpu predict` from Python with a PredictConfig: labels, entities, answers or scores, printed or
    written to cfg.output."""
    from bertgpu.parallel.launch import refuse_when_reimported
    from bertgpu.tasks.predict import run_predict

    refuse_when_reimported()
    return run_predict(cfg)


def __getattr__(name):
    name = _ALIASES.get(name, name)
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bertgpu' has no attribute {name!r}")
