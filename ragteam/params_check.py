"""Every section of a params file checked against the model its stage parses it with, before anything runs.

A stage validates its own sections when it starts (`ragteam.config.parse_section`); a bad value deep in params.yaml
would otherwise surface only when the run reaches that stage, maybe an hour in. `check_params` parses every section
with the same models, and each joint system's merged settings the way `train_joint` and `warmup_joint` merge them,
so `ragteam flow run` (dry runs too) and `ragteam profile flags / apply` refuse a bad value at once, naming the key.
The models live beside their stages (`stages/`, `flows/`): run it from the checkout, as those commands do.
"""
from __future__ import annotations

import importlib
from typing import Any

from ragteam.config import ParamsError, parse_section

# params.yaml section -> "module:Model" its stage parses it with
SECTIONS: dict[str, str] = {
    "models": "stages.prepare_models:ModelsParams",
    "data": "stages.prepare_data:DataParams",
    "prefect": "flows.pipeline:PrefectParams",
    "retrieval": "ragteam.retrieval.config:RetrievalParams",
    "llm": "ragteam.llm:LLMConfig",
    "maps": "ragteam.agents.maps_workflow:MapsConfig",
    "jade": "ragteam.agents.jade_workflow:JadeConfig",
    "qagent": "ragteam.agents.qagent_workflow:QAgentConfig",
    "decor": "ragteam.agents.decor_workflow:DecorConfig",
    "mask": "ragteam.agents.mask_workflow:MaskConfig",
    "eval": "ragteam.eval.evaluate:EvalConfig",
    "eval_agents": "ragteam.eval.agents:EvalAgentsConfig",
    "synthesize": "stages.synthesize:SynthesizeParams",
    "train_answer": "stages.common:TrainAnswerParams",
    "train_query": "stages.common:TrainQueryParams",
    "label_judge": "stages.common:LabelJudgeParams",
    "train_judge": "stages.common:TrainJudgeParams",
    "warmup": "ragteam.warmup.sft:WarmupParams",
    "openrlhf": "stages.common:OpenRLHFParams",
}


def _model(ref: str) -> type:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def check_params(params: dict[str, Any], source: str = "params.yaml") -> None:
    """Raise ParamsError naming a bad section's keys and values, or an unknown joint system. Sections the file does not
    have are left to the stages that need them (each names a missing section when it starts)."""
    for section, ref in SECTIONS.items():
        if section in params:
            parse_section(params, section, _model(ref), source)
    if "joint" not in params:
        return
    from stages.train_joint import JointParams, load_joint

    systems = (params["joint"] or {}).get("systems") or []
    known = sorted(k for k in JointParams.model_fields if k not in ("systems", "retriever", "ppo"))
    unknown = [s for s in systems if s not in known]
    if unknown:
        raise ParamsError(f"{source}: joint.systems: unknown system(s) {unknown} (known: {', '.join(known)})")
    warm = parse_section(params, "warmup", _model(SECTIONS["warmup"]), source) if "warmup" in params else None
    for s in systems:
        load_joint(params, s)
        if warm is not None:
            warm.for_system(s)
