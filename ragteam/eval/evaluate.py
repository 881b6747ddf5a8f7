"""Evaluation: run configured systems on benchmark questions, score Episodes, aggregate accuracy and cost.

Scores are FlashRAG's (`ragteam.eval.metrics`): EM, F1 and accuracy (gold contained in the prediction), each the
max over the golden answers; summaries report them in percent, like MAPS Table 1. Cost is per question: LLM calls,
prompt and completion tokens, retrieval calls and wall seconds (see `ragteam.agents.core`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import Field

from ragteam.agents.baselines import ROLE as GENERATOR, BaselineConfig, run_iter_retgen, run_native, run_standard_rag
from ragteam.agents.debate import run_debate
from ragteam.agents.mask import ROLES as MASK_ROLES
from ragteam.agents.mask_workflow import MaskConfig, run_mask
from ragteam.agents.maps_workflow import MapsConfig, run_maps
from ragteam.config import Strict
from ragteam.eval.metrics import answer_metrics
from ragteam.llm import EnginePool, SamplingConfig, Team
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever

Workflow = Literal["native", "standard_rag", "iter_retgen", "drag", "maps", "mask"]
MapsRole = Literal["query_agent", "judge_agent", "answer_agent"]
ROLES = {"native": (GENERATOR,), "standard_rag": (GENERATOR,), "iter_retgen": (GENERATOR,),
         "drag": ("proponent", "opponent", "moderator", "answer_agent"),
         "maps": ("query_agent", "judge_agent", "answer_agent"), "mask": MASK_ROLES}
SCORE_KEYS = ("em", "f1", "acc")
COST_KEYS = ("llm_calls", "prompt_tokens", "completion_tokens", "tokens", "retrieval_calls", "seconds")


class SystemSpec(Strict):
    """One row of the results table."""

    workflow: Workflow
    trained_agents: bool = False              # maps: roles listed in eval.agents use those checkpoints
    base_roles: list[MapsRole] = Field(default_factory=list)  # ... except these, which use the base model (Table 2)
    fixed_rounds: int | None = Field(None, ge=1)  # maps: override maps.fixed_rounds (Table 3)
    agent_model: str | None = None            # every role of the system on this checkpoint (a joint-trained policy)


class EvalConfig(Strict):
    """The `eval` section of params.yaml."""

    benchmarks: list[str] | Literal["all"] = "all"  # names under data/prepared/benchmarks; "all": every file there
    n_questions: int = Field(20, ge=1)              # first n questions of each benchmark
    retriever: str = "bm25"                          # which index the retrieval systems search
    systems: dict[str, SystemSpec]
    agents: dict[MapsRole, str] = Field(default_factory=dict)  # trained MAPS agent checkpoints (by role)
    baselines: BaselineConfig = BaselineConfig()


def role_models(spec: SystemSpec, agents: Mapping[str, str]) -> dict[str, str]:
    """role -> checkpoint for the roles that do not use the base model."""
    if spec.agent_model is not None:
        return {role: spec.agent_model for role in ROLES[spec.workflow]}
    if not spec.trained_agents:
        return {}
    return {role: path for role, path in agents.items() if role not in spec.base_roles}


def make_team(engines: EnginePool, spec: SystemSpec, agents: Mapping[str, str], base_model: str,
              sampling: Mapping[str, SamplingConfig]) -> Team:
    return engines.team(role_models(spec, agents), base_model, sampling)


def run_system(spec: SystemSpec, rows: Sequence[dict], team: Team, retriever: Retriever | None, maps_cfg: MapsConfig,
               baselines: BaselineConfig, name: str, mask_cfg: MaskConfig | None = None) -> list[Episode]:
    """Run one system's workflow on `rows` (all questions batched together) and score the Episodes."""
    if spec.workflow != "native" and retriever is None:
        raise ValueError(f"system {name!r} ({spec.workflow}) needs a retriever")
    if spec.workflow == "native":
        eps = run_native(rows, team, system=name)
    elif spec.workflow == "standard_rag":
        eps = run_standard_rag(rows, team, retriever, baselines, system=name)
    elif spec.workflow == "iter_retgen":
        eps = run_iter_retgen(rows, team, retriever, baselines, system=name)
    elif spec.workflow == "drag":
        eps = run_debate(rows, team, retriever, maps_cfg.debate, answer=True, system=name)
    elif spec.workflow == "mask":
        eps = run_mask(rows, team, retriever, mask_cfg or MaskConfig(), system=name)
    else:
        cfg = maps_cfg if spec.fixed_rounds is None else maps_cfg.model_copy(update={"fixed_rounds": spec.fixed_rounds})
        eps = run_maps(rows, team, retriever, cfg, system=name)
    return score_episodes(eps)


def score_episodes(episodes: Iterable[Episode]) -> list[Episode]:
    out = []
    for ep in episodes:
        if ep.golden_answers:  # questions without golds (e.g. `ragteam ask`) are not scored
            ep.metrics = answer_metrics(ep.final_answer or "", ep.golden_answers)
        out.append(ep)
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def summarize(episodes: Sequence[Episode]) -> dict[str, float]:
    """Scores in percent and cost per question, averaged over the episodes."""
    out: dict[str, float] = {"n": float(len(episodes))}
    for k in SCORE_KEYS:
        out[k] = round(100 * _mean([ep.metrics.get(k, 0.0) for ep in episodes]), 2)
    for k in COST_KEYS:
        vals = [ep.cost.get("prompt_tokens", 0.0) + ep.cost.get("completion_tokens", 0.0) if k == "tokens"
                else ep.cost.get(k, 0.0) for ep in episodes]
        out[k] = round(_mean(vals), 3)
    calls = [c for ep in episodes for c in ep.calls]
    out["format_error_rate"] = round(_mean([c.format_error is not None for c in calls]), 4)
    if any("turns" in ep.meta for ep in episodes):  # search turns per question (M-ASK's efficiency figure)
        out["turns"] = round(_mean([float(ep.meta.get("turns", 0)) for ep in episodes]), 3)
    return out


def with_average(per_benchmark: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Add "avg": the unweighted mean over benchmarks of every key (the paper averages datasets equally)."""
    out = {b: dict(v) for b, v in per_benchmark.items()}
    if per_benchmark:
        keys = next(iter(per_benchmark.values())).keys()
        out["avg"] = {k: round(_mean([v[k] for v in per_benchmark.values()]), 3) for k in keys}
        out["avg"]["n"] = sum(v["n"] for v in per_benchmark.values())
    return out
