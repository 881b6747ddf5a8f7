"""The registry of the systems (`ragteam.systems.<name>`) that the stages, the joint trainer's and the warm-up's
callers, evaluation, params_check and the CLI read (issue 72: "one system, one module"). A system's module builds one
`System` (`ragteam.systems.spec`): its params section, its trainer adapter (rollout, rewards, credit scope,
advantage estimator), its reward in words and its warm-up oracle player. `REGISTRY` lists them in the order the
pipeline knows them; `register` adds one (a study's or a test's own system, docs/adding-a-system.md)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragteam.agents.grammars import constrain
from ragteam.config import ParamsError
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import TeamReward
from ragteam.systems import baselines, decor, jade, maps, mask, qagent
from ragteam.systems.spec import RowKind, System
from ragteam.train.joint.system import JointSystem
from ragteam.warmup.oracle import OracleSystem

# the joint systems, then the evaluation-only ones (MAPS, whose agents train through their own stages, and the
# baselines): rows only
REGISTRY: dict[str, System] = {s.name: s for s in (mask.SYSTEM, jade.SYSTEM, decor.SYSTEM, qagent.SYSTEM, maps.SYSTEM,
                                                   *baselines.SYSTEMS)}


def register(system: System) -> System:
    """Add `system` to the registry (a name already there is an error: one module per system)."""
    if system.name in REGISTRY:
        raise ValueError(f"system {system.name!r} is already registered")
    REGISTRY[system.name] = system
    return system


def joint_names() -> list[str]:
    """The systems `train_joint` trains, sorted (what `joint.systems` may list)."""
    return sorted(n for n, s in REGISTRY.items() if s.joint is not None)


def oracle_names() -> list[str]:
    """The systems with a warm-up oracle, sorted (what `oracle_traces`, `warmup_joint`, `warmup.systems` may name)."""
    return sorted(n for n, s in REGISTRY.items() if s.oracle is not None)


def joint_system(name: str) -> System:
    """The registered system `train_joint` trains under `name`; an unknown one is a params error naming the known."""
    if name not in joint_names():
        raise ParamsError(f"joint system {name!r} is not known (known: {', '.join(joint_names())})")
    return REGISTRY[name]


def build_joint(name: str, params: dict[str, Any], retriever: Retriever) -> JointSystem:
    """What the joint trainer trains for system `name` (its first training stage, for a system of several)."""
    return joint_system(name).build_joint(params, retriever)


def oracle_system(name: str, params: dict[str, Any]) -> OracleSystem:
    """System `name`'s warm-up oracle player under `params`."""
    if name not in oracle_names():
        raise ParamsError(f"no oracle for system {name!r} (known: {', '.join(oracle_names())})")
    return REGISTRY[name].oracle(params)


def team_reward(workflow: str) -> TeamReward | None:
    """The team reward of evaluation rows of kind `workflow` (`System.team_rewards`), None where none has one."""
    for s in REGISTRY.values():
        if workflow in s.team_rewards:
            return s.team_rewards[workflow]
    return None


def grammars() -> dict[str, dict[str, str]]:
    """system -> its roles' output regexes, for the systems with grammar rows (`System.grammars`)."""
    return {n: s.grammars for n, s in REGISTRY.items() if s.grammars}


def grammar_sampling(workflow: str, sampling: Mapping, default_key: str = "default") -> dict:
    """`sampling` (llm.sampling: role -> SamplingConfig) with each of system `workflow`'s roles constrained to its
    regex; a ValueError for a workflow without grammars."""
    known = grammars()
    if workflow not in known:
        raise ValueError(f"no output grammars for workflow {workflow!r} (known: {', '.join(sorted(known))})")
    return constrain(known[workflow], sampling, default_key)


def row_kinds() -> dict[str, RowKind]:
    """Evaluation row kind (`SystemSpec.workflow`) -> how evaluate runs and scores it, for every registered system
    (`System.rows`)."""
    return {k: r for s in REGISTRY.values() for k, r in s.rows.items()}


def agent_roles() -> list[str]:
    """The roles whose trained checkpoints `eval.agents` may name, in registry order (`System.agent_roles`)."""
    return list(dict.fromkeys(r for s in REGISTRY.values() for r in s.agent_roles))


def config_sections() -> dict[str, type]:
    """params section -> the model it parses into, for every registered system with one (`System.section`)."""
    return {s.section: s.config for s in REGISTRY.values() if s.section and s.config is not None}


def frozen_role_models(cfgs: Any) -> dict[str, str]:
    """Helper role -> its own checkpoint, whatever the row, from every system that pins some
    (`System.frozen_role_models`; `cfgs`: ragteam.eval.evaluate.WorkflowConfigs)."""
    out: dict[str, str] = {}
    for s in REGISTRY.values():
        if s.frozen_role_models is not None:
            out.update(s.frozen_role_models(cfgs))
    return out


def lj_judge(cfgs: Any, team: Any) -> Any:
    """The LJ judge for rows that do not judge themselves (`eval.lj: all`): the one system that provides one
    (`System.judge`)."""
    judges = [s for s in REGISTRY.values() if s.judge is not None]
    if len(judges) != 1:
        raise ValueError(f"eval.lj: all needs exactly one registered system with an LJ judge, found "
                         f"{[s.name for s in judges]}")
    return judges[0].judge(cfgs, team)


def report_context(cfgs: Any, base_model: str, used: set[str], lj_all: bool) -> dict[str, str]:
    """The report's context lines for the systems' settings, in registry order (`System.report_context`)."""
    out: dict[str, str] = {}
    for s in REGISTRY.values():
        if s.report_context is not None:
            out.update(s.report_context(cfgs, base_model, used, lj_all))
    return out


__all__ = ["REGISTRY", "System", "agent_roles", "build_joint", "config_sections", "frozen_role_models",
           "grammar_sampling", "grammars", "joint_names", "joint_system", "lj_judge", "oracle_names", "oracle_system", "register", "report_context", "row_kinds", "team_reward"]
