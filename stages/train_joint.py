"""Stage train_joint@<system>: joint multi-agent policy gradient of one shared backbone on every trained role of a
system (PPO with a critic for M-ASK; DECOR's per-role group advantages, no critic).

Usage: python -m stages.train_joint <system> (dvc.yaml: `foreach: ${joint.systems}`). Reads `joint.ppo` (shared
PPO settings), `joint.<system>` (training questions, per-system PPO overrides) and the system's own inference
section (e.g. `mask`). Writes models/agents/<system> (LoRA merged, safetensors + model card),
reports/training/train_joint_<system>.csv (+ PNG) and metrics/train_joint_<system>.json. Checkpoints live in
checkpoints/train_joint_<system> (not a DVC out): a killed run, rerun, resumes from the last one.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from ragteam.config import ParamsError, Strict, deep_merge, parse_section
from ragteam.data.formats import load_qa
from ragteam.io import DataError
from ragteam.llm import LLMConfig
from ragteam.train.curves import collapsed
from ragteam.train.ppo import PPOParams, train_joint_ppo
from stages.common import CHECKPOINTS, finish_agent, stage_main

POOL = Path("data/prepared/train/pool.jsonl")


class JointSystemParams(Strict):
    """`joint.<system>`: what one joint system trains on, and its overrides of `joint.ppo`."""

    max_questions: int = Field(0, ge=0)          # first n questions of the training pool; 0 = all
    ppo: dict[str, Any] = Field(default_factory=dict)


class JointParams(Strict):
    """params.yaml `joint`. A new joint system adds its name to `systems` and its sub-section here."""

    systems: list[str] = Field(min_length=1)
    retriever: str                               # index dir or http(s) service the rollouts search
    ppo: dict[str, Any]                          # validated as PPOParams (with each system's overrides)
    mask: JointSystemParams = JointSystemParams()
    jade: JointSystemParams = JointSystemParams()
    decor: JointSystemParams = JointSystemParams()


def load_joint(params: dict, system: str) -> tuple[PPOParams, JointParams, JointSystemParams]:
    """Validate `joint` for `system`: unknown keys anywhere (joint.*, joint.ppo.*, joint.<system>.ppo.*) are errors
    naming the key."""
    jp = parse_section(params, "joint", JointParams)
    if system not in jp.systems:
        raise ParamsError(f"params.yaml: system {system!r} is not in joint.systems {jp.systems}")
    sp: JointSystemParams = getattr(jp, system)
    unknown = sorted(set(sp.ppo) - set(PPOParams.model_fields))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key(s) joint.{system}.ppo.{', joint.{system}.ppo.'.join(unknown)} "
                          f"(known: {', '.join(PPOParams.model_fields)})")
    base = parse_section(params, "joint.ppo", PPOParams)
    merged = deep_merge(base.model_dump(), sp.ppo)
    ppo = parse_section({"joint": {system: {"ppo": merged}}}, f"joint.{system}.ppo", PPOParams)
    return ppo, jp, sp


def panels(roles: Sequence[str], critic: bool, stats: Sequence[str] = ()) -> list:
    """The curves' layout: rewards per role, losses (the value loss and explained variance with a critic; the
    groups trained by dynamic sampling without one), KL, clipping, lengths, format errors, turns, then the
    system's own figures."""
    learn = (["value_loss", "explained_variance"] if critic
             else [("groups trained", ["groups_trained", "groups"]), "policy_loss"])
    own = [s for s in stats if s not in ("turns", "searches")]
    return [("reward per role", [f"reward/{r}" for r in roles]), ("reward", ["reward", "episode_f1"]), *learn,
            ("KL", ["approx_kl", "kl_ref"]), "clip_frac", "response_tokens", "format_error_rate",
            ("turns, searches", ["turns", "searches"]), *([("system figures", own)] if own else [])]


