"""The rollouts run's last weights (step 60) as a head folder: its best/ is the warm start,
whose held-out tau (2.5159) the 60 on-policy steps did not pass (2.5110)."""
import json, shutil, torch
from draftkit.models import load_pair
from draftkit.models.eagle3 import load_eagle3, save_eagle3
pair = load_pair("embedded", None, device="cpu", dtype="float32")
head = load_eagle3("runs/rej800/rollouts/best", pair.target)
state = torch.load("runs/rej800/rollouts/checkpoints/step-0000060/state.pt", map_location="cpu",
                   weights_only=False)
missing, unexpected = head.load_state_dict(state["model"], strict=False)
print("missing", missing, "unexpected", unexpected, "step", state["step"])
out = "runs/rej800/rollouts-step60"
save_eagle3(head, out)
for f in ("target.json", "draft_vocab.json"):
    try:
        shutil.copy(f"runs/rej800/rollouts/best/{f}", out)
    except FileNotFoundError:
        pass
json.dump({"step": 60, "tau": state["last_tau"]}, open(f"{out}/best.json", "w"))
