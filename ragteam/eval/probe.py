"""The team-reward probe's scoring (`ragteam.train.probe`): held-out questions run through a system's inference
workflow and scored exactly as `evaluate` scores its rows. The training stage builds it here and hands it to the
trainer, which calls it with the current policy's Team; the trainer never imports evaluation."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ragteam.eval.evaluate import SystemSpec, WorkflowConfigs, has_team_reward, run_system, silence
from ragteam.llm import Team
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.systems.registry import REGISTRY
from ragteam.train.probe import PREFIX


def summarize_probe(episodes: Sequence[Episode]) -> dict[str, float]:
    """The probe's figures over its episodes (each scored by `run_system`): the mean team reward, F1 and EM, and the
    shares of questions with a malformed call and with no answer."""
    scored = [ep for ep in episodes if ep.golden_answers]
    if not scored:
        raise ValueError("team-reward probe: no scored episode (the probe questions have no golden answers)")
    missing = [ep.question_id for ep in scored if "team_reward" not in ep.metrics]
    if missing:
        raise ValueError(f"team-reward probe: episode(s) without a team reward: {missing[:3]}")
    n = len(scored)

    def mean(xs) -> float:
        return round(sum(xs) / n, 4)

    flags = [silence(ep) for ep in scored]
    return {f"{PREFIX}team_reward": mean(ep.metrics["team_reward"] for ep in scored),
            f"{PREFIX}f1": mean(ep.metrics["f1"] for ep in scored),
            f"{PREFIX}em": mean(ep.metrics["em"] for ep in scored),
            f"{PREFIX}format_error_rate": mean(f["format_error_questions"] for f in flags),
            f"{PREFIX}no_answer": mean(f["no_answer"] for f in flags)}


def team_reward_probe(workflow: str, rows: Sequence[dict], retriever: Retriever, params: Mapping[str, Any]
                      ) -> Callable[[Team], dict[str, float]]:
    """A probe: Team -> `summarize_probe` of `rows` run through `workflow`'s inference (`run_system`, as `evaluate`
    runs its rows; M-ASK answering after every turn), with the workflow sections of `params`."""
    if not rows:
        raise ValueError(f"team-reward probe of {workflow}: no questions")
    spec = SystemSpec(workflow=workflow, **(REGISTRY[workflow].probe_row if workflow in REGISTRY else {}))
    cfgs = WorkflowConfigs.from_params(params)
    if not has_team_reward(spec, cfgs):
        raise ValueError(f"team-reward probe: workflow {workflow!r} has no team reward (ragteam.rewards.team)")

    def probe(team: Team) -> dict[str, float]:
        return summarize_probe(run_system(spec, rows, team, retriever, cfgs, name=f"{workflow}_probe"))

    return probe
