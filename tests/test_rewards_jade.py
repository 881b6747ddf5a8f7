"""JADE rewards (Eq. 6-8) against hand-computed values, and the JADE systems in evaluation (summaries, params)."""
from pathlib import Path

import pytest
import yaml
from helpers_agents import KeywordRetriever, ScriptedEngine
from test_agents_jade import CASE1_Q, PASSAGES, case_reply, case_rows

from ragteam.config import ParamsError, deep_merge, parse_section
from ragteam.eval import report
from ragteam.systems.jade import roles as jade
from ragteam.systems.jade.workflow import JadeConfig, run_jade
from ragteam.eval.evaluate import (EvalConfig, SystemSpec, WorkflowConfigs, role_models, run_system, summarize,
                                   with_average)
from ragteam.llm import Team
from ragteam.records import AgentCall, Episode
from ragteam.systems.jade.rewards import (JadeRewardConfig, assign_rewards, format_reward, global_reward,
                                          normalized_cost)

REPO = Path(__file__).resolve().parents[1]


def _episode(answer: str, golds: list[str], errors: list[bool], rounds: int, retrievals: int) -> Episode:
    ep = Episode(question_id="q", question="?", golden_answers=golds, final_answer=answer)
    for e in errors:
        ep.add_call(AgentCall(role="jade_ag", prompt=[], format_error="bad" if e else None))
    ep.meta["workflow"] = {"rounds": rounds, "retrievals": retrievals}
    return ep


def test_eq6_global_reward_hand_computed():
    cfg = JadeRewardConfig(alpha=0.3, beta=0.6, cost_max=3)
    assert global_reward(1.0, 3, 2, cfg) == pytest.approx(1 - 0.3 * 1 - 0.6 * 2 / 3)          # 0.3
    assert global_reward(0.5, 1, 1, JadeRewardConfig(alpha=0.1, beta=0.2)) == pytest.approx(0.5 - 0.1 / 3 - 0.2 / 3)
    assert global_reward(0.5, 7, 9, cfg) == pytest.approx(0.5 - 0.3 - 0.6)   # costs above M are clipped to 1
    assert global_reward(0.8, 4, 4, JadeRewardConfig(alpha=0.5, beta=0.5, cost_max=5)) == pytest.approx(0.0)
    assert global_reward(0.8, 5, 0, JadeRewardConfig()) == 0.8               # α = β = 0: R_global = F1
    assert normalized_cost(0, 3) == 0 and normalized_cost(2, 4) == 0.5 and normalized_cost(10, 4) == 1.0


def test_eq7_format_penalty_paper_and_official_values():
    bad, good = AgentCall(role="r", prompt=[], format_error="x"), AgentCall(role="r", prompt=[])
    assert format_reward(bad, JadeRewardConfig()) == -1.0 and format_reward(good, JadeRewardConfig()) == 0.0
    assert format_reward(bad, JadeRewardConfig(format_penalty=2.0)) == -2.0     # official code


def test_eq8_global_reward_on_the_terminal_call_only():
    # "Fred Astaire" vs gold "Fred Astaire American dancer": P = 1, R = 2/4 -> F1 = 2/3
    ep = _episode("Fred Astaire", ["Fred Astaire American dancer"], [False, True, False, False], 3, 2)
    r = assign_rewards(ep, JadeRewardConfig(alpha=0.3, beta=0.6))
    assert r == pytest.approx(2 / 3 - 0.3 - 0.4)
    assert [c.reward for c in ep.calls] == pytest.approx([0.0, -1.0, 0.0, 2 / 3 - 0.7])
    assert ep.meta["workflow"]["r_global"] == pytest.approx(r)
    # a malformed terminal call gets both its penalty and R_global; yes / no golds only match exactly
    ep = _episode("no", ["yes"], [False, True], 1, 1)
    assign_rewards(ep, JadeRewardConfig(beta=0.3, format_penalty=2.0))
    assert [c.reward for c in ep.calls] == pytest.approx([0.0, -2.0 + 0 - 0.1])
    with pytest.raises(ValueError, match="no golden answers"):
        assign_rewards(_episode("a", [], [False], 1, 0), JadeRewardConfig())
    with pytest.raises(ValueError, match="not a JADE episode"):
        assign_rewards(Episode(question_id="q", question="?", golden_answers=["a"],
                               calls=[AgentCall(role="x", prompt=[])]), JadeRewardConfig())


