"""params.yaml `joint`, validated against the registered systems: the shared sections (`systems`, `retriever`,
`ppo`, `probe`) and one `joint.<system>` per system that `train_joint` trains, each parsed with its system's own
model (`System.train_params`). `train_joint`, `warmup_joint` and `ragteam.params_check` merge and check it the same
way (`load_joint`)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, create_model

from ragteam.config import ParamsError, Strict, deep_merge, parse_section
from ragteam.systems.registry import REGISTRY
from ragteam.train.joint.params import PPOParams
from ragteam.train.probe import ProbeParams


class JointSections(Strict):
    """The sections of `joint` that are no system's."""

    systems: list[str] = Field(min_length=1)
    retriever: str                               # index dir or http(s) service the rollouts search
    ppo: dict[str, Any]                          # validated as PPOParams (with each system's overrides)
    probe: ProbeParams = ProbeParams()           # the team-reward probe on the pool's last questions (train.probe)


def joint_params_model() -> type[JointSections]:
    """params.yaml `joint`: `JointSections` and a `joint.<system>` sub-section for every registered system with a
    `train_params` model, in registry order."""
    fields: dict[str, Any] = {name: (s.train_params, s.train_params()) for name, s in REGISTRY.items()
                              if s.train_params is not None}
    return create_model("JointParams", __base__=JointSections, **fields)


def load_joint(params: dict, system: str) -> tuple[PPOParams, JointSections, BaseModel]:
    """Validate `joint` for `system`: unknown keys anywhere (joint.*, joint.ppo.*, joint.<system>.ppo.*) are errors
    naming the key. Returns the merged PPO settings (`joint.ppo` with `joint.<system>.ppo` over it), the whole
    section and the system's own sub-section."""
    jp = parse_section(params, "joint", joint_params_model())
    if system not in jp.systems:
        raise ParamsError(f"params.yaml: system {system!r} is not in joint.systems {jp.systems}")
    sp = getattr(jp, system)
    unknown = sorted(set(sp.ppo) - set(PPOParams.model_fields))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key(s) joint.{system}.ppo.{', joint.{system}.ppo.'.join(unknown)} "
                          f"(known: {', '.join(PPOParams.model_fields)})")
    base = parse_section(params, "joint.ppo", PPOParams)
    merged = deep_merge(base.model_dump(), sp.ppo)
    ppo = parse_section({"joint": {system: {"ppo": merged}}}, f"joint.{system}.ppo", PPOParams)
    return ppo, jp, sp

