#!/bin/bash
# issue 69: the recipe's 800-step head at T = 1 with K fixed at 3 (the eval beside vLLM read
# 1.47-1.53x there with block verification), the four variants side by side
set -e

export OMP_NUM_THREADS=2 WANDB_MODE=disabled
H=runs/ttt800/best
S=eval/benchmarks/reproduce/drafts_side_by_side.py
date
python $S --temperature 1 --limit 16 --max-new-tokens 128 --domains code,math --k 3 \
  --draft today=$H,dtype=float32 --draft block=$H,dtype=float32,verify=block \
  --draft bf16=$H,dtype=bfloat16 --draft both=$H,dtype=bfloat16,verify=block \
  --out runs/rej800/side-t1-k3
date
