#!/usr/bin/env bash
# The whole GPU check in one command (BENCHMARKS.md, GPU): tests/test_cuda.py, the bench table, a real
# pretraining run and a time-to-quality race against transformers + torch.compile, as one Markdown table
# on stdout and in $OUT/gpu-check.md when $OUT is set. Every row within 8 minutes on one H100/H200 (a 470 s
# budget): issue 38's acceptance rows first (the CUDA tests beside the warm-ups, bench base 64/256 and large
# 32/128 at seq 128, the pretrain loop at bench's base 256 shape), then the race, ModernBERT and base 512.
# Give the device tool a timeout of 540 s or more.
#
#   benchmarks/gpu.sh                       # on the GPU machine, from the checkout
#   benchmarks/gpu.sh --device cpu --smoke  # the script's own logic at a tiny size (tests/test_gpu_script.py)
#
# It installs nothing from the network: wheels brought in .whl/ (../shared/GPU.md: e.g. torchao for --fp8)
# go to /tmp/site with pip --no-index; bertgpu runs from the checkout (PYTHONPATH, python -m bertgpu).
# $PYTHON picks the interpreter (default python3). Other arguments: benchmarks/gpu_check.py --help.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PYTHON" benchmarks/gpu_check.py "$@"
