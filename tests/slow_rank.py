"""`python tests/slow_rank.py COMMAND ...`: the bertgpu CLI, with one process made slower.

For the --balance auto test, a stand-in for a slower GPU: when this process's RANK is SLOW_RANK (or SLOW_RANK
is "any": slow steps, for the elastic and --save-every-minutes tests), every
forward pass of the pretraining or classification model first sleeps SLOW_SECONDS per sequence. It lives here, in the
tests, and patches the model from outside: the product has no such switch that a user could hit.
"""

import os
import sys
import time

from bertgpu.cli import main
from bertgpu.model import BertForPreTraining, BertForSequenceClassification


def slowed(forward):
    def slow_forward(self, input_ids, *args, **kwargs):
        time.sleep(float(os.environ["SLOW_SECONDS"]) * input_ids.shape[0])
        return forward(self, input_ids, *args, **kwargs)

    return slow_forward


if os.environ.get("SLOW_RANK") in (os.environ.get("RANK"), "any"):
    for model in (BertForPreTraining, BertForSequenceClassification):
        model.forward = slowed(model.forward)

if __name__ == "__main__":
    sys.argv[0] = "bertgpu"
    main()
