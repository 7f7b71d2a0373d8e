"""The Trainer side of benchmarks/ner.py, in its own process (``python THIS SPEC_JSON``): transformers' Trainer
fine-tunes a BertForTokenClassification (or ModernBertForTokenClassification) on CoNLL files with bertgpu's
settings (epochs, rate, warmup, batch, weight decay, seed, maximum length), the label of a word on its first piece
(-100 elsewhere, run_ner.py's convention), dropout 0.1 as bertgpu's, evaluating every epoch and keeping the best by validation entity F1,
then scores it on the test set. Entity F1 by bertgpu's conlleval scorer on both sides (the same code counts both).
Writes OUT/test.json: test f1, precision, recall, best epoch, training seconds and examples/s."""

import json
import sys
import time
from pathlib import Path


def read_conll(path: str) -> list[tuple[list[str], list[str]]]:
    sentences, words, tags = [], [], []
    for line in Path(path).read_text(encoding="utf-8").splitlines() + [""]:
        if line.strip():
            fields = line.split()
            words.append(fields[0])
            tags.append(fields[-1])
        elif words:
            sentences.append((words, tags))
            words, tags = [], []
    return sentences


def main(spec: dict) -> None:
    import numpy as np
    import torch
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from bertgpu.finetuning.token_classification import score

    train, val, test = (read_conll(spec[k]) for k in ("train", "val", "test"))
    names = sorted({t for _, tags in train for t in tags}, key=lambda t: (t != "O", t))
    label2id = {t: i for i, t in enumerate(names)}
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])

    def encode(sentences):
        enc = tokenizer(
            [w for w, _ in sentences], is_split_into_words=True, truncation=True, max_length=spec["max_seq_length"]
        )
        rows = []
        for i, (_, tags) in enumerate(sentences):
            labels, previous = [], None
            for word in enc.word_ids(i):
                labels.append(-100 if word is None or word == previous else label2id[tags[word]])
                previous = word
            rows.append(
                {"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": labels}
            )
        return rows

    def tags_of(prediction) -> tuple[list[list[str]], list[list[str]]]:
        predicted = np.argmax(prediction.predictions, axis=-1)
        gold, guess = [], []
        for p, g in zip(predicted, prediction.label_ids):
            keep = g != -100
            gold.append([names[k] for k in g[keep]])
            guess.append([names[k] for k in p[keep]])
        return gold, guess

    def metrics(prediction) -> dict:
        s = score(*tags_of(prediction))
        return {"f1": s["f1"], "precision": s["precision"], "recall": s["recall"]}

    class TrainTime(TrainerCallback):
        seconds = 0.0

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):
            TrainTime.seconds += time.perf_counter() - self.start

    # dropout 0.1, as bertgpu fine-tunes (a --recipe fast checkpoint's config.json says 0)
    dropout = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
    model = AutoModelForTokenClassification.from_pretrained(
        spec["model"], num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id, **dropout
    )
    args = TrainingArguments(
        output_dir=spec["out"],
        num_train_epochs=spec["epochs"],
        learning_rate=spec["lr"],
        per_device_train_batch_size=spec["batch_size"],
        per_device_eval_batch_size=32,
        weight_decay=spec["weight_decay"],
        warmup_steps=spec["warmup"],
        seed=spec["seed"],
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        metric_for_best_model="f1",
        save_total_limit=2,
        report_to="none",
        use_cpu=True,
        logging_steps=100,
        disable_tqdm=True,
    )
    rows = encode(train)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=rows,
        eval_dataset=encode(val),
        data_collator=DataCollatorForTokenClassification(tokenizer),
        compute_metrics=metrics,
        callbacks=[TrainTime()],
    )
    trainer.train()
    result = trainer.evaluate(encode(test), metric_key_prefix="test")
    best_step = int(trainer.state.best_model_checkpoint.rsplit("-", 1)[-1])
    best_epoch = next(r["epoch"] for r in trainer.state.log_history if r.get("step") == best_step and "eval_f1" in r)
    Path(spec["out"], "test.json").write_text(
        json.dumps(
            {
                **{k: result[f"test_{k}"] for k in ("f1", "precision", "recall")},
                "best_epoch": round(best_epoch),
                "torch_threads": torch.get_num_threads(),
                "train_s": TrainTime.seconds,
                "examples_per_s": len(rows) * spec["epochs"] / TrainTime.seconds,
            }
        )
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
