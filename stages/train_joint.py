"""Stage train_joint@<system>: joint multi-agent policy gradient of one shared backbone on every trained role of a
system (PPO with a critic for M-ASK; DECOR's per-role group advantages, no critic).

Usage: python -m stages.train_joint <system> (dvc.yaml: `foreach: ${joint.systems}`). Reads `joint.ppo` (shared
PPO settings), `joint.<system>` (training questions, per-system PPO overrides, and for QAgent its training params)
and the system's own inference section (e.g. `mask`). QAgent trains in two stages (`run_staged`). Writes
models/agents/<system> (LoRA merged, safetensors + model card), the curves reports/training/train_joint_<system>/
(DVCLive; + PNG) and metrics/train_joint_<system>.json. Checkpoints live in checkpoints/train_joint_<system> (not a
DVC out): a killed run, rerun, resumes from the last one.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragteam.config import parse_section
from ragteam.data.formats import load_qa
from ragteam.io import DataError
from ragteam.llm import LLMConfig
from ragteam.train.curves import collapsed
from ragteam.systems.params import JointSections, load_joint
from ragteam.systems.warmup import WarmupSection
from ragteam.train.joint.loop import train_joint_ppo
from ragteam.eval.probe import team_reward_probe
from ragteam.train.probe import probe_questions, probe_schedule, probe_summary
from ragteam.warmup.start import WARMUP_DIR, start_model
from stages.common import CHECKPOINTS, finish_agent, stage_main

POOL = Path("data/prepared/train/pool.jsonl")


def make_probe(system: str, params: dict, jp: JointSections, pool: Sequence[dict], max_questions: int, retriever,
               total_steps: int):
    """The team-reward probe of `system`'s RL (`joint.probe`; None when off) and the global steps it runs at: the
    pool's last `joint.probe.questions`, clear of RL's questions and of the warm-up's traced ones."""

    if not jp.probe.questions:
        return None, set(), []
    used = {f"joint.{system}.max_questions": max_questions}
    if "warmup" in params:   # the traced questions, whether or not a warm-up runs (the check stays one rule)
        used["warmup.questions"] = parse_section(params, "warmup", WarmupSection).questions
    rows = probe_questions(pool, jp.probe.questions, used)
    return (team_reward_probe(system, rows, retriever, params), probe_schedule(total_steps, jp.probe.every),
            [r["id"] for r in rows])


def probe_tag(jp: JointSections, steps: set[int], ids: Sequence[str]) -> dict[str, Any]:
    """What of the probe goes into the checkpoints' fingerprint: its entries are in the saved log, so a run resumed
    under another probe would mix two probes' curves (empty when off: fingerprints of runs without it unchanged)."""
    return {"probe": {"steps": sorted(steps), "questions": list(ids)}} if jp.probe.questions else {}


# the team-reward probe (ragteam.train.probe): the same held-out questions each time, greedily
PROBE_PANEL = ("probe: team reward, F1 (held-out, greedy)", ["probe/team_reward", "probe/f1"])


def probe_card(jp: JointSections, ids: Sequence[str]) -> dict[str, Any]:
    """The probe's settings and questions for the model card; nothing when off, so an agent trained without it
    saves the same bytes as before the probe existed."""
    return {"joint.probe": {**jp.probe.model_dump(), "question_ids": list(ids)}} if jp.probe.questions else {}


def panels(roles: Sequence[str], critic: bool, stats: Sequence[str] = ()) -> list:
    """The curves' layout: rewards per role, the step's reward and the probe's (the same held-out questions at
    every probe), the signal (mean |advantage| before and after whitening, the reward's
    spread within each question's group where there are groups), losses (the value loss, explained variance and the policy's and the
    critic's gradient norms with a critic; the groups trained by dynamic sampling, the policy loss and its gradient
    norm without one), KL, clipping, lengths, format errors, turns, then the system's own figures."""
    learn = (["value_loss", "explained_variance", ("grad norm", ["grad_norm/policy", "grad_norm/critic"])] if critic
             else [("groups (dynamic sampling)", ["groups_trained", "groups_kept", "groups_dropped", "groups_refilled",
                                                  "groups"]), "policy_loss", "grad_norm/policy"])
    own = [s for s in stats if s not in ("turns", "searches")]
    signal = [("advantage |A| (raw, trained)", ["advantage_abs_raw", "advantage_abs"]),
              ("reward spread in groups", ["reward_group_std", "groups_with_spread"])]
    return [("reward per role", [f"reward/{r}" for r in roles]), ("reward", ["reward", "episode_f1"]), PROBE_PANEL,
            *signal, *learn,
            ("KL", ["approx_kl", "kl_ref", "kl_start"]), "clip_frac", "response_tokens", "format_error_rate",
            ("turns, searches", ["turns", "searches"]), *([("system figures", own)] if own else [])]


