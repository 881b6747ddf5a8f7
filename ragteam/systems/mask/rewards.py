"""M-ASK turn-level rewards (paper §3.3, Eq. 2-3, Algorithm 1), one function per equation, on the project's one F1.

F1 is FlashRAG's token F1 (`ragteam.metrics.f1_score`: normalised, max over golden answers; a yes/no/noanswer
prediction or gold scores 0 unless it matches exactly, which is the official code's "EM for yes/no").

`annotate_mask_episode` writes the reward of every call of a training-mode episode into `AgentCall.reward`; the
joint trainer reads those rewards as they are.
"""
from __future__ import annotations

from collections.abc import Iterable

import ragteam.systems.mask.roles as M
from ragteam.metrics import f1_score
from ragteam.records import AgentCall, Episode


def planning_reward(a0: str, golden_answers: list[str]) -> float:
    """Eq. 2 (state-based): r_plan = F1(a_0, y), a_0 the Planning agent's predicted answer from parametric memory."""
    return f1_score(a0, golden_answers)


def answer_reward(a_t: str, golden_answers: list[str]) -> float:
    """Eq. 2 (state-based): r_ans^(t) = F1(a_t, y), a_t the Answer agent's answer from K_t."""
    return f1_score(a_t, golden_answers)


def iteration_reward(a_t: str, a_prev: str, golden_answers: list[str]) -> float:
    """Eq. 3 (transition-based, shared by Search, Summary and Update in turn t):
    r_iter^(t) = r_ans^(t) - r_ans^(t-1) = F1(a_t, y) - F1(a_{t-1}, y); for t = 1, a_0 is the Planning answer."""
    return f1_score(a_t, golden_answers) - f1_score(a_prev, golden_answers)


def end_reward() -> float:
    """§3.3 / Algorithm 1: a Search call that outputs <end> gets r = 0 (the team stops when search gains nothing)."""
    return 0.0


def format_penalty(call: AgentCall, penalty: float) -> float:
    """Not in the paper (the official code: -1.0): -penalty for a call whose output broke its role's format."""
    return -penalty if call.format_error is not None else 0.0


def annotate_mask_episode(ep: Episode, penalty: float) -> Episode:
    """Fill `reward` of every call of a training-mode M-ASK episode (Algorithm 1's stored transitions):

    Planning F1(a_0, y); Answer F1(a_t, y); Search, Summary, Update of turn t F1(a_t, y) - F1(a_{t-1}, y); a Search
    that ends the loop 0; every call minus `penalty` when its output was malformed.
    """
    y = ep.golden_answers
    if not y:
        raise ValueError(f"episode {ep.episode_id} (question {ep.question_id!r}) has no golden answers to reward")
    answers: dict[int, str] = {}
    for c in ep.calls:
        if c.role in (M.PLANNING, M.ANSWER) and not c.meta.get("final"):
            answers[int(c.meta["turn"])] = c.meta["answer"]
    if 0 not in answers:
        raise ValueError(f"episode {ep.episode_id}: no Planning call (not an M-ASK episode?)")
    for c in ep.calls:
        turn = int(c.meta.get("turn", -1))
        if c.role == M.PLANNING:
            r = planning_reward(c.meta["answer"], y)
        elif c.role == M.ANSWER:
            r = answer_reward(c.meta["answer"], y)
        elif c.role == M.SEARCH and c.meta.get("end"):
            r = end_reward()
        elif c.role in (M.SEARCH, M.SUMMARY, M.UPDATE):
            if turn not in answers or turn - 1 not in answers:
                raise ValueError(f"episode {ep.episode_id}: no Answer call after turn {turn - 1} or {turn}; turn-level "
                                 f"rewards need a training-mode rollout (run_mask(..., training=True))")
            r = iteration_reward(answers[turn], answers[turn - 1], y)
        else:
            raise ValueError(f"episode {ep.episode_id}: call of unknown role {c.role!r}")
        c.reward = r + format_penalty(c, penalty)
    return ep


def annotate_mask(episodes: Iterable[Episode], penalty: float) -> list[Episode]:
    return [annotate_mask_episode(ep, penalty) for ep in episodes]
