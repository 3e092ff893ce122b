"""An on-policy run's last weights (its step-60 checkpoint) as a head folder, where its best/ is
the warm start because no held-out evaluation passed it (the rollouts run: 2.5110 against the
warm start's 2.5159).

    python export_step60.py [RUN] [OUT]   # default runs/rej800/rollouts runs/rej800/rollouts-step60
"""
import json
import shutil
import sys

import torch

from draftkit.models import load_pair
from draftkit.models.eagle3 import load_eagle3, save_eagle3

run = sys.argv[1] if len(sys.argv) > 1 else "runs/rej800/rollouts"
out = sys.argv[2] if len(sys.argv) > 2 else "runs/rej800/rollouts-step60"
pair = load_pair("embedded", None, device="cpu", dtype="float32")
head = load_eagle3(f"{run}/best", pair.target)
state = torch.load(f"{run}/checkpoints/step-0000060/state.pt", map_location="cpu",
                   weights_only=False)
# the checkpoint holds the trained weights; the target's embedding and the vocabulary maps
# (d2t, t2d) come from best/, the same head's
missing, unexpected = head.load_state_dict(state["model"], strict=False)
assert not unexpected and set(missing) <= {"d2t", "t2d", "embed_tokens.weight"}, missing
save_eagle3(head, out)
shutil.copy(f"{run}/best/target.json", out)
with open(f"{out}/best.json", "w") as f:
    json.dump({"step": state["step"], "tau": state["last_tau"]}, f)
print(f"{run} step {state['step']} (held-out tau {state['last_tau']:.4f}) -> {out}")