def run(system_name: str, params: dict) -> dict:
    from ragteam.retrieval import open_retriever
    from ragteam.systems.registry import joint_system

    spec = joint_system(system_name)
    if spec.stages:
        return run_staged(system_name, params)
    ppo, jp, sp = load_joint(params, system_name)
    llm = parse_section(params, "llm", LLMConfig).for_stage(f"train_joint_{system_name}")
    if not POOL.is_file():
        raise DataError(f"{POOL}: missing (training questions); run stage prepare_data first (dvc repro)")
    pool = load_qa(POOL)
    rows = pool[: sp.max_questions] if sp.max_questions else pool
    retriever = open_retriever(jp.retriever)
    probe, probe_steps, probe_ids = make_probe(system_name, params, jp, pool, sp.max_questions, retriever, ppo.steps)
    start = start_model(WARMUP_DIR / system_name, llm.model)
    system = spec.build_joint(params, retriever)
    if start != llm.model:   # frozen helper roles on "the base model" stay on the backbone, not on the warm-up's weights
        system = dataclasses.replace(system, frozen_roles={r: p or llm.model for r, p in system.frozen_roles.items()})
    stage = f"train_joint_{system_name}"
    group = f" x G {sp.group_size}" if getattr(sp, "group_size", 1) > 1 else ""
    print(f"{stage}: from {start}, {ppo.steps} steps x {ppo.questions_per_step} questions{group} of {len(rows)}, "
          f"{'critic ' + ppo.critic if system.critic else 'no critic (system advantages)'}, "
          f"LoRA {ppo.lora.enabled}, rollouts {ppo.rollout_backend} on {llm.backend}/{llm.device}", flush=True)
    result = train_joint_ppo(system, rows, start, CHECKPOINTS / stage, ppo, llm, dict(llm.sampling),
                             run_tag={"retriever": jp.retriever, "max_questions": sp.max_questions,
                                      **probe_tag(jp, probe_steps, probe_ids)},
                             probe=probe, probe_steps=probe_steps,
                             on_step=lambda step, e: print(
                                 f"{stage}: step {step}/{ppo.steps} reward {e['reward']:.3f} episode F1 "
                                 f"{e['episode_f1']:.3f} policy loss {e.get('policy_loss', 0):.4f} format errors "
                                 f"{e['format_error_rate']:.2f} ({e['step_seconds']:.1f} s, rollout "
                                 f"{e['rollout_seconds']:.1f} s)", flush=True))
    # wall time is logged as `step_seconds` / `rollout_seconds`: summed into metrics, kept out of curves and the card
    curve = [dict(h) for h in result.log_history]
    extra: dict[str, Any] = {}
    for col in ("episode_f1", "response_tokens", "format_error_rate", "explained_variance", "value_loss",
                "clip_frac", "turns", "searches", "groups_trained", "groups_kept", "groups_dropped",
                "groups_refilled", "grad_norm/policy", "grad_norm/critic", "advantage_abs_raw", "reward_group_std",
                "groups_with_spread", "kl_start", *[f"reward/{r}" for r in system.roles],
                *[k for k in system.stats if k not in ("turns", "searches")]):
        ys = [r[col] for r in curve if col in r and r[col] == r[col]]
        if ys:
            q = max(len(ys) // 4, 1)
            extra[f"{col}_first"], extra[f"{col}_last"] = round(sum(ys[:q]) / q, 4), round(sum(ys[-q:]) / q, 4)
    extra["collapsed"] = collapsed(curve, window=ppo.collapse_window, drop=ppo.collapse_drop)
    extra["nonfinite_grad_steps"] = sum(int(r.get("nonfinite_grad_steps", 0)) for r in curve)
    extra["optimizer_steps"] = sum(int(r.get("optimizer_steps", 0)) for r in curve)
    extra["questions"] = len(rows)
    extra.update(probe_summary(curve))
    return finish_agent(
        result, curve, stage=stage, agent=system_name, base_model=start,
        backend=f"ragteam joint PPO ({ppo.rollout_backend} rollouts)", data={"train_pool": POOL},
        params={"joint.ppo": ppo.model_dump(), f"joint.{system_name}": sp.model_dump(), "system": system.describe,
                "retriever": jp.retriever, **probe_card(jp, probe_ids)},
        reward=spec.reward_text, extra_metrics=extra, panels=panels(system.roles, system.critic, list(system.stats)),
        title=(f"{system_name}: joint {'PPO' if system.critic else 'group policy gradient'}, {ppo.steps} steps x "
               f"{ppo.questions_per_step} questions{group}"),
        notes=(f"One policy for every role ({', '.join(system.roles)}); each AgentCall of a rollout is a sample "
               + (f"(GAE scope {system.gae_scope}, γ {ppo.gamma}, λ {ppo.lam}, critic {ppo.critic}). "
                  if system.critic
                  else f"(advantages: {system.describe.get('advantage', 'the system estimator')}, no critic; ratio "
                       f"{ppo.ratio_level}, ε {ppo.clip_eps} / {ppo.clip_eps_high or ppo.clip_eps}). ")
               + f"`collapsed` flags "
               f"episode F1 and response length both falling below {1 - ppo.collapse_drop:.0%} of their best window."))


STAGED_PANELS = [("reward", ["reward", "episode_f1"]), PROBE_PANEL, "zero_advantage", "policy_loss", "grad_norm/policy",
                 ("KL", ["approx_kl", "kl_ref", "kl_start"]), "response_tokens", ("format errors, cut at max_seq_len",
                                                                      ["format_error_rate", "truncated"]),
                 ("turns, searches", ["turns", "searches"])]


def run_staged(system_name: str, params: dict) -> dict:
    """train_joint@<system> of a system trained in successive stages (`System.stages`; QAgent: stage 1 (Eq. 7) then
    stage 2 (Eq. 8-10) from the stage-1 model), each a run of the joint loop with the system's adapter of that stage
    (`System.stage_ppo`, `System.train_stages`); the later stages' reward's frozen generator G is
    `joint.<system>.generator` (null: llm.model) with llm.sampling.answer_agent, loaded only when a stage's reward
    calls it."""
    from ragteam.llm import EnginePool, Team
    from ragteam.retrieval import open_retriever
    from ragteam.systems.registry import joint_system

    spec = joint_system(system_name)
    stage = f"train_joint_{system_name}"
    ppo, jp, tp = load_joint(params, system_name)
    llm = parse_section(params, "llm", LLMConfig).for_stage(stage)
    per_stage = {s: spec.stage_ppo(ppo, tp, s) for s in tp.stages}
    if not POOL.is_file():
        raise DataError(f"{POOL}: missing (training questions); run stage prepare_data first (dvc repro)")
    pool = load_qa(POOL)
    rows = pool[: tp.max_questions] if tp.max_questions else pool
    retriever = open_retriever(jp.retriever)
    probe, probe_steps, probe_ids = make_probe(system_name, params, jp, pool, tp.max_questions, retriever,
                                               sum(per_stage[s].steps for s in tp.stages))
    generator_model = tp.generator or llm.model
    start = start_model(WARMUP_DIR / system_name, llm.model)
    pool = EnginePool(llm)
    generator = Team(lambda role: pool.get(generator_model), dict(llm.sampling))
    # every stage gets G; only a stage whose reward calls it (QAgent's stage 2) loads it
    systems = {s: (lambda s=s: spec.build_joint(params, retriever, s, generator)) for s in tp.stages}
    print(f"{stage}: from {start}, {' then '.join(f'{s} {per_stage[s].steps} steps' for s in tp.stages)}, each "
          f"{ppo.questions_per_step} questions x G {tp.group_size} of {len(rows)}, LoRA {ppo.lora.enabled}, "
          f"generator {generator_model}, on {llm.backend}/{llm.device}", flush=True)
    result, curve = spec.train_stages(
        systems, rows, start, CHECKPOINTS / stage, per_stage, llm, dict(llm.sampling),
        run_tag={"retriever": jp.retriever, "max_questions": tp.max_questions, "generator": generator_model,
                 **probe_tag(jp, probe_steps, probe_ids)},
        probe=probe, probe_steps=probe_steps,
        on_step=lambda s, step, e: print(
            f"{stage}: {s} step {step}/{per_stage[s].steps} reward {e['reward']:.3f} episode F1 "
            f"{e['episode_f1']:.3f} zero-advantage {e.get('zero_advantage', 0):.2f} format errors "
            f"{e['format_error_rate']:.2f} cut {e['truncated']:.2f} tokens {e['response_tokens']:.0f} "
            f"({e['step_seconds']:.1f} s, rollout {e['rollout_seconds']:.1f} s)", flush=True))
    extra: dict[str, Any] = {"questions": len(rows), **probe_summary(curve)}
    for s in tp.stages:
        rs = [r for r in curve if r["stage"] == s]
        for col in ("reward", "episode_f1", "format_error_rate", "response_tokens", "zero_advantage", "turns",
                    "searches", "truncated", "grad_norm/policy"):
            ys = [r[col] for r in rs if col in r and r[col] == r[col]]
            if ys:
                q = max(len(ys) // 4, 1)
                extra[f"{s}/{col}_first"] = round(sum(ys[:q]) / q, 4)
                extra[f"{s}/{col}_last"] = round(sum(ys[-q:]) / q, 4)
        # the share of the stage's trajectories cut at max_seq_len (not trained: System.train_stages)
        extra[f"{s}/truncated"] = round(sum(r.get("truncated", 0.0) for r in rs) / max(len(rs), 1), 4)
        extra[f"{s}_seconds"] = round(sum(r.get("step_seconds", 0.0) for r in rs), 1)
        extra[f"{s}/nonfinite_grad_steps"] = sum(int(r.get("nonfinite_grad_steps", 0)) for r in rs)
        extra[f"{s}/optimizer_steps"] = sum(int(r.get("optimizer_steps", 0)) for r in rs)
    return finish_agent(
        result, curve, stage=stage, agent=system_name, base_model=start,
        backend=f"ragteam joint loop, multi-turn GRPO ({ppo.rollout_backend} rollouts)", data={"train_pool": POOL},
        params={f"joint.{system_name}": tp.model_dump(),
                **{f"joint.ppo ({s})": per_stage[s].model_dump() for s in tp.stages},
                system_name: dict(params.get(spec.section) or {}),
                "retriever": jp.retriever, "generator": generator_model, **probe_card(jp, probe_ids)},
        reward=spec.reward_text, extra_metrics=extra, panels=STAGED_PANELS,
        title=f"{system_name}: multi-turn GRPO, {' + '.join(f'{per_stage[s].steps} ({s})' for s in tp.stages)} steps x "
              f"{ppo.questions_per_step} questions x G {tp.group_size}",
        notes=(f"One sample per trajectory (G = {tp.group_size} per question), advantage (R - mean) / std over the "
               f"group, no critic; <information> and retry tokens masked out of the loss; loss normalised by each "
               f"group's total generated tokens (Eq. 3); k3 KL β = {ppo.kl_coef} to the stage's start model. "
               f"A trajectory longer than max_seq_len {tp.max_seq_len} keeps its place in its group's statistics "
               f"but does not train (`truncated`: the share cut). "
               f"Stage 2 starts from the stage-1 model."))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m stages.train_joint <system>   (a name in joint.systems)")
    name = sys.argv[1]
    stage_main(f"train_joint_{name}", name, lambda params: run(name, params), engines=True, system=name)


if __name__ == "__main__":
    main()
