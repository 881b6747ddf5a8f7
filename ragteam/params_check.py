"""Every section of a params file checked against the model its stage parses it with, before anything runs.

A stage validates its own sections when it starts (`ragteam.config.parse_section`); a bad value deep in params.yaml
would otherwise surface only when the run reaches that stage, maybe an hour in. `check_params` parses every section
with the same models, and each joint system's merged settings the way `train_joint` and `warmup_joint` merge them,
so `ragteam flow run` (dry runs too) and `ragteam profile flags / apply` refuse a bad value at once, naming the key.
The models live beside their stages (`stages/`): run it from the checkout, as those commands do; a section whose
stage module this checkout lacks is left to that stage. `prefect` is the flow's own (`flows.pipeline`
`load_prefect_params`, which `flow run` calls before planning), so profiles need not import Prefect.
"""
from __future__ import annotations

import importlib
from typing import Any

from ragteam.config import ParamsError, parse_section

# params.yaml section -> "module:Model" its stage parses it with; the registered systems' own sections are theirs
# (`System.section`, `System.config`: `system_sections`)
SECTIONS: dict[str, str] = {
    "models": "stages.prepare_models:ModelsParams",
    "data": "stages.prepare_data:DataParams",
    "retrieval": "ragteam.retrieval.config:RetrievalParams",
    "llm": "ragteam.llm:LLMConfig",
    "eval": "ragteam.eval.evaluate:EvalConfig",
    "eval_agents": "ragteam.eval.agents:EvalAgentsConfig",
    "synthesize": "stages.synthesize:SynthesizeParams",
    "train_answer": "stages.common:TrainAnswerParams",
    "train_query": "stages.common:TrainQueryParams",
    "label_judge": "stages.common:LabelJudgeParams",
    "train_judge": "stages.common:TrainJudgeParams",
    "warmup": "ragteam.systems.warmup:WarmupSection",
    "openrlhf": "stages.common:OpenRLHFParams",
}


def _model(ref: str) -> type | None:
    """The model class, or None where this checkout has no such stage module (another DVC project's `stages/`)."""
    module, _, name = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def system_sections() -> dict[str, type]:
    """params.yaml section -> the model its system parses it with, for every registered system that has one."""
    from ragteam.systems.registry import config_sections

    return config_sections()


def check_params(params: dict[str, Any], source: str = "params.yaml") -> None:
    """Raise ParamsError naming a bad section's keys and values, or an unknown joint system. Sections the file does not
    have are left to the stages that need them (each names a missing section when it starts)."""
    for section, ref in SECTIONS.items():
        if section in params and (model := _model(ref)) is not None:
            parse_section(params, section, model, source)
    for section, model in system_sections().items():
        if section in params:
            parse_section(params, section, model, source)
    if "joint" not in params:
        return
    from ragteam.systems.registry import joint_names
    from ragteam.systems.params import load_joint

    systems = (params["joint"] or {}).get("systems") or []
    if not isinstance(systems, list):
        raise ParamsError(f"{source}: joint.systems must be a list of system names, got {systems!r}")
    known = joint_names()     # the registry's: joint.probe, .ppo, .retriever are sections, not systems
    unknown = [s for s in systems if s not in known]
    if unknown:
        raise ParamsError(f"{source}: joint.systems: unknown system(s) {unknown} (known: {', '.join(known)})")
    warm_model = _model(SECTIONS["warmup"])
    warm = parse_section(params, "warmup", warm_model, source) if "warmup" in params and warm_model else None
    for s in systems:
        load_joint(params, s)
        if warm is not None:
            warm.for_system(s)
