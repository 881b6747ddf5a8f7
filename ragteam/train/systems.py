"""The systems the joint PPO trainer knows: each names its workflow's params section, builds its training-mode
rollout and its reward. A new system (JADE, DECOR, QAgent) adds one factory here and one `joint.systems` entry.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragteam.config import ParamsError, parse_section
from ragteam.retrieval.base import Retriever
from ragteam.train.ppo import JointSystem


def mask_system(params: dict[str, Any], retriever: Retriever) -> JointSystem:
    """M-ASK: the five roles of `ragteam.agents.mask`, the Answer agent after every turn, turn-level rewards
    (Eq. 2-3) minus `mask.format_penalty` per malformed call."""
    from ragteam.agents import mask as M
    from ragteam.agents.mask_workflow import MaskConfig, run_mask
    from ragteam.rewards.mask import annotate_mask

    cfg = parse_section(params, "mask", MaskConfig)
    return JointSystem(
        name="mask", roles=M.ROLES,
        rollout=lambda rows, team: run_mask(rows, team, retriever, cfg, system="mask", training=True),
        annotate=lambda eps: annotate_mask(eps, cfg.format_penalty),
        describe={"workflow": "ragteam.agents.mask_workflow.run_mask(training=True)", "mask": cfg.model_dump(),
                  "reward": "M-ASK Eq. 2-3 (ragteam.rewards.mask.annotate_mask_episode)"},
    )


def qagent_system(params: dict[str, Any], retriever: Retriever, stage: str = "stage1", generator=None
                  ) -> JointSystem:
    """QAgent: one agent, G trajectories per question, each one sample with <information> / retry tokens masked,
    group-normalised advantages; stage 1 Eq. 7, stage 2 Eq. 8-10 with `generator` (a Team whose answer_agent is the
    frozen G). Two stages: stages.train_joint runs them through `ragteam.train.qagent.train_qagent`."""
    from ragteam.agents.qagent_workflow import QAgentConfig
    from ragteam.train.qagent import QAgentTrainParams
    from ragteam.train.qagent import qagent_system as build

    cfg = parse_section(params, "qagent", QAgentConfig)
    tp = parse_section(params, "joint.qagent", QAgentTrainParams)
    return build(cfg, tp, retriever, stage, generator)


REWARD_TEXT = {
    "mask": ("M-ASK turn-level rewards (§3.3): Planning F1(a_0, y) (Eq. 2); Answer F1(a_t, y) (Eq. 2); Search, "
             "Summary and Update of turn t F1(a_t, y) - F1(a_{t-1}, y) (Eq. 3); a Search that outputs <end> 0; "
             "minus mask.format_penalty for a malformed call (official code)."),
    "qagent": ("QAgent, one reward per trajectory, group-normalised over its question's G rollouts: stage 1 "
               "1{r_fmt = 1}·EM_s(A*, Â) (Eq. 7), stage 2 EM(A*, G(q, K)) + hit_weight·Hit(τ, A*) (Eq. 8-10, "
               "non-strict EM, frozen generator G over the deduplicated passages K)."),
}

SYSTEMS: dict[str, Callable[[dict[str, Any], Retriever], JointSystem]] = {"mask": mask_system,
                                                                          "qagent": qagent_system}


def build_system(name: str, params: dict[str, Any], retriever: Retriever) -> JointSystem:
    if name not in SYSTEMS:
        raise ParamsError(f"joint system {name!r} is not known (known: {', '.join(sorted(SYSTEMS))})")
    return SYSTEMS[name](params, retriever)
