"""Advantage estimators of the joint trainers; each feeds the same loss (`ragteam.train.pg`).

- `gae` / `episode_gae` (M-ASK, JADE): an episode's calls are flattened into one token sequence, in call order;
  each call's reward sits on its last response token; GAE runs backwards over that sequence, bootstrapping across
  call boundaries (`scope="episode"`, M-ASK Eq. 5 / JADE Alg. 2) or within each call only (`scope="call"`: the
  official M-ASK / JADE code, where each call is its own verl sample).
- `group_normalized` (GRPO, QAgent): (r - mean of the group) / (std of the group + eps), one scalar per sample.
- `group_normalized_by_role` (DECOR Eq. 6): the same within each (group, role).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

import torch

Scope = Literal["episode", "call"]


def gae(rewards: torch.Tensor, values: torch.Tensor, terminal: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a 1-D sequence of steps (here: tokens).

        δ_t = r_t + γ·V_{t+1}·(1 - terminal_t) - V_t
        A_t = δ_t + γλ·(1 - terminal_t)·A_{t+1}          R_t = A_t + V_t

    `terminal[t]` cuts bootstrapping after step t (the value after a terminal step is 0); the last step is always
    terminal. Returns (advantages, returns), same shape as `rewards`.
    """
    n = rewards.shape[0]
    if values.shape[0] != n or terminal.shape[0] != n:
        raise ValueError(f"gae: rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and terminal "
                         f"{tuple(terminal.shape)} must have the same length")
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    last, next_value = 0.0, 0.0
    for t in range(n - 1, -1, -1):
        cont = 0.0 if (t == n - 1 or bool(terminal[t])) else 1.0
        nv = next_value * cont
        delta = float(rewards[t]) + gamma * nv - float(values[t])
        last = delta + gamma * lam * cont * last
        adv[t] = last
        next_value = float(values[t])
    return adv, adv + values.float()


def episode_gae(call_rewards: Sequence[float], call_values: Sequence[torch.Tensor], gamma: float, lam: float,
                scope: Scope = "episode") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-token (advantages, returns) for each call of one episode.

    `call_values[i]` holds the critic's value at each response token of call i (length = its response tokens);
    call i's reward goes on its last token. Calls with no response token are not allowed (a response always ends
    with at least its EOS or one generated token).
    """
    if len(call_rewards) != len(call_values):
        raise ValueError(f"episode_gae: {len(call_rewards)} rewards for {len(call_values)} calls")
    lengths = [int(v.shape[0]) for v in call_values]
    if any(n == 0 for n in lengths):
        raise ValueError(f"episode_gae: a call has no response tokens (lengths {lengths})")
    rewards, terminal = [], []
    for r, n in zip(call_rewards, lengths):
        rr = torch.zeros(n)
        rr[-1] = float(r)
        tt = torch.zeros(n, dtype=torch.bool)
        tt[-1] = scope == "call"
        rewards.append(rr)
        terminal.append(tt)
    adv, ret = gae(torch.cat(rewards), torch.cat([v.float() for v in call_values]), torch.cat(terminal), gamma, lam)
    out, pos = [], 0
    for n in lengths:
        out.append((adv[pos:pos + n], ret[pos:pos + n]))
        pos += n
    return out


def group_normalized(rewards: Sequence[float], groups: Sequence[Hashable], eps: float = 1e-6,
                     scale: bool = True) -> list[float]:
    """(r - mean_g) / (std_g + eps) within each group g (the population std over the group; `scale=False` only
    centres, Dr. GRPO style). A group of one sample gets advantage 0."""
    if len(rewards) != len(groups):
        raise ValueError(f"group_normalized: {len(rewards)} rewards for {len(groups)} group ids")
    by: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        by[g].append(i)
    out = [0.0] * len(rewards)
    for idx in by.values():
        xs = torch.tensor([float(rewards[i]) for i in idx])
        centred = xs - xs.mean()
        if scale:
            centred = centred / (xs.std(unbiased=False) + eps)
        for i, a in zip(idx, centred.tolist()):
            out[i] = a
    return out


def group_normalized_by_role(rewards: Sequence[float], groups: Sequence[Hashable], roles: Sequence[str],
                             eps: float = 1e-6) -> list[float]:
    """DECOR Eq. 6: group-normalised within each (group, role) pair."""
    if len(roles) != len(groups):
        raise ValueError(f"group_normalized_by_role: {len(roles)} roles for {len(groups)} group ids")
    return group_normalized(rewards, [(g, r) for g, r in zip(groups, roles)], eps)
