"""`python tests/slow_rank.py COMMAND ...`: the bertgpu CLI, with one process made slower.

For the --balance auto test, a stand-in for a slower GPU: when this process's RANK is SLOW_RANK (or SLOW_RANK
is "any": slow steps, for the elastic and --save-every-minutes tests), every
forward pass of the pretraining or classification model first sleeps SLOW_SECONDS per sequence. It lives here, in the
tests, and patches the model from outside: the product has no such switch that a user could hit.

The environment is read at each forward pass, not at import, so that the test workers' fork server can import this
module once (conftest.workers_from_a_fork_server) and a run from the test process slows the rank its own
environment names (``run_cli(..., env={"SLOW_RANK": "1", ...})``); a run without SLOW_RANK is untouched.
"""

import sys

from fork_server import start_method
from slowing import slow_down

from bertgpu.cli import main
from bertgpu.parallel import launch

slow_down()

if __name__ == "__main__":
    # Its workers come from a fork server that imports this module (tests/fork_server.py), as `python -m bertgpu`'s
    # do, instead of spawned interpreters that each import torch (and again at every elastic restart).
    launch._start_method = start_method
    sys.argv[0] = "bertgpu"
    main()
