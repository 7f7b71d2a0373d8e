"""checkpoint.Checkpointer: the one place that decides when a training run saves (the runs that exercise it
end to end are in test_resume.py, test_finetune_resume.py, test_elastic.py and test_time_budget.py)."""

import time

import torch

from bertgpu.checkpoints import checkpoint
from bertgpu.config import PretrainConfig, RunConfig
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining


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
    config = BertConfig.preset("tiny", vocab_size=len(small_uncased_vocab.read_text().splitlines()))
    model = BertForPreTraining(config)
    optimizer = torch.optim.AdamW(model.parameters())
    saver = checkpoint.Checkpointer(tmp_path, RunConfig(save_every=2, keep=1))
    files = checkpoint.ModelFiles(config, small_uncased_vocab, do_lower_case=True)
    saver.set_contents(model, optimizer, files, PretrainConfig(model="tiny", out=str(tmp_path)))
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


def test_saving_leaves_the_optimizers_own_state_as_it_was(tmp_path):
    """A checkpoint reads the optimizer's moments (``optimizer_tensors``) and must not replace them. It once made a
    tensor-parallel ModernBERT's strided moments (the fused Wqkv/Wi) whole in the optimizer's own state dict, which
    get_optimizer_state_dict shares: training went on with replicated moments and drifted 5.4e-5 from the run that
    did not save at that step. A one-process group is enough to hold a strided DTensor."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = torch.nn.Linear(4, 6, bias=False)
        model.optimizer_aliases = {}  # what an EncoderModel declares: no tied copies
        model.weight = torch.nn.Parameter(
            distribute_tensor(model.weight.detach(), mesh, [_StridedShard(0, split_factor=3)])
        )
        optimizer = torch.optim.AdamW(model.parameters())
        model.weight.grad = torch.ones_like(model.weight)
        optimizer.step()
        before = {key: value for key, value in optimizer.state[model.weight].items()}
        saved = checkpoint.optimizer_tensors(model, optimizer)["state"]["weight"]
        after = optimizer.state[model.weight]
        assert all(after[key] is before[key] for key in before), "the optimizer's own state was replaced"
        assert isinstance(after["exp_avg"].placements[0], _StridedShard)
        assert not isinstance(saved["exp_avg"].placements[0], _StridedShard)  # what is written is whole
    finally:
        dist.destroy_process_group()
