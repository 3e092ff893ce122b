"""On-policy steps of an EAGLE-3 head: the head drafts while the target decodes, and the loss
weighs the drafts the target rejected.

Training-time test (:mod:`draftkit.distill.ttt`) trains a head on the target's answers at every
position alike, but a head loses its tokens where its drafts are rejected, and that is where
online distillation finds its gains (Liu et al., "Online Speculative Decoding", arXiv
2310.07177, train on the proposals the target corrected; DistillSpec, arXiv 2310.08461, on the
sequences the draft meets when it drafts). So an on-policy step (``data.lmbda``, as for a
standalone draft) has draftkit's engine decode ``batch_size`` training prompts with the target
and the head being trained drafting K = ``draft.ttt_steps`` tokens a round at
``data.generate.on_policy_temperature``: the tokens are the target's (verification is
lossless), and each row's rounds ([K, accepted], :class:`~draftkit.decode.state.RowStats`) say
where a draft was rejected.

A round that starts with L tokens committed drafts tokens L..L + K - 1 from the target's feature
after token L - 2: in training-time-test terms it is anchored at t = L - 2, its step i drafting
token t + 2 + i after i accepted. A rejection after n accepted is the entry (t, i = n), marked
in ``rejected`` (B, T): the step index at each anchor whose draft was rejected, -1 elsewhere.
The target scores the rows afresh (the online teacher: features and its distribution), and the
loss is training-time test's with the rejected entries weighed ``draft.rejection_weight``
(every other entry 1), the divergence against the target's distribution at the rejected token's
position. The step trains the head from where it is (``draft.model``: a trained head), as a head
that has not learnt to draft would be rejected everywhere.
"""

from __future__ import annotations

from typing import Any

import torch

from draftkit.data import Rows
from draftkit.data.generate import prompt_seed
from draftkit.data.pack import Tokenized, pack
from draftkit.decode.engine import SpeculativeEngine
from draftkit.distill.features import OnlineFeatures
from draftkit.distill.onpolicy import pick_prompts

NOT_REJECTED = -1  # ``rejected`` where no draft anchored there was rejected


def rejections(prompt_len: int, rounds: list[list[int]], length: int) -> torch.Tensor:
    """(length,) long: at each anchor t of a decoded sequence (the prompt's ``prompt_len``
    tokens, then the answer; ``length`` tokens kept) the training-time-test step whose draft the
    target rejected, :data:`NOT_REJECTED` elsewhere (module docstring). ``rounds``: the row's
    [K, accepted] in order, after the prefill committed the answer's first token."""
    out = torch.full((length,), NOT_REJECTED, dtype=torch.long)
    committed = prompt_len + 1
    for k, accepted in rounds:
        anchor = committed - 2
        if accepted < k and committed + accepted < length:  # its token was kept
            out[anchor] = accepted
        committed += accepted + 1  # the accepted drafts and the target's own token
    return out


class RolloutTeacher:
    """The teacher of one batch of rollouts: the target scoring the rows now, as
    :class:`~draftkit.distill.features.OnlineFeatures`, and where their drafts were rejected."""

    def __init__(self, online: OnlineFeatures, rejected: torch.Tensor, weight: float):
        self.online, self.rejected, self.weight = online, rejected, weight  # rejected: (B, T)

    def __call__(self, rows_idx: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                 position_ids: torch.Tensor):
        return self.online(rows_idx, input_ids, mask, position_ids)

    def step_weights(self, idx: torch.Tensor, masks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per step i, the weight of each of its entries (N_i,): ``weight`` where step i's draft
        at that anchor was rejected, 1 elsewhere. masks: step i's entries, (B, T) each."""
        rejected = self.rejected[idx].to(masks[0].device)  # (B, T)
        return [torch.where(rejected[m] == i, self.weight, 1.0) for i, m in enumerate(masks)]


class Rollouts:
    """Draws on-policy rows for an EAGLE-3 head (module docstring): one engine over the target,
    kept across steps, the head swapped in afresh each time (its runner copies the weights it
    drafts with, which the optimizer has moved since)."""

    def __init__(self, target: Any, layers: list[int], loss_temperature: float, k: int,
                 weight: float):
        self.target, self.k, self.weight = target, k, weight
        self.online = OnlineFeatures(target, layers, loss_temperature)
        self.engine: SpeculativeEngine | None = None

    @torch.no_grad()
    def draw(self, head: Any, rows: Rows, n: int, seed: int, micro_step: int, rank: int,
             max_new_tokens: int, temperature: float, seq_len: int, pad_id: int
             ) -> tuple[Rows, RolloutTeacher]:
        """``n`` training prompts decoded by the target with ``head`` drafting: (the rows,
        prompt + answer with the answer trained, and their teacher). The prompts and the seed
        come from ``seed``, the micro-step and the rank alone, so a resumed run draws the
        same."""
        chosen, prompts, budget = pick_prompts(rows, n, seed, micro_step, rank, max_new_tokens,
                                               seq_len)
        was_training = head.training
        head.eval()
        if self.engine is None:
            self.engine = SpeculativeEngine(self.target, head)
        else:
            self.engine.swap_draft(head, max(len(p) for p in prompts) + budget)
        results = self.engine.generate(prompts, k=self.k, max_new_tokens=budget,
                                       temperature=temperature,
                                       seed=prompt_seed(seed, f"rollout:{micro_step}:{rank}"))
        head.train(was_training)
        examples = [Tokenized(p + r.tokens, [False] * len(p) + [True] * len(r.tokens),
                              rows.domains[rows.prompt_domains[i]], "rollout")
                    for p, r, i in zip(prompts, results, chosen)]
        out = pack(examples, seq_len, pad_id, rows.domains, pack=False, truncate=True)
        rejected = torch.full(out.input_ids.shape, NOT_REJECTED, dtype=torch.long)  # (B, T)
        for b, (p, r) in enumerate(zip(prompts, results)):
            length = min(len(p) + len(r.tokens), seq_len)
            rejected[b, :length] = rejections(len(p), r.stats.rounds, length)
        return out, RolloutTeacher(self.online, rejected, self.weight)
