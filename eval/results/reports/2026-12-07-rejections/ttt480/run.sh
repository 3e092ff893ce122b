#!/bin/bash
# issue 69's side by side on a ttt_cpu.yaml head (480 steps): today's, block, bf16, both
set -e
cd /work/main
export OMP_NUM_THREADS=2 WANDB_MODE=disabled
S=eval/benchmarks/reproduce/drafts_side_by_side.py
H=runs/ttt480/best
date
.venv/bin/python $S --temperature 1 --limit 8 --max-new-tokens 128 --domains code,math \
  --draft today=$H,dtype=float32 --draft block=$H,dtype=float32,verify=block \
  --draft bf16=$H,dtype=bfloat16 --draft both=$H,dtype=bfloat16,verify=block \
  --out runs/ttt480-side-t1
date
.venv/bin/python $S --temperature 0 --limit 8 --max-new-tokens 128 --domains code,math \
  --draft today=$H,dtype=float32 --draft bf16=$H,dtype=bfloat16 \
  --out runs/ttt480-side-t0
date