def run(system_name: str, params: dict) -> dict:
    from ragteam.retrieval import open_retriever
    from ragteam.train.systems import REWARD_TEXT, build_system

    ppo, jp, sp = load_joint(params, system_name)
    llm = parse_section(params, "llm", LLMConfig)
    if not POOL.is_file():
        raise DataError(f"{POOL}: missing (training questions); run stage prepare_data first (dvc repro)")
    rows = load_qa(POOL)
    rows = rows[: sp.max_questions] if sp.max_questions else rows
    retriever = open_retriever(jp.retriever)
    system = build_system(system_name, params, retriever)
    stage = f"train_joint_{system_name}"
    print(f"{stage}: {ppo.steps} steps x {ppo.questions_per_step} questions of {len(rows)}, "
          f"{'critic ' + ppo.critic if system.critic else 'no critic (system advantages)'}, "
          f"LoRA {ppo.lora.enabled}, rollouts {ppo.rollout_backend} on {llm.backend}/{llm.device}", flush=True)
    result = train_joint_ppo(system, rows, llm.model, CHECKPOINTS / stage, ppo, llm, dict(llm.sampling),
                             run_tag={"retriever": jp.retriever, "max_questions": sp.max_questions},
                             on_step=lambda step, e: print(
                                 f"{stage}: step {step}/{ppo.steps} reward {e['reward']:.3f} episode F1 "
                                 f"{e['episode_f1']:.3f} policy loss {e.get('policy_loss', 0):.4f} format errors "
                                 f"{e['format_error_rate']:.2f} ({e['step_seconds']:.1f} s, rollout "
                                 f"{e['rollout_seconds']:.1f} s)", flush=True))
    # wall time is logged as `step_seconds` / `rollout_seconds`: summed into metrics, kept out of curves and the card
    curve = [dict(h) for h in result.log_history]
    extra: dict[str, Any] = {}
    for col in ("episode_f1", "response_tokens", "format_error_rate", "explained_variance", "value_loss",
                "clip_frac", "turns", "searches", "groups_trained", *[f"reward/{r}" for r in system.roles],
                *[k for k in system.stats if k not in ("turns", "searches")]):
        ys = [r[col] for r in curve if col in r and r[col] == r[col]]
        if ys:
            q = max(len(ys) // 4, 1)
            extra[f"{col}_first"], extra[f"{col}_last"] = round(sum(ys[:q]) / q, 4), round(sum(ys[-q:]) / q, 4)
    extra["collapsed"] = collapsed(curve, window=ppo.collapse_window, drop=ppo.collapse_drop)
    extra["questions"] = len(rows)
    return finish_agent(
        result, curve, stage=stage, agent=system_name, base_model=llm.model,
        backend=f"ragteam joint PPO ({ppo.rollout_backend} rollouts)", data={"train_pool": POOL},
        params={"joint.ppo": ppo.model_dump(), f"joint.{system_name}": sp.model_dump(), "system": system.describe,
                "retriever": jp.retriever},
        reward=REWARD_TEXT[system_name], extra_metrics=extra, panels=panels(system.roles, system.critic, list(system.stats)),
        title=(f"{system_name}: joint {'PPO' if system.critic else 'group policy gradient'}, {ppo.steps} steps x "
               f"{ppo.questions_per_step} questions"),
        notes=(f"One policy for every role ({', '.join(system.roles)}); each AgentCall of a rollout is a sample "
               + (f"(GAE scope {ppo.gae_scope}, γ {ppo.gamma}, λ {ppo.lam}, critic {ppo.critic}). " if system.critic
                  else f"(advantages: {system.describe.get('advantage', 'the system estimator')}, no critic; ratio "
                       f"{ppo.ratio_level}, ε {ppo.clip_eps} / {ppo.clip_eps_high or ppo.clip_eps}). ")
               + f"`collapsed` flags "
               f"episode F1 and response length both falling below {1 - ppo.collapse_drop:.0%} of their best window."))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m stages.train_joint <system>   (a name in joint.systems)")
    name = sys.argv[1]
    stage_main(f"train_joint_{name}", name, lambda params: run(name, params))


if __name__ == "__main__":
    main()
