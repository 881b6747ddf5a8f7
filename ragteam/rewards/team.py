"""A joint system's own training reward on a finished evaluation episode (issue 25 §3: each row scored "by EM / F1
and by the system's own training reward"), one number per question, so `evaluate` can average it, bootstrap it and
pair it between the base, warm-up and trained rows like EM and F1.

Per system, the quantity its trainer optimises, from the reward functions the trainer calls:
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

from collections.abc import Sequence

from ragteam.records import Episode

# workflows of `ragteam.eval.evaluate` whose rows get a team reward (M-ASK's rows: with an answer after every turn)
WORKFLOWS = ("jade", "decor", "qagent", "qagent_plugin", "mask")


def episode_return(ep: Episode) -> float:
    """The sum of an episode's call rewards (JADE: R_global on the terminal call plus the format rewards)."""
    missing = [i for i, c in enumerate(ep.calls) if c.reward is None]
    if missing:
        raise ValueError(f"episode {ep.episode_id}: call(s) {missing} have no reward (annotate first)")
    return float(sum(c.reward for c in ep.calls))


def decor_team_reward(ep: Episode) -> float:
    """The mean R_total over the policy calls of a DECOR episode whose rewards `decor.assign_rewards` filled."""
    from ragteam.agents import decor

    rewards = [c.reward for c in ep.calls if c.role in decor.POLICY_ROLES]
    if not rewards or any(r is None for r in rewards):
        raise ValueError(f"episode {ep.episode_id}: DECOR policy calls without a reward (assign_rewards first)")
    return float(sum(rewards) / len(rewards))


def mask_team_reward(ep: Episode, penalty: float) -> float:
    """The mean call reward of an M-ASK episode that answered after every turn (Eq. 2-3, −penalty per malformed
    call); the call rewards are filled in place, as JADE's and DECOR's are by evaluation."""
    from ragteam.rewards.mask import annotate_mask_episode

    if not ep.meta.get("answered_every_turn"):
        raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): M-ASK's turn-level rewards (Eq. 2-3) need the "
                         f"Answer agent after every turn; this episode answered once at the end (set the row's "
                         f"answer_every_turn: true, or mask.answer_every_turn)")
    annotate_mask_episode(ep, penalty)
    return float(sum(c.reward for c in ep.calls) / len(ep.calls))


def resampled_calls(ep: Episode) -> list[int]:
    """Indices of the calls whose output the answer fallback replaced (`meta["resampled"]`)."""
    return [i for i, c in enumerate(ep.calls) if "resampled" in c.meta]


def generator_answer(ep: Episode) -> str:
    """What stage 2's reward reads as G(q, K) of a plug-in episode: its generator call's answer, or "" where that
    call is malformed or was resampled (the stub it replaced did not parse)."""
    from ragteam.agents.qagent_workflow import GENERATOR_ROLE

    gen = [c for c in ep.calls if c.role == GENERATOR_ROLE]
    if not gen:
        raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): a plug-in QAgent episode without its "
                         f"generator call ({GENERATOR_ROLE})")
    g = gen[-1]
    if g.format_error is not None or "resampled" in g.meta:
        return ""
    return g.parsed or ""


def qagent_team_reward(ep: Episode, plugin: bool, hit_weight: float, passage_words: int | None) -> float:
    """Eq. 7 for an end-to-end QAgent episode, Eq. 8-10 for a plug-in one (G(q, K): `generator_answer`)."""
    from ragteam.agents.qagent_workflow import knowledge
    from ragteam.rewards.qagent import qagent_reward_stage1, qagent_reward_stage2

    if not plugin:
        return float(qagent_reward_stage1(ep))
    return float(qagent_reward_stage2(generator_answer(ep), knowledge(ep), ep.golden_answers, hit_weight,
                                      passage_words))


def check_workflow(workflow: str) -> None:
    if workflow not in WORKFLOWS:
        raise ValueError(f"no team reward for workflow {workflow!r}: defined for {', '.join(WORKFLOWS)} (the "
                         f"systems trained by a reward of their own)")


def set_team_rewards(episodes: Sequence[Episode], workflow: str, *, hit_weight: float = 0.5,
                     passage_words: int | None = None, mask_penalty: float = 1.0) -> None:
    """`Episode.metrics["team_reward"]` of every scored episode (golden answers) of a `workflow` row whose call
    rewards are in place (JADE, DECOR) or computable from the episode (QAgent; M-ASK's with an answer after every
    turn, `mask_penalty` its `mask.format_penalty`)."""
    check_workflow(workflow)
    for ep in episodes:
        if not ep.golden_answers:
            continue
        if workflow != "qagent_plugin" and resampled_calls(ep):
            raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): call(s) {resampled_calls(ep)} were "
                             f"resampled by the answer fallback, which the {workflow} workflow never asks for; its "
                             f"team reward would score an answer its policy did not give")
        if workflow == "jade":
            r = episode_return(ep)
        elif workflow == "decor":
            r = decor_team_reward(ep)
        elif workflow == "mask":
            r = mask_team_reward(ep, mask_penalty)
        else:
            r = qagent_team_reward(ep, workflow == "qagent_plugin", hit_weight, passage_words)
        ep.metrics["team_reward"] = r
