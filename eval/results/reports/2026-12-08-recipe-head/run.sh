#!/bin/bash
# issue 69 on the ttt_cpu.yaml head at its full 800 steps, from the repository root, nothing else
# running: the recipe, a 60-step rejection stage and its control warm-started from its head, the
# stage's last weights as a head folder, then the side by side at T = 1 and T = 0
set -e
export OMP_NUM_THREADS=2 WANDB_MODE=disabled
R=recipes/smollm2-135m-instruct_to_eagle3/ttt_cpu.yaml
H=runs/ttt800/best
draftkit distill $R max_minutes=null out_dir=runs/ttt800  # caches from an earlier --prepare
common="max_steps=60 max_minutes=null draft.model=$H draft.draft_vocab_size=null resume=false \
train.lr=1e-4 train.warmup_steps=5 train.grad_accum=1 eval.every=20 train.checkpoint_every=30"
draftkit distill $R out_dir=runs/rej800/control $common
draftkit distill $R out_dir=runs/rej800/rollouts $common data.regime=on_policy data.lmbda=1.0
# the rollouts run's best/ is its warm start (no evaluation passed it): decode its step 60
python eval/results/reports/2026-12-08-recipe-head/export_step60.py
S=eval/benchmarks/reproduce/drafts_side_by_side.py
C=runs/rej800/control/best
J=runs/rej800/rollouts-step60
python $S --temperature 1 --limit 16 --max-new-tokens 128 --domains code,math \
  --draft today=$H,dtype=float32 --draft block=$H,dtype=float32,verify=block \
  --draft bf16=$H,dtype=bfloat16 --draft control=$C,dtype=float32 \
  --draft rejections=$J,dtype=float32 --draft all=$J,dtype=bfloat16,verify=block \
  --out runs/rej800/side-t1
python $S --temperature 0 --limit 16 --max-new-tokens 128 --domains code,math \
  --draft today=$H,dtype=float32 --draft bf16=$H,dtype=bfloat16 \
  --draft control=$C,dtype=float32 --draft rejections=$J,dtype=float32 \
  --draft all=$J,dtype=bfloat16 --out runs/rej800/side-t0
