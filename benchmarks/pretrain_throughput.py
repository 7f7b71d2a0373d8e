"""Pretraining step throughput: bertgpu vs transformers' BertForPreTraining, in the same run.

The benchmark lives in the package (``bertgpu bench``, see bertgpu/bench.py); this script is the
same thing for people who look under benchmarks/:

    python benchmarks/pretrain_throughput.py --model mini --batch-size 32 --precision fp32
    python benchmarks/pretrain_throughput.py --model base --precision bf16     # on a GPU

The last line is ``speedup: X.XX`` (bertgpu sequences/s over transformers').
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertgpu.cli import main  # noqa: E402

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]])
