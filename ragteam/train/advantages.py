"""Advantage estimators of the joint trainers; each feeds the same loss (`ragteam.train.pg`).

- `gae` / `episode_gae` (M-ASK, JADE): an episode's calls are flattened into one token sequence, in call order;
  each call's reward sits on its last response token; GAE runs backwards over that sequence, bootstrapping across
  call boundaries (`scope="episode"`: JADE Alg. 2, whose reward sits on the terminal call alone) or within each call
  only (`scope="call"`: M-ASK, whose Eq. 2-3 rewards are per call; its official code makes each call a verl sample).
  Which scope a system uses is the system's (`JointSystem.gae_scope`), never a param.
- `group_normalized` (GRPO, QAgent, DECOR Eq. 6, shared-prefix GRPO): (r - mean of the group) / (std of the group
  + eps), one scalar per sample; the std convention and eps are the caller's, named after its paper.
- `outcome_group_advantages` (JADE with `joint.jade.estimator: group`): GRPO's outcome supervision over multi-call
  episodes, each episode's return group-normalised and broadcast to all its calls; no critic.

Only `gae` and `episode_gae` need torch (imported there): DECOR's estimator stays a pure function of numbers.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Scope = Literal["episode", "call"]
StdConvention = Literal["population", "sample"]


def gae(rewards: torch.Tensor, values: torch.Tensor, terminal: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a 1-D sequence of steps (here: tokens).

        δ_t = r_t + γ·V_{t+1}·(1 - terminal_t) - V_t
        A_t = δ_t + γλ·(1 - terminal_t)·A_{t+1}          R_t = A_t + V_t

    `terminal[t]` cuts bootstrapping after step t (the value after a terminal step is 0); the last step is always
    terminal. Returns (advantages, returns), same shape as `rewards`.
    """
    import torch

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


def episode_gae(call_rewards: Sequence[float], call_values: Sequence[torch.Tensor], gamma: float, lam: float, *,
                scope: Scope) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-token (advantages, returns) for each call of one episode.

    `call_values[i]` holds the critic's value at each response token of call i (length = its response tokens);
    call i's reward goes on its last token. Calls with no response token are not allowed (a response always ends
    with at least its EOS or one generated token).
    """
    import torch

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


def group_normalized(rewards: Sequence[float], groups: Sequence[Hashable], *, std: StdConvention, eps: float
                     ) -> list[float]:
    """A_i = (r_i - μ_g) / (σ_g + eps) within each group g: the one group normalisation of the project.

    `std`: "population" (σ² = Σ(r - μ)² / n) or "sample" (Bessel's n - 1, what torch.std, TRL and verl compute);
    `eps` >= 0. Each caller names its paper's choice. A group whose rewards are all equal (σ = 0), a group of one
    sample included, gets A = 0 for each: no signal, whatever the convention and eps (so eps = 0 is allowed). A NaN
    reward is not equal to itself: its group's advantages are NaN, for the trainer's non-finite checks to catch.
    Computed in float64 (Python floats).
    """
    if len(rewards) != len(groups):
        raise ValueError(f"group_normalized: {len(rewards)} rewards for {len(groups)} group ids")
    if std not in ("population", "sample"):
        raise ValueError(f"group_normalized: std must be 'population' or 'sample', not {std!r}")
    if eps < 0:
        raise ValueError(f"group_normalized: eps must be >= 0, not {eps}")
    by: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        by[g].append(i)
    out = [0.0] * len(rewards)
    for idx in by.values():
        xs = [float(rewards[i]) for i in idx]
        if all(x == xs[0] for x in xs):           # σ = 0 (and n = 1): A = 0
            continue
        mu = sum(xs) / len(xs)
        sigma = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - (std == "sample")))
        for i, x in zip(idx, xs):
            out[i] = (x - mu) / (sigma + eps)
    return out


def outcome_group_advantages(returns: Sequence[float], groups: Sequence[Hashable], calls: Sequence[int], *,
                             std: StdConvention = "sample", eps: float = 1e-4) -> list[list[float]]:
    """GRPO's outcome supervision over multi-call episodes: episode i's return R_i is normalised within its group
    (the G rollouts of one question), A_i = (R_i − μ_g) / (σ_g + eps) (`group_normalized`), and every one of its
    `calls[i]` calls gets A_i (DeepSeekMath §4.1.2: "sets the advantages of all tokens in the output as the
    normalized reward"; here the output is the episode's whole call sequence). No critic: what a question's
    difficulty adds to every rollout of it cancels in R_i − μ_g. Defaults: TRL's GRPO (sample std) and the
    project's GRPO ε."""
    if len(calls) != len(returns):
        raise ValueError(f"outcome_group_advantages: {len(returns)} returns for {len(calls)} call counts")
    adv = group_normalized(returns, groups, std=std, eps=eps)
    return [[a] * n for a, n in zip(adv, calls)]
