#!/bin/bash
# issue 69: the recipe's 800-step head, 60 on-policy steps on rollouts sampled at T = 1 (the text
# it drafts for at T = 1), rejected drafts weighing 4; then T = 1 side by side with today's head
# and the control stage (nothing else running)
set -e

export OMP_NUM_THREADS=2 WANDB_MODE=disabled
R=recipes/smollm2-135m-instruct_to_eagle3/ttt_cpu.yaml
H=runs/ttt800/best
common="max_steps=60 max_minutes=null draft.model=$H draft.draft_vocab_size=null resume=false \
train.lr=1e-4 train.warmup_steps=5 train.grad_accum=1 eval.every=20 train.checkpoint_every=30"
date
draftkit distill $R out_dir=runs/rej800/sampled $common data.regime=on_policy \
  data.lmbda=1.0 data.generate.on_policy_temperature=1.0
date
python eval/results/reports/2026-12-08-recipe-head/export_step60.py \
  runs/rej800/sampled runs/rej800/sampled-step60
S=eval/benchmarks/reproduce/drafts_side_by_side.py
python $S --temperature 1 --limit 16 --max-new-tokens 128 --domains code,math \
  --draft today=$H,dtype=float32 --draft control=runs/rej800/control/best,dtype=float32 \
  --draft sampled=runs/rej800/sampled-step60,dtype=float32 --out runs/rej800/side-t1-sampled
date
