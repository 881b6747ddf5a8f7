"""studies/agents_heldout/agents_heldout.py: a thin wrapper around the evaluate_agents stage (the scoring itself is tested in
test_eval_agents.py)."""
import importlib.util
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("agents_heldout", REPO / "studies" / "agents_heldout" / "agents_heldout.py")
heldout = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(heldout)


def test_options_override_the_params_section():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    cfg = heldout.config(params, 7, "judge, answer")
    assert cfg.n_questions == 7 and cfg.agents == ["judge", "answer"]
    assert cfg.retriever == params["eval_agents"]["retriever"]
    assert heldout.config(params, None, None).n_questions == params["eval_agents"]["n_questions"]
    with pytest.raises(SystemExit, match=r"unknown \['planner'\]"):
        heldout.config(params, None, "planner")


def test_writes_the_stage_outputs_where_asked(tmp_path, monkeypatch):
    import stages.evaluate_agents as stage

    seen = {}
    monkeypatch.setattr(stage, "run", lambda llm, maps_cfg, cfg, trained, **kw: seen.update(cfg=cfg, trained=trained,
                                                                                           **kw))
    monkeypatch.chdir(REPO)
    heldout.main(["--n", "3", "--agents", "query", "--out", str(tmp_path / "x.json")])
    assert seen["metrics"] == tmp_path / "x.json" and seen["report"] == tmp_path / "x.md"
    assert seen["questions"] == tmp_path / "x.questions.json"
    assert seen["cfg"].n_questions == 3 and seen["cfg"].agents == ["query"]
    assert seen["trained"]["query"] == "models/agents/query"
