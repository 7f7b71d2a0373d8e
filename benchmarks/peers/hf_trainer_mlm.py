"""The transformers side of time_to_quality.py, in its own process (its own clock, its own threads):
``python THIS SPEC_JSON``. transformers as its users pretrain: its masked-LM class of the spec's config.json
(BertForMaskedLM or ModernBertForMaskedLM, ``AutoModelForMaskedLM.from_config``), DataCollatorForLanguageModeling
(15%, 80/10/10) on the packed blocks the parent saved, Trainer's defaults (AdamW, linear decay) with the
parent's learning rate, warmup share, batch and precision. It saves the model every ``every`` seconds of its
run (the clock paused while saving) as ``OUT/tSSSSSS.S-stepN`` and stops at the budget; with ``clock`` the
learning rate follows the clock instead of the step (warmup, then linear decay to 0 at the budget). With
``calibrate`` it only times ``steps`` steps. Prints one JSON line: seconds per step.
"""

import json
import sys
import time

START = time.perf_counter()


def main() -> None:
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForMaskedLM,
        BertTokenizerFast,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    args = json.loads(sys.argv[1])
    torch.manual_seed(args["seed"])
    blocks = torch.load(args["blocks"])
    tokenizer = BertTokenizerFast.from_pretrained(args["tokenizer_dir"])
    # The config.json bertgpu writes for the same preset: the same shape (and ModernBERT's token ids) on both sides.
    config = dict(args["config"])
    config = AutoConfig.for_model(config.pop("model_type"), **config)
    model = AutoModelForMaskedLM.from_config(config)

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return len(blocks)

        def __getitem__(self, i):
            return {"input_ids": blocks[i]}

    class Saver(TrainerCallback):
        """Save every `every` seconds of the run (the clock paused while saving); stop at the budget."""

        def __init__(self):
            self.next = args["every"]
            self.paused = 0.0

        def elapsed(self):
            return time.perf_counter() - START - self.paused

        def save(self, model, step):
            t0 = time.perf_counter()
            model.save_pretrained(f"{args['out']}/t{self.elapsed():08.1f}-step{step}")
            self.paused += time.perf_counter() - t0

        def on_step_begin(self, a, state, control, optimizer=None, **kw):
            # --own-schedule: the learning rate follows the clock (warmup, then linear decay to 0 at the budget),
            # as bertgpu's --time-budget does, in place of a schedule sized by a calibration run
            if args["clock"] and optimizer is not None:
                p, w = min(1.0, self.elapsed() / args["budget"]), args["warmup"]
                factor = max(p / w, 1e-3) if p < w else max(0.0, (1 - p) / (1 - w))
                for group in optimizer.param_groups:
                    group["lr"] = args["lr"] * factor

        def on_step_end(self, a, state, control, model=None, **kw):
            if args["calibrate"]:
                return
            if self.elapsed() >= self.next:
                self.save(model, state.global_step)
                self.next += args["every"]
            if self.elapsed() >= args["budget"]:
                control.should_training_stop = True

        def on_train_end(self, a, state, control, model=None, **kw):
            if not args["calibrate"]:
                self.save(model, state.global_step)

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    targs = TrainingArguments(
        output_dir=args["out"] + "/trainer", per_device_train_batch_size=args["batch"], bf16=args["bf16"],
        learning_rate=args["lr"], warmup_steps=0 if args["clock"] else int(args["warmup"] * args["steps"]),
        max_steps=args["steps"], weight_decay=0.01, lr_scheduler_type="constant" if args["clock"] else "linear",
        save_strategy="no", report_to=[], logging_steps=10**9, use_cpu=True, seed=args["seed"],
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=model, args=targs, train_dataset=Blocks(), data_collator=collator, callbacks=[Saver()])
    t0 = time.perf_counter()
    trainer.train()
    print(json.dumps({"seconds_per_step": (time.perf_counter() - t0) / args["steps"]}))


if __name__ == "__main__":
    main()
