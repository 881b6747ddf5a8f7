"""MAPS (the multi-agent Query, Judge and Answer team): an evaluation-only system here. Its agents train through
their own stages (`ragteam/train/maps.py`, eval.agents), not `train_joint`, so its `System` has evaluation rows only:
the `maps` row kind, whose `fixed_rounds` (Table 3) overrides `maps.fixed_rounds`."""
from __future__ import annotations

from ragteam.agents.maps_workflow import MapsConfig, run_maps
from ragteam.systems.spec import RowKind, System


def row_config(spec, cfgs) -> MapsConfig:
    """The `maps` section with the row's `fixed_rounds`, where it sets one."""
    return cfgs.maps if spec.fixed_rounds is None else cfgs.maps.model_copy(update={"fixed_rounds": spec.fixed_rounds})


ROWS = {"maps": RowKind(roles=("query_agent", "judge_agent", "answer_agent"), family="MAPS",
                        run=lambda rows, team, retriever, cfgs, spec, name: run_maps(
                            rows, team, retriever, row_config(spec, cfgs), system=name))}

SYSTEM = System(name="maps", rows=ROWS)
