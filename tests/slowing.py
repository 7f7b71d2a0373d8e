"""Forward passes that sleep first, read from the environment at each pass (SLOW_RANK, SLOW_SECONDS): see
tests/slow_rank.py, which applies them to every process it runs in. A test of its own process patches them for
itself (``monkeypatch.setattr(Model, "forward", slowed(Model.forward))``), so that its xdist worker's other tests
keep the plain forward pass (one torch.compile graph)."""

import functools
import os
import time

from bertgpu.models.bert.model import BertForPreTraining, BertForSequenceClassification


def slowed(forward):
    @functools.wraps(forward)  # the same signature for whatever inspects it (peft)
    def slow_forward(self, input_ids, *args, **kwargs):
        slow = os.environ.get("SLOW_RANK")
        if slow is not None and slow in (os.environ.get("RANK"), "any"):  # RANK is unset in a one-process run
            time.sleep(float(os.environ["SLOW_SECONDS"]) * input_ids.shape[0])
        return forward(self, input_ids, *args, **kwargs)

    slow_forward.slowed = True
    return slow_forward


def slow_down() -> None:
    """Patch the pretraining and classification models of this process, once."""
    for model in (BertForPreTraining, BertForSequenceClassification):
        if not getattr(model.forward, "slowed", False):  # once, even if imported under two names
            model.forward = slowed(model.forward)