def test_rewards_on_replayed_case_studies():
    c1, c2 = run_jade(case_rows(), Team(ScriptedEngine(case_reply)), KeywordRetriever(PASSAGES), JadeConfig(top_k=5))
    cfg = JadeRewardConfig(alpha=0.2, beta=0.1)
    assert assign_rewards(c1, cfg) == pytest.approx(1 - 0.2 * 3 / 3 - 0.1 * 2 / 3)      # T = 3, N_ret = 2, F1 = 1
    assert assign_rewards(c2, cfg) == pytest.approx(1 - 0.2 / 3 - 0.1 / 3)              # T = 1, N_ret = 1
    assert [c.reward for c in c1.calls[:-1]] == [0.0] * 9 and c1.calls[-1].role == jade.AS
    assert c2.calls[-1].role == jade.AG and c2.calls[-1].reward == pytest.approx(1 - 0.1)


# ---- evaluation -------------------------------------------------------------------------------------------------

def test_jade_system_reports_its_workflow_figures_and_r_global():
    spec = SystemSpec(workflow="jade")
    eps = run_system(spec, case_rows(), Team(ScriptedEngine(case_reply)), KeywordRetriever(PASSAGES),
                     WorkflowConfigs(jade=JadeConfig(top_k=5, reward={"alpha": 0.3, "beta": 0.3})), "jade")
    assert [e.metrics["f1"] for e in eps] == [1.0, 1.0] and all(c.reward is not None for e in eps for c in e.calls)
    s = summarize(eps)
    assert s["f1"] == 100.0 and s["rounds"] == 2.0 and s["retrievals"] == 1.5 and s["ds_calls"] == 1.0
    assert s["plans"] == 2.0 and s["plans_decompose"] == 0.5 and s["decomposed"] == 0.5
    assert s["r_global"] == pytest.approx((1 - 0.3 - 0.2) / 2 + (1 - 0.1 - 0.1) / 2, abs=1e-4)
    assert s["max_rounds_hit"] == 0.0
    assert with_average({"a": s, "b": s})["avg"]["rounds"] == 2.0
    plain = summarize([Episode(question_id="q", question="?", golden_answers=["a"])])
    assert "rounds" not in plain and "r_global" not in plain                    # other systems lack them


def test_trained_jade_puts_every_role_on_one_checkpoint():
    assert role_models(SystemSpec(workflow="jade", model="models/agents/jade"), {}) == dict.fromkeys(
        jade.ROLES, "models/agents/jade")
    assert role_models(SystemSpec(workflow="jade"), {"answer_agent": "m"}) == {}


def test_shipped_params_and_paper_profile_parse():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    cpu = parse_section(params, "jade", JadeConfig)
    assert cpu.top_k == 3 and cpu.passage_words == 15 and cpu.reward.format_penalty == 1.0
    ev = parse_section(params, "eval", EvalConfig)
    assert ev.systems["jade"].workflow == "jade" and ev.systems["jade_trained"].model == "models/agents/jade"
    assert set(jade.ROLES) <= set(params["llm"]["sampling"])
    paper = parse_section(deep_merge(params, yaml.safe_load((REPO / "profiles" / "paper.yaml").read_text())), "jade",
                          JadeConfig)
    assert paper.top_k == 5 and paper.passage_words is None and paper.reward.cost_max == 3
    with pytest.raises(ParamsError, match=r"jade\.reward\.alpha"):
        parse_section({"jade": {"reward": {"alpha": -1}}}, "jade", JadeConfig)
    with pytest.raises(ParamsError, match=r"jade\.max_round"):
        parse_section({"jade": {"max_round": 3}}, "jade", JadeConfig)


