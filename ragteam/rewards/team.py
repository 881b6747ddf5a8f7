"""A joint system's own training reward on a finished evaluation episode (issue 25 §3: each row scored "by EM / F1
and by the system's own training reward"), one number per question, so `evaluate` can average it, bootstrap it and
pair it between the base, warm-up and trained rows like EM and F1.

Per system, the quantity its trainer optimises, from the reward functions the trainer calls (each system's module
gives its rows' `TeamReward`s, `System.team_rewards`; this module is the loop they share):
- JADE: the episode's return, R_global on the terminal call plus every malformed call's −p (Eq. 6-8,
  `jade.assign_rewards`): what its GAE over the flattened calls (or its group estimator) credits.
- DECOR: the mean of R_total over the trajectory's policy calls (Eq. 2-3 with the format gate,
  `decor.assign_rewards`, the judge of `decor.judge`): a gated trajectory reads `decor.reward.format_penalty`. The
  mean, not the sum: evaluation does not cut a trajectory at its first malformed call as training does, so a sum
  would charge the penalty once per call that followed it.
- QAgent end to end (`qagent` rows): Eq. 7, the format gate times the strict EM of its own <answer> (stage 1).
- QAgent as a plug-in (`qagent_plugin` rows): Eq. 8-10, EM(A*, G(q, K)) + hit_weight · Hit(τ, A*) (stage 2), with
  the row's own frozen G's answer (its final answer) in place of a second generator call.
- M-ASK: the mean over the episode's calls of Eq. 2-3 minus `mask.format_penalty` per malformed call
  (`mask.annotate_mask_episode`), as its trainer's step reward averages them (each call is its own GAE scope). The
  turn-level rewards need the answer a_t after every turn (Algorithm 1), which the inference workflow (§3.3) does not
  give; an evaluation row that sets `answer_every_turn` runs the Answer agent after each turn as training does, and
  its final answer is the same call on the same last K as the single final call of inference. An episode without
  them (`meta["answered_every_turn"]` false) is refused with the reason.

Degenerate outputs score what training gives them: an empty or unparsable answer gets JADE's format penalty and
F1 0, DECOR's gate, QAgent's 0 (stage 1) or only its Hit (stage 2). That holds for an answer the evaluation's answer
fallback (`llm.answer_fallback`) resampled, too: a training rollout never resamples, so it scores the stub the call
replaced. Of these workflows only the plug-in's generator G is an answering role the fallback serves
(`agents.core.llm_step`'s `continue_if`); its resampled answer counts as "" (stage 2's `g.parsed if g.format_error is
None else ""` on the stub), so the row earns only its Hit. A resampled call in a JADE, DECOR or end-to-end QAgent
episode, which their workflows cannot produce, is refused rather than scored as if the policy had answered.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragteam.records import Episode


@dataclass(frozen=True)
class TeamReward:
    """One kind of evaluation row's team reward: `score(episode, cfgs)` with `cfgs` the workflows' params sections
    (`ragteam.eval.evaluate.WorkflowConfigs`); `resampled_ok` where the row's answering role may be served by the
    answer fallback (the QAgent plug-in's generator G, module docstring)."""

    score: Callable[[Episode, Any], float]
    resampled_ok: bool = False


def episode_return(ep: Episode) -> float:
    """The sum of an episode's call rewards (JADE: R_global on the terminal call plus the format rewards)."""
    missing = [i for i, c in enumerate(ep.calls) if c.reward is None]
    if missing:
        raise ValueError(f"episode {ep.episode_id}: call(s) {missing} have no reward (annotate first)")
    return float(sum(c.reward for c in ep.calls))


def resampled_calls(ep: Episode) -> list[int]:
    """Indices of the calls whose output the answer fallback replaced (`meta["resampled"]`)."""
    return [i for i, c in enumerate(ep.calls) if "resampled" in c.meta]


def set_team_rewards(episodes: Sequence[Episode], workflow: str, reward: TeamReward, cfgs: Any) -> None:
    """`Episode.metrics["team_reward"]` of every scored episode (golden answers) of a `workflow` row: `reward`'s
    score, from call rewards in place (JADE, DECOR) or computable from the episode (QAgent; M-ASK's with an answer
    after every turn)."""
    for ep in episodes:
        if not ep.golden_answers:
            continue
        if not reward.resampled_ok and resampled_calls(ep):
            raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): call(s) {resampled_calls(ep)} were "
                             f"resampled by the answer fallback, which the {workflow} workflow never asks for; its "
                             f"team reward would score an answer its policy did not give")
        ep.metrics["team_reward"] = reward.score(ep, cfgs)
