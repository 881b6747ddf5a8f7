"""The team-reward probe of joint RL (issue 25 §3-4): the policy's greedy team reward on fixed held-out questions,
before the first step and after chosen steps, so that "does the team reward rise during RL" is measured on the same
questions each time and not on each step's few drawn ones.

Why a probe. A step's `reward` averages the rollouts of `questions_per_step` drawn questions (2 on the CPU profile),
sampled at the rollout temperature: it moves with which questions a step drew more than with the policy. The probe
runs the same `questions` questions every time, greedily, through the system's inference workflow, and scores each
episode exactly as `evaluate` scores its rows (`ragteam.eval.probe.team_reward_probe`, which the stage hands the
trainer: `ragteam.eval.evaluate.run_system`'s F1 / EM and the system's own
training reward, `ragteam.rewards.team`; M-ASK's rows answer after every turn, so Eq. 2-3 apply). Its step-0 value is
the start model (the warm-up) on these questions, its last the trained agent, on one scale with the `*_warmup` and
`*_trained` rows of `reports/eval.md`.

The questions are the last `questions` of the training pool, which neither RL (its first `joint.<system>.
max_questions`) nor the warm-up's oracle traces (its first `warmup.questions`) use; `probe_questions` refuses an
overlap, naming it. The probe decodes greedily, in eval mode, and draws no random numbers (the HF engine samples
inside `fork_rng` only when it samples): where it runs changes the log, never what a step learns (a test trains with
and without it and compares the weights).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from ragteam.config import ParamsError, Strict

PREFIX = "probe/"


class ProbeParams(Strict):
    """params.yaml `joint.probe`: the team-reward probe of every joint system's RL."""

    questions: int = Field(12, ge=0)     # the pool's last n questions; 0 = no probe
    every: int = Field(0, ge=0)          # probe after every n-th step as well; 0 = before the first and after the last


def probe_schedule(total_steps: int, every: int) -> set[int]:
    """The global steps after which the probe runs: 0 (the start model), every `every`-th step, and the last."""
    steps = {0, total_steps}
    if every:
        steps |= set(range(every, total_steps + 1, every))
    return steps


def stage_probe_steps(schedule: set[int], offset: int, steps: int) -> set[int]:
    """The local steps of a stage that runs global steps offset+1 .. offset+steps (QAgent's stage 2 continues
    stage 1's count); local step 0 (before the stage's first step) only for the stage that starts at 0."""
    local = {g - offset for g in schedule if offset < g <= offset + steps}
    return local | ({0} if offset == 0 and 0 in schedule else set())


def probe_questions(pool: Sequence[dict], n: int, used: Mapping[str, int]) -> list[dict]:
    """The last `n` rows of the training `pool`; `used`: what else reads the pool's first rows (name -> how many,
    0 = all). A probe question that another use trains on would measure memory, not RL: refused, naming both."""
    if n > len(pool):
        raise ParamsError(f"joint.probe.questions is {n} but the training pool has {len(pool)} questions")
    start = len(pool) - n
    for name, first in used.items():
        if first == 0 or first > start:
            reach = "every question" if first == 0 else f"its first {first}"
            raise ParamsError(f"joint.probe.questions: the probe's {n} questions (the pool's last, from row {start}) "
                              f"overlap {name}, which uses {reach} of the {len(pool)}; lower {name} or "
                              f"joint.probe.questions")
    return list(pool[start:])


def probe_summary(curve: Sequence[dict]) -> dict[str, float]:
    """`probe/<figure>_first` and `_last` of a run's curve rows: the first and the last probe's value (the start
    model and the trained agent), not quarter means: each probe is one deterministic measurement."""
    out: dict[str, float] = {}
    keys = sorted({k for r in curve for k in r if k.startswith(PREFIX)})
    for k in keys:
        ys = [r[k] for r in curve if k in r]
        out[f"{k}_first"], out[f"{k}_last"] = ys[0], ys[-1]
    return out


__all__ = ["ProbeParams", "probe_questions", "probe_schedule", "probe_summary", "stage_probe_steps"]
