"""JADE rewards (Sec. 3.3, Eq. 6-8): a shared terminal global reward and a per-call format penalty.

    R_global = F1(ŷ, y) − ( α·𝒩(T) + β·𝒩(N_ret) ),  𝒩(x) = min(x, M) / M         Eq. 6
    r_format^(t,k) = −p if call (t, k) breaks its format, else 0                  Eq. 7
    r_(t,k) = r_format^(t,k) + 𝕀(t = T ∧ k = K_T) · R_global                        Eq. 8

F1 is the project's (`ragteam.metrics`, FlashRAG normalisation, max over golden answers); a yes / no gold only
matches exactly, which is what the official code gets by scoring yes / no questions with EM. T counts reasoning
rounds (planner calls, the first round included) and N_ret the retrieval actions, both from
`Episode.meta["workflow"]` as `ragteam.systems.jade.workflow` records them. 𝒩 divides by the "pre-defined maximum
limit" M (paper: 3) and clips at 1, since the paper scales the costs "to [0,1]". The official code charges
α·min(T−1, 3)/3 (a single round is free); Eq. 6 as printed charges every round, and so does this module.
The terminal step is the episode's last call (AS, or AG when the question was answered without decomposition);
every call of an Episode is one PPO sample, in execution order.
"""
from __future__ import annotations

from pydantic import Field

from ragteam.config import Strict
from ragteam.metrics import f1_score
from ragteam.records import AgentCall, Episode


class JadeRewardConfig(Strict):
    """`jade.reward` in params.yaml."""

    alpha: float = Field(0.0, ge=0.0)          # α, turn penalty (Eq. 6; headline value not stated, code: 0.0)
    beta: float = Field(0.0, ge=0.0)           # β, retrieval penalty (Eq. 6; headline value not stated, code: 0.0)
    cost_max: int = Field(3, ge=1)             # M, the normaliser's "pre-defined maximum limit" (paper: 3)
    format_penalty: float = Field(1.0, ge=0.0)  # p in Eq. 7 (paper: 1; official code: 2)


def normalized_cost(count: float, cost_max: int) -> float:
    """Eq. 6's 𝒩: linear scaling to [0, 1] by the maximum limit M (counts above M cost 1)."""
    return min(float(count), float(cost_max)) / cost_max


def global_reward(f1: float, rounds: int, retrievals: int, cfg: JadeRewardConfig) -> float:
    """Eq. 6: R_global = R_perf − R_cost = F1 − (α·𝒩_rnd(T) + β·𝒩_ret(N_ret))."""
    return f1 - (cfg.alpha * normalized_cost(rounds, cfg.cost_max)
                 + cfg.beta * normalized_cost(retrievals, cfg.cost_max))


def format_reward(call: AgentCall, cfg: JadeRewardConfig) -> float:
    """Eq. 7: −p when the call's output broke its role's format (`AgentCall.format_error`), else 0."""
    return -cfg.format_penalty if call.format_error is not None else 0.0


def assign_rewards(ep: Episode, cfg: JadeRewardConfig) -> float:
    """Eq. 8: every call gets its format reward, the last call also R_global; fills `AgentCall.reward`.

    Returns R_global and records it in `ep.meta["workflow"]["r_global"]`.
    """
    if not ep.golden_answers:
        raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): no golden answers to score R_global against")
    if not ep.calls:
        raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): no agent calls to reward")
    if "workflow" not in ep.meta:
        raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): not a JADE episode (no meta['workflow'])")
    wf = ep.meta["workflow"]
    f1 = f1_score(ep.final_answer or "", ep.golden_answers)
    r_global = global_reward(f1, int(wf["rounds"]), int(wf["retrievals"]), cfg)
    for call in ep.calls:
        call.reward = format_reward(call, cfg)
    ep.calls[-1].reward += r_global
    wf["r_global"] = r_global
    return r_global
