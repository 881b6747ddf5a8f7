"""MAPS (the multi-agent Query, Judge and Answer team): an evaluation-only system here. Its agents train through
their own stages (`ragteam/train/maps.py`, eval.agents), not `train_joint`, so its `System` has evaluation rows only:
the `maps` row kind, whose `fixed_rounds` (Table 3) overrides `maps.fixed_rounds`."""
from __future__ import annotations

from typing import Any

from ragteam.agents.maps_workflow import MapsConfig, run_maps
from ragteam.config import parse_section
from ragteam.systems.spec import RowKind, System


def row_config(spec, cfgs) -> MapsConfig:
    """The `maps` section with the row's `fixed_rounds`, where it sets one."""
    return cfgs.maps if spec.fixed_rounds is None else cfgs.maps.model_copy(update={"fixed_rounds": spec.fixed_rounds})


ROLES = ("query_agent", "judge_agent", "answer_agent")
ROWS = {"maps": RowKind(roles=ROLES, family="MAPS", ablations=True,
                        run=lambda rows, team, retriever, cfgs, spec, name: run_maps(
                            rows, team, retriever, row_config(spec, cfgs), system=name))}



def report_context(cfgs, base_model: str, used: set[str], lj_all: bool) -> dict[str, str]:
    """The report's MAPS line (always: MAPS is the project's core)."""
    m = cfgs.maps
    return {"MAPS": f"max_rounds {m.max_rounds}, top_k {m.top_k}, fixed_rounds {m.fixed_rounds}, max_chunks "
                    f"{m.max_chunks}"}


SYSTEM = System(name="maps", section="maps", config=MapsConfig, rows=ROWS, agent_roles=ROLES,
                report_context=report_context)


def config(params: dict[str, Any]) -> MapsConfig:
    """The `maps` section of `params`, validated: what the MAPS stages (synthesis, agents, judge) read."""
    return parse_section(params, SYSTEM.section, MapsConfig)
