"""The Trainer side of finetune_vs_trainer.py, in its own process (``python THIS SPEC_JSON``): transformers'
Trainer fine-tunes a BertForSequenceClassification with bertgpu's settings (epochs, learning rate, warmup, batch,
weight decay, seed, maximum length, batches grouped by length or not), evaluating and saving every epoch and
keeping the best by validation accuracy, then scores it on the test set. Writes OUT/test.json: test accuracy
and F1, best epoch, the training epochs' seconds (a callback from each epoch's start to its end, before its
evaluation) and examples/s.
"""

import csv
import dataclasses
import json
import sys
import time
from pathlib import Path

LABELS = ["negative", "positive"]


def main(spec: dict) -> None:
    import numpy as np
    import torch
    from transformers import (
        BertForSequenceClassification,
        BertTokenizerFast,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    tokenizer = BertTokenizerFast.from_pretrained(spec["model"])
    label2id = {label: i for i, label in enumerate(LABELS)}

    def load(path: str) -> list[dict]:
        with open(path, encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=spec["max_seq_length"])
        return [{**{k: v[i] for k, v in enc.items()}, "labels": label2id[r["label"]]} for i, r in enumerate(rows)]

    def metrics(prediction) -> dict:
        predicted = np.argmax(prediction.predictions, axis=-1)
        labels = prediction.label_ids
        tp = int(((predicted == 1) & (labels == 1)).sum())
        fp_fn = int((predicted != labels).sum())
        return {"accuracy": float((predicted == labels).mean()), "f1": 2 * tp / max(1, 2 * tp + fp_fn)}

    class TrainTime(TrainerCallback):
        """Seconds spent in training epochs: from an epoch's start to its end, before its evaluation."""

        seconds = 0.0

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):
            TrainTime.seconds += time.perf_counter() - self.start

    # transformers 5 names the option train_sampling_strategy; 4.x has group_by_length.
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    grouping = (
        {"train_sampling_strategy": "group_by_length" if spec["group_by_length"] else "random"}
        if "train_sampling_strategy" in fields
        else {"group_by_length": spec["group_by_length"]}
    )
    model = BertForSequenceClassification.from_pretrained(
        spec["model"], num_labels=2, id2label=dict(enumerate(LABELS)), label2id=label2id
    )
    args = TrainingArguments(
        output_dir=spec["out"],
        num_train_epochs=spec["epochs"],
        learning_rate=spec["lr"],
        per_device_train_batch_size=spec["batch_size"],
        per_device_eval_batch_size=spec["batch_size"],
        weight_decay=spec["weight_decay"],
        warmup_steps=spec["warmup"],
        seed=spec["seed"],
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        save_total_limit=3,
        report_to="none",
        use_cpu=True,
        logging_steps=100,
        disable_tqdm=True,
        **grouping,
    )
    train = load(spec["train"])
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=load(spec["val"]),
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=metrics,
        callbacks=[TrainTime()],
    )
    trainer.train()
    best_step = int(trainer.state.best_model_checkpoint.rsplit("-", 1)[-1])
    best_epoch = next(
        r["epoch"] for r in trainer.state.log_history if r.get("step") == best_step and "eval_accuracy" in r
    )
    test = load(spec["test"])
    result = trainer.evaluate(test, metric_key_prefix="test")
    Path(spec["out"], "test.json").write_text(
        json.dumps(
            {
                "accuracy": result["test_accuracy"],
                "f1": result["test_f1"],
                "examples": len(test),
                "best_epoch": round(best_epoch),
                "torch_threads": torch.get_num_threads(),
                "train_s": TrainTime.seconds,
                "examples_per_s": len(train) * spec["epochs"] / TrainTime.seconds,
            }
        )
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
