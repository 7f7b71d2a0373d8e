#!/bin/bash
# 3D parallel pretraining (pipeline x data x tensor) on 2 machines x 8 GPUs with plain torchrun: run this
# script on both machines, with HEAD set to the first one's address (a port free there). The layout and
# why: see examples/slurm/pretrain-3d.sbatch (one pipeline stage per machine, tensor parallel inside it,
# FSDP over the remaining 2 data-parallel ranks). The run directory must be on a file system both
# machines mount.
#     HEAD=node1 DATA=/shared/data OUT=/shared/run bash examples/torchrun/pretrain-3d.sh
set -euo pipefail

: "${HEAD:?set HEAD to the host name of the first machine}"
: "${DATA:?set DATA to the prepared data directory}"
: "${OUT:?set OUT to the shared run directory}"

export HF_HUB_OFFLINE=1
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

torchrun --nnodes 2 --nproc_per_node 8 \
    --rdzv_backend c10d --rdzv_endpoint "$HEAD:${PORT:-29500}" --rdzv_id "${RUN_ID:-bertgpu-3d}" \
    -m bertgpu pretrain --data "$DATA" --model "${MODEL:-large}" --out "$OUT" --resume \
    --pp 2 --pp-microbatches 8 --tp 4 --strategy fsdp \
    --batch-size 64 --steps 100000 --precision bf16 --save-every 1000 "$@"
