"""A joint system left out of `joint.systems` is no dependency of `evaluate`: its checkpoints are not evaluate's deps
(the stage depends on `models/agents` and `models/warmup` as directories), and the rows that read them are left out
with the reason."""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragteam.config import ParamsError
from ragteam.eval.evaluate import EvalConfig, comparison_pairs, rows_without_their_stage, without_rows
from ragteam.profiles import merged_params

REPO = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())
# the default rows and the 8-question rows it leaves out (QAgent's plug-in rows read train_joint@qagent's checkpoint)
EVAL_ALL = merged_params(["extra_rows"], REPO / "params.yaml", REPO / "profiles")["eval"]


def _joint(systems):
    return {**copy.deepcopy(PARAMS["joint"]), "systems": systems}


def test_rows_reading_a_left_out_systems_checkpoints_are_dropped_and_say_why():
    ev = EvalConfig(**EVAL_ALL)
    assert rows_without_their_stage(ev, PARAMS["joint"]) == {}          # the default trains all four
    dropped = rows_without_their_stage(ev, _joint(["mask"]))
    assert set(dropped) == {"jade_trained", "jade_warmup", "decor_trained", "decor_warmup", "qagent_trained",
                            "qagent_plugin_trained", "qagent_warmup"}
    assert dropped["jade_warmup"] == ("reads models/warmup/jade, which warmup_joint@jade would write, but jade is "
                                      "not in joint.systems ['mask']")
    assert "train_joint@qagent" in dropped["qagent_plugin_trained"]
    # base-model rows of those systems stay, and MAPS (whose eval.agents also name qagent) keeps its trained row
    kept = without_rows(ev, dropped)
    assert {"jade", "decor", "qagent", "qagent_plugin", "maps", "mask_trained", "mask_warmup"} <= set(kept.systems)
    assert not set(dropped) & {x for pair in comparison_pairs(kept.systems) for x in pair}
    assert ("mask_trained", "mask_warmup") in comparison_pairs(kept.systems)


def test_an_explicit_compare_pair_naming_a_dropped_row_is_a_params_error():
    ev = EvalConfig(**{**PARAMS["eval"], "compare": [["jade_trained", "jade"], ["maps", "maps_untrained"]]})
    with pytest.raises(ParamsError, match=re.escape("eval.compare[0] = ['jade_trained', 'jade']: ['jade_trained'] "
                                                    "left out")):
        without_rows(ev, rows_without_their_stage(ev, _joint(["mask", "qagent"])))


def _evaluate_upstreams(tmp_path: Path, systems: list[str]) -> set[str]:
    tmp_path.mkdir()
    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    params = copy.deepcopy(PARAMS)
    params["joint"]["systems"] = systems
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, env=env)
    dot = subprocess.run(["dvc", "dag", "--dot", "evaluate"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert dot.returncode == 0, dot.stderr
    return set(re.findall(r'"([^"]+)" -> "evaluate"', dot.stdout))


def test_evaluate_waits_for_the_listed_joint_systems_and_names_no_other(tmp_path):
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["evaluate"]
    names = [k for k, v in PARAMS["joint"].items() if isinstance(v, dict) and k != "ppo"]
    assert not [d for d in stage["deps"] if any(d.rstrip("/").endswith(f"/{s}") for s in names)]
    assert "joint.systems" in stage["params"]                     # a changed list re-runs evaluate
    ups = _evaluate_upstreams(tmp_path / "one", ["mask"])
    assert {"train_joint@mask", "warmup_joint@mask", "train_answer", "train_query", "train_judge"} <= ups
    assert not {u for u in ups if u.split("@")[-1] in {"jade", "decor", "qagent"}}
    all_ups = _evaluate_upstreams(tmp_path / "all", PARAMS["joint"]["systems"])
    assert {f"{st}@{s}" for st in ("train_joint", "warmup_joint") for s in PARAMS["joint"]["systems"]} <= all_ups


def test_the_report_lists_the_rows_left_out_and_why(tmp_path):
    import stages.evaluate as stage
    from helpers_agents import ScriptedEngine
    from ragteam.llm import EngineConfig, EnginePool, LLMConfig
    from ragteam.agents.maps_workflow import MapsConfig
    from test_eval import _prepared

    pool = EnginePool(EngineConfig(), loader=lambda path, cfg: ScriptedEngine(lambda role, m: "ans0"))
    ev = EvalConfig(n_questions=1, systems={"native": {"workflow": "native"}})
    why = {"jade_trained": "reads models/agents/jade, which train_joint@jade would write, but jade is not in "
                           "joint.systems ['mask']"}
    out = tmp_path / "out"
    stage.run(LLMConfig(), MapsConfig(), ev, benchmarks=_prepared(tmp_path, n=1), results=out / "res",
              report=out / "eval.md", figures=out / "fig", differences=out / "compare.json", engines=pool,
              left_out=why)
    md = (out / "eval.md").read_text()
    assert f"jade_trained ({why['jade_trained']})" in md and "rows left out" in md
