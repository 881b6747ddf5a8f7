"""DECOR's advantage estimator (Eq. 6) and dynamic-sampling filter, as pure functions of rewarded Episodes.

The trainer (the shared policy-gradient core) consumes the output: one advantage per policy call, the same for every
token of that call, with the sequence-level ratio of Eq. 5 and clip-higher on the common loss. Nothing here
imports torch.

    R_total^{u,i} = mean of AgentCall.reward over role u's calls in trajectory i
    A_i^u = (R_total^{u,i} − μ_u) / (σ_u + ε)         Eq. 6: μ_u, σ_u over the group's trajectories where u acted

Unstated in the paper and chosen here:
- Several Planner / Filter steps per trajectory (up to T_max each): their step rewards are averaged into one
  R_total^{u,i} (Eq. 6 normalises one value per trajectory and role), and that A_i^u applies to every call of u in i.
  A trajectory that failed the format gate has reward −1 on every call, hence R_total^{u,i} = −1 for its roles.
- σ is the sample standard deviation (n − 1), as TRL's GRPO (and `grpo_prefix`, which follows it) computes it; a
  group where role u acted in fewer than two trajectories, or where its returns are all equal, gets A = 0 for u
  (`ragteam.train.advantages.group_normalized`, the project's one group normalisation, with std="sample").
- The group of a trajectory is its question (`Episode.question_id`): a batch holds the G rollouts of each question.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from ragteam.agents.decor import POLICY_ROLES
from ragteam.records import Episode
from ragteam.train.advantages import group_normalized

EPS = 1e-4  # ε of Eq. 6 (not stated in the paper; the project's GRPO uses 1e-4)


def role_returns(ep: Episode) -> dict[str, float]:
    """R_total^{u,i} per policy role that acted in the trajectory: the mean reward of its calls."""
    by_role: dict[str, list[float]] = defaultdict(list)
    for c in ep.calls:
        if c.role in POLICY_ROLES:
            if c.reward is None:
                raise ValueError(f"episode {ep.episode_id}: {c.role} call has no reward (run decor_rewards first)")
            by_role[c.role].append(c.reward)
    return {role: sum(rs) / len(rs) for role, rs in by_role.items()}


def role_group_normalize(returns: Sequence[Mapping[str, float]], groups: Sequence[str], eps: float = EPS
                         ) -> list[dict[str, float]]:
    """Eq. 6 on plain numbers: returns[i][u] = R_total^{u,i}, groups[i] = i's group; A per trajectory and role,
    normalised within each (group, role) pool with the sample std and `eps`."""
    if len(returns) != len(groups):
        raise ValueError(f"{len(returns)} returns but {len(groups)} group ids")
    flat = [(i, role, v, (g, role)) for i, (r, g) in enumerate(zip(returns, groups)) for role, v in r.items()]
    adv = group_normalized([v for _, _, v, _ in flat], [key for *_, key in flat], std="sample", eps=eps)
    out: list[dict[str, float]] = [{} for _ in returns]
    for (i, role, _, _), a in zip(flat, adv):
        out[i][role] = a
    return out


def decor_advantages(episodes: Sequence[Episode], eps: float = EPS) -> list[list[float | None]]:
    """A_i^u for every call of every episode (aligned with `Episode.calls`); None for non-policy calls
    (the frozen summarizer)."""
    adv = role_group_normalize([role_returns(ep) for ep in episodes], [ep.question_id for ep in episodes], eps)
    return [[a.get(c.role) if c.role in POLICY_ROLES else None for c in ep.calls] for ep, a in zip(episodes, adv)]


def keep_group(team_rewards: Sequence[float], low: float = 0.0, high: float = 1.0) -> bool:
    """Dynamic sampling (Sec. 4.4): a group is "promising but imperfect" when low < mean R_team < high."""
    if not team_rewards:
        return False
    mean = sum(team_rewards) / len(team_rewards)
    return low < mean < high


def dynamic_sampling(episodes: Sequence[Episode], low: float = 0.0, high: float = 1.0) -> list[Episode]:
    """The episodes of the groups (questions) that `keep_group` keeps, order preserved; filters on R_team
    (`Episode.meta["reward"]["team"]`, set by `ragteam.rewards.decor.assign_rewards`)."""
    teams: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        if "reward" not in ep.meta:
            raise ValueError(f"episode {ep.episode_id} has no meta.reward (run decor_rewards first)")
        teams[ep.question_id].append(float(ep.meta["reward"]["team"]))
    kept = {g for g, rs in teams.items() if keep_group(rs, low, high)}
    return [ep for ep in episodes if ep.question_id in kept]
