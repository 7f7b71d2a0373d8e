"""checkpoint.Checkpointer: the one place that decides when a training run saves (the runs that exercise it
end to end are in test_resume.py, test_finetune_resume.py, test_elastic.py and test_time_budget.py)."""

import time

import torch

from bertgpu import checkpoint
from bertgpu.config import ModelConfig, PretrainConfig, RunConfig
from bertgpu.model import BertForPreTraining


def test_a_checkpoint_is_due_every_n_steps_after_the_last_and_by_the_clock(tmp_path):
    saver = checkpoint.Checkpointer(tmp_path, RunConfig(save_every=3))
    assert [step for step in range(1, 10) if saver.due(step)] == [3, 6, 9]
    assert saver.due(4, last=True) and not saver.due(4)
    assert not saver.due(3, epoch_end=True)  # fine-tuning: the epoch's own checkpoint follows its evaluation
    assert not saver.clock()  # no --save-every-minutes
    saver.clock_due = True  # the loop heard rank 0's clock
    assert saver.due(4) and not saver.due(4, epoch_end=True)


def test_the_clock_says_when_save_every_minutes_is_up(tmp_path):
    saver = checkpoint.Checkpointer(tmp_path, RunConfig(save_every_minutes=0.001))  # 60 ms
    assert not saver.clock()
    time.sleep(0.1)
    assert saver.clock()


def test_only_a_due_save_gathers_the_state_and_writes(tmp_path, small_uncased_vocab):
    torch.manual_seed(0)
    config = ModelConfig.preset("tiny", vocab_size=len(small_uncased_vocab.read_text().splitlines()))
    model = BertForPreTraining(config)
    optimizer = torch.optim.AdamW(model.parameters())
    saver = checkpoint.Checkpointer(tmp_path, RunConfig(save_every=2, keep=1))
    saver.set_contents(
        model, optimizer, config, PretrainConfig(model="tiny", out=str(tmp_path)), vocab_path=small_uncased_vocab,
        do_lower_case=True,
    )  # fmt: skip
    asked = []

    def state():
        asked.append(True)
        return checkpoint.Snapshot({"position": {}}, card="# card\n")

    saver.clock_due = True
    assert saver.save(1, state, epoch_end=True) is None and not asked
    assert saver.save(1, state) == tmp_path / "checkpoints" / "step-0000001" and len(asked) == 1
    assert not saver.clock_due  # a save resets the clock
    assert saver.save(3, state) is None and len(asked) == 1
    forced = saver.save(3, state, force=True)
    assert forced == saver.latest == checkpoint.latest_checkpoint(tmp_path)
    assert checkpoint.checkpoint_dirs(tmp_path) == [forced]  # --keep 1
    assert checkpoint.load_training_state(forced)["step"] == 3
    assert (forced / checkpoint.CARD_NAME).read_text() == "# card\n"
    saver.close()