def test_report_shows_the_workflow_figures_of_jade_systems_only():
    eps = run_system(SystemSpec(workflow="jade"), case_rows(), Team(ScriptedEngine(case_reply)),
                     KeywordRetriever(PASSAGES), WorkflowConfigs(jade=JadeConfig(top_k=5)), "jade")
    plain = summarize([Episode(question_id="q", question="?", golden_answers=["a"])])
    metrics = {"native": with_average({"hotpotqa": plain}), "jade": with_average({"hotpotqa": summarize(eps)})}
    lines = report.workflow_table(metrics).splitlines()
    assert len(lines) == 3 and lines[0].startswith("| Method | Rounds/q | Retrievals/q | DS calls/q | DS/round")
    # 2 rounds/q, 1.5 retrievals/q, 1 DS call/q -> 0.5 per round, 1 of 4 plans decomposes, 1 of 2 questions
    assert lines[2] == "| jade | 2.00 | 1.50 | 1.00 | 0.50 | 25.0 | 50.0 | 0.0 | 1.000 |"
    md = report.report_markdown(metrics, ["hotpotqa"], {})
    assert "Workflow figures (JADE App. D)" in md and "| jade | 2.00 |" in md
    assert report.workflow_table({"native": metrics["native"]}) == ""


def test_cli_ask_runs_jade(monkeypatch, ask_params):
    from typer.testing import CliRunner

    import ragteam.llm.hf
    import ragteam.retrieval
    from ragteam.cli import app

    class Fake(ScriptedEngine):
        def __init__(self, path, cfg):
            super().__init__(case_reply)

    monkeypatch.setattr(ragteam.llm.hf, "HFEngine", Fake)
    monkeypatch.setattr(ragteam.retrieval, "open_retriever", lambda index: KeywordRetriever(PASSAGES))
    res = CliRunner().invoke(app, ["ask", CASE1_Q, "--system", "jade", "--params", str(ask_params),
                                   "--calls", "--index", "idx"])
    assert res.exit_code == 0, res.output
    assert "A: American" in res.output and "3 round(s), answered" in res.output
    assert "[jade_planner] '<workflow>QDS</workflow>' -> ['QDS']" in res.output
    assert res.output.count("[jade_") == 10


def test_evaluate_stage_runs_jade_and_reports_its_figures(tmp_path):
    import sys

    sys.path.insert(0, str(REPO))
    import stages.evaluate as stage
    from ragteam.io import write_jsonl
    from ragteam.agents.maps_workflow import MapsConfig
    from ragteam.llm import EngineConfig, EnginePool, LLMConfig

    bench = tmp_path / "benchmarks"
    write_jsonl(bench / "hotpotqa.jsonl", case_rows())
    pool = EnginePool(EngineConfig(), loader=lambda path, cfg: ScriptedEngine(case_reply))
    ev = EvalConfig(n_questions=2, systems={"jade": {"workflow": "jade"}})
    metrics = stage.run(LLMConfig(), WorkflowConfigs(jade=JadeConfig(top_k=5, reward={"beta": 0.3})), ev,
                        benchmarks=bench, results=tmp_path / "res", report=tmp_path / "r.md", figures=tmp_path / "fig",
                        retriever=KeywordRetriever(PASSAGES), engines=pool, differences=tmp_path / "compare.json")
    avg = metrics["jade"]["avg"]
    assert avg["f1"] == 100.0 and avg["rounds"] == 2.0 and avg["r_global"] == pytest.approx(1 - 0.3 * 1.5 / 3)
    md = (tmp_path / "r.md").read_text()
    assert "| JADE | max_rounds 5, top_k 5, passage_words None, serial_rewrite True; reward α 0.0, β 0.3" in md
    assert "| jade | 2.00 | 1.50 | 1.00 | 0.50 | 25.0 | 50.0 | 0.0 | 0.850 |" in md
