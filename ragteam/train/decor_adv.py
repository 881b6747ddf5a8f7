"""DECOR's advantage estimator (Eq. 6) and dynamic-sampling filter, as pure functions of rewarded Episodes.

The trainer (the shared policy-gradient core) consumes the output: one advantage per policy call, the same for every
token of that call, with the sequence-level ratio of Eq. 5 and clip-higher on the common loss. Nothing here
imports torch.

    R_total^{u,i} = mean of AgentCall.reward over role u's calls in trajectory i
    A_i^u = (R_total^{u,i} − μ_u) / (σ_u + ε)         Eq. 6: μ_u, σ_u over the group's trajectories where u acted

Eq. 6 writes μ_u, σ_u over {R_total^{u,j}}_{j=1..G}, but R_total^{u,j} exists only where role u acted in
trajectory j: a trajectory whose Planner stopped at once has no Filter call, and one cut at a malformed Planner
output has neither Filter nor Answerer. So μ_u, σ_u are taken over the trajectories of the group where u acted
(G_u ≤ G of them); a trajectory without a u call has no A^u (nothing of u to train) and does not enter u's
statistics, while its other roles' advantages count as usual. (Counting it as R = 0 would invent a reward the
paper never defines and shift every other trajectory's A^u.)

Unstated in the paper and chosen here:
- Several Planner / Filter steps per trajectory (up to T_max each): their step rewards are averaged into one
  R_total^{u,i} (Eq. 6 normalises one value per trajectory and role), and that A_i^u applies to every call of u in i.
  A trajectory that failed the format gate has reward −1 on every call, hence R_total^{u,i} = −1 for its roles.
- σ is the sample standard deviation (n − 1), as TRL's GRPO (and `grpo_prefix`, which follows it) computes it; a
  group where role u acted in fewer than two trajectories, or where its returns are all equal, gets A = 0 for u
  (`ragteam.train.advantages.group_normalized`, the project's one group normalisation, with std="sample").
- The group of a trajectory is its question (`Episode.question_id`): a batch holds the G rollouts of each question.
- Dynamic sampling (Sec. 4.4, "filtering out zero-gradient noise", after DAPO): a group trains when what Eq. 6
  normalises varies within it, i.e. some role's R_total^{u,i} differs across the trajectories where u acted, so
  some A_i^u ≠ 0 (`keep_group`). The paper's "0 < R_i < 1" window on the team reward would drop a group where
  some trajectories pass the format gate and others do not while all score R_team = 0: its role rewards (±1
  against −1) are the only signal such a group has. DAPO's own filter is this one: verl's recipe/dapo keeps a
  prompt whose rewards have std > 0.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence

from pydantic import Field

from ragteam.config import Strict
from ragteam.records import Episode
from ragteam.train.advantages import group_normalized

EPS = 1e-4  # ε of Eq. 6 (not stated in the paper; the project's GRPO uses 1e-4)


class DynamicSamplingConfig(Strict):
    """DAPO-style dynamic sampling (Sec. 4.4): train on a question's group of G trajectories only when some role's
    return varies within it (`ragteam.train.decor_adv.keep_group`: otherwise every Eq. 6 advantage is 0), and
    refill the step with further questions until `joint.decor.ppo.questions_per_step` groups are kept or
    `max_rounds` rollouts have run (`ragteam.train.joint.batch._select_with_refill`).

    Here, beside `dynamic_sampling`, because DECOR, JADE and QAgent all configure it (no one system's module)."""

    enabled: bool = True
    max_rounds: int = Field(10, ge=1)   # rollouts per step, the first included (DAPO recipe's max_num_gen_batches
                                        # 10); 1: no refill


def role_returns(ep: Episode, roles: Collection[str]) -> dict[str, float]:
    """R_total^{u,i} per policy role (of `roles`, DECOR's `POLICY_ROLES`) that acted in the trajectory: the mean
    reward of its calls."""
    by_role: dict[str, list[float]] = defaultdict(list)
    for c in ep.calls:
        if c.role in roles:
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


def decor_advantages(episodes: Sequence[Episode], roles: Collection[str], eps: float = EPS
                     ) -> list[list[float | None]]:
    """A_i^u for every call of every episode (aligned with `Episode.calls`); None for calls of a role not in
    `roles`, the policy roles (the frozen summarizer)."""
    adv = role_group_normalize([role_returns(ep, roles) for ep in episodes], [ep.question_id for ep in episodes], eps)
    return [[a.get(c.role) if c.role in roles else None for c in ep.calls] for ep, a in zip(episodes, adv)]


def keep_group(returns: Sequence[Mapping[str, float]], tol: float = 1e-9) -> bool:
    """Dynamic sampling (module docstring): a group of trajectories trains iff some policy role's R_total^{u,i}
    (returns[i][u], `role_returns`) varies across the trajectories where u acted (by more than `tol`, float
    noise), so that Eq. 6 gives some call a non-zero advantage; whatever the group's mean R_team."""
    by_role: dict[str, list[float]] = defaultdict(list)
    for r in returns:
        for role, v in r.items():
            by_role[role].append(v)
    return any(max(vs) - min(vs) > tol for vs in by_role.values())


def dynamic_sampling(episodes: Sequence[Episode],
                     returns_of: Callable[[Episode], Mapping[str, float]]) -> list[Episode]:
    """The episodes of the groups (questions, `Episode.question_id`) that `keep_group` keeps, order preserved.

    `returns_of`: what the system's estimator normalises within a group, per role: DECOR's R_total^{u,i} (Eq. 6,
    `role_returns` over its policy roles); QAgent's one trajectory reward
    (`ragteam.systems.qagent.train.trajectory_return`), the same filter on a one-role system (DAPO's: a prompt whose
    rewards have std > 0)."""
    returns: dict[str, list[Mapping[str, float]]] = defaultdict(list)
    for ep in episodes:
        returns[ep.question_id].append(returns_of(ep))
    kept = {g for g, rs in returns.items() if keep_group(rs)}
    return [ep for ep in episodes if ep.question_id in kept]
