"""DECOR in evaluation: the `decor` system, the LJ column (rules / LLM judge switch), params and the paper profile,
`ragteam ask --system decor`; and once, the real SmolLM2 through the whole workflow."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from helpers_agents import Bm25Retriever, KeywordRetriever, ScriptedEngine, smollm2_engine

from ragteam.agents.maps_workflow import MapsConfig
from ragteam.config import ParamsError, deep_merge, load_params, parse_section
from ragteam.data.formats import load_qa
from ragteam.eval.evaluate import EvalConfig, SystemSpec, WorkflowConfigs, make_team, role_models
from ragteam.io import write_jsonl
from ragteam.llm import EngineConfig, EnginePool, LLMConfig, Team
from ragteam.profiles import check_keys, load_profile
from ragteam.records import read_episodes
from ragteam.systems.decor import roles as decor
from ragteam.systems.decor.rewards import RuleJudge, decor_rewards
from ragteam.systems.decor.workflow import DecorConfig, run_decor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import stages.evaluate as stage  # noqa: E402


def reply(role, m):
    """Every question 'What is qIr0 ?' has gold 'ansI'; DECOR answers right for even I; the judge says YES iff the
    prediction is the reference (so LJ equals EM here)."""
    text = m[-1]["content"]
    if role == "decor_judge":
        if "Prediction:" not in text:      # a role verdict (Appendix B.2-B.4: the rewards' R_role): every role did well
            return "YES"
        pred, ref = (re.findall(rf"^{k}: (.*)$", text, re.MULTILINE)[-1] for k in ("Prediction", "Reference Answer"))
        return "YES" if pred == ref else "NO"
    i = int(re.search(r"q(\d+)r0", text).group(1))
    if role == "decor_planner":
        return ("<think>x</think><search>None</search>" if "Search 1:" in text
                else f"<think>x</think><search>q{i}r0</search>")
    if role == "decor_filter":
        return f"<think>x</think><filter>text q{i}r0</filter>"
    if role == "decor_answerer":
        return f"<think>x</think><answer>{'ans%d' % i if i % 2 == 0 else 'nope'}</answer>"
    return {"query_agent": f"q{i}r1", "judge_agent": "Sufficient Information"}.get(role, f"ans{i}")


def _bench(tmp_path, n=2):
    bench = tmp_path / "benchmarks"
    write_jsonl(bench / "hotpotqa.jsonl", [{"id": f"h{i}", "question": f"What is q{i}r0 ?",
                                            "golden_answers": [f"ans{i}"]} for i in range(n)])
    return bench


def _run(tmp_path, ev: EvalConfig, decor_cfg: DecorConfig):
    loads = []
    engine = ScriptedEngine(reply)
    pool = EnginePool(EngineConfig(), loader=lambda path, cfg: loads.append(path) or engine)
    ret = KeywordRetriever([(f"T{i}", f"text q{i}r0") for i in range(4)])
    cfgs = WorkflowConfigs(maps=MapsConfig(max_rounds=1, top_k=1), decor=decor_cfg)
    metrics = stage.run(LLMConfig(), cfgs, ev, benchmarks=_bench(tmp_path), results=tmp_path / "res",
                        report=tmp_path / "eval.md", figures=tmp_path / "fig", retriever=ret, engines=pool,
                        differences=tmp_path / "compare.json")
    return metrics, loads, engine


def test_evaluate_runs_decor_with_lj_from_the_rule_judge(tmp_path):
    ev = EvalConfig(n_questions=2, systems={"maps": {"workflow": "maps"}, "decor": {"workflow": "decor"}})
    metrics, loads, engine = _run(tmp_path, ev, DecorConfig(t_max=2, top_k=1))
    a = metrics["decor"]["avg"]
    assert a["em"] == 50.0 and a["lj"] == 50.0 and a["retrieval_calls"] == 1.0 and a["llm_calls"] == 4.0
    assert "lj" not in metrics["maps"]["avg"] and "decor_judge" not in [r for r, _ in engine.log]
    eps = read_episodes(tmp_path / "res" / "decor" / "hotpotqa.jsonl")
    assert [e.metrics["lj"] for e in eps] == [1.0, 0.0] and eps[0].meta["stop_reason"] == "planner_stop"
    md = (tmp_path / "eval.md").read_text()
    assert "| Avg Acc | Avg LJ | Team reward ×100 | No answer % | Format error q % | LLM calls/q |" in md
    assert re.search(r"\| maps \|.*\| – \|", md) and "| LJ judge | rules (a gold answer contained" in md
    assert loads == ["models/llm"]


def test_llm_judge_switch_scores_every_system_on_the_judge_model(tmp_path):
    ev = EvalConfig(n_questions=2, lj="all", systems={"native": {"workflow": "native"},
                                                      "decor": {"workflow": "decor"}})
    metrics, loads, engine = _run(tmp_path, ev, DecorConfig(t_max=1, top_k=1, judge="llm", judge_model="models/j"))
    assert metrics["native"]["avg"]["lj"] == 100.0 and metrics["decor"]["avg"]["lj"] == 50.0
    assert sorted(set(loads)) == ["models/j", "models/llm"]
    # one batched judge call per system: native's B.1 verdicts; DECOR's B.1 and its role verdicts (its training
    # reward, reported as the team reward) in the same pass: 2 questions x (LJ + planner, filter, answerer)
    assert [n for r, n in engine.log if r == "decor_judge"] == [2, 8]
    assert "team_reward" in metrics["decor"]["avg"] and "team_reward" not in metrics["native"]["avg"]
    ep = read_episodes(tmp_path / "res" / "native" / "hotpotqa.jsonl")[0]
    assert ep.meta["judge_calls"][0]["parsed"] == "YES" and ep.cost["llm_calls"] == 1   # judge is not system cost


def test_make_team_frozen_roles_and_trained_decor():
    agents = {"answer_agent": "models/agents/answer", "decor_planner": "models/agents/decor",
              "decor_filter": "models/agents/decor", "decor_answerer": "models/agents/decor"}
    trained = SystemSpec(workflow="decor", trained_agents=True, base_roles=["decor_filter"])
    assert role_models(trained, agents)["decor_planner"] == "models/agents/decor"
    assert "decor_filter" not in role_models(trained, agents)
    paths = []
    pool = EnginePool(EngineConfig(), loader=lambda p, cfg: paths.append(p) or ScriptedEngine(reply))
    team = make_team(pool, trained, agents, "models/llm", {},
                     DecorConfig(judge_model="models/judge", summarizer_model="models/sum").frozen_roles())
    for role in ("decor_planner", "decor_filter", "decor_summarizer", "decor_judge"):
        team.engine(role)
    assert paths == ["models/agents/decor", "models/llm", "models/sum", "models/judge"]
    with pytest.raises(ValueError):
        SystemSpec(workflow="decor", base_roles=["decor_judge"])


def test_params_sections_and_paper_profile():
    params = load_params(REPO / "params.yaml")
    cfg = parse_section(params, "decor", DecorConfig)
    ev = parse_section(params, "eval", EvalConfig)
    assert ev.systems["decor"].workflow == "decor" and ev.systems["decor_trained"].model == "models/agents/decor"
    assert ev.agents["decor_planner"] == "models/agents/decor" and cfg.judge == "rules"
    llm = parse_section(params, "llm", LLMConfig)
    assert all(r in llm.sampling for r in (*decor.POLICY_ROLES, decor.SUMMARIZER, "decor_judge"))
    paper = load_profile("paper", REPO / "profiles")
    check_keys(params, paper)
    p = parse_section(deep_merge(params, paper), "decor", DecorConfig)
    assert (p.t_max, p.top_k, p.group_size, p.reward.lam, p.reward.alpha, p.judge) == (4, 5, 8, 0.5, 0.6, "llm")
    assert p.reward.beta_value == pytest.approx(0.4)
    bad = deep_merge(params, {"decor": {"dynamic_sampling": {"low": 1.0, "high": 0.5}}})
    with pytest.raises(ParamsError, match="decor.dynamic_sampling"):
        parse_section(bad, "decor", DecorConfig)
    with pytest.raises(ParamsError, match="decor.tmax"):
        parse_section(deep_merge(params, {"decor": {"tmax": 3}}), "decor", DecorConfig)


def test_cli_ask_decor_prints_every_call(monkeypatch, ask_params):
    from typer.testing import CliRunner

    import ragteam.llm.hf
    import ragteam.retrieval
    from ragteam.cli import app

    class Fake(ScriptedEngine):
        def __init__(self, path, cfg):
            super().__init__(reply)

    monkeypatch.setattr(ragteam.llm.hf, "HFEngine", Fake)
    monkeypatch.setattr(ragteam.retrieval, "open_retriever",
                        lambda index: KeywordRetriever([("T0", "text q0r0"), ("T1", "text q1r0")]))
    res = CliRunner().invoke(app, ["ask", "What is q0r0 ?", "--system", "decor", "--calls",
                                   "--params", str(ask_params), "--index", "idx"])
    assert res.exit_code == 0, res.output
    assert "A: ans0" in res.output and "1 round(s), planner_stop" in res.output
    assert "[decor_planner]" in res.output and "-> {'action': 'search', 'query': 'q0r0'}" in res.output
    assert "[decor_filter]" in res.output and "[decor_answerer]" in res.output


@pytest.mark.slow
def test_smollm2_runs_decor_end_to_end(smollm2_dir, shared_data):
    """The real SmolLM2-135M through Algorithm 1 on one HotpotQA question over the shared mini-Wikipedia: nothing
    crashes whatever it writes; malformed outputs are recorded as format errors and the fallbacks apply."""
    rows = [json.loads(x) for x in (shared_data / "corpus" / "mini_wiki.jsonl").read_text().splitlines()]
    qa = load_qa(shared_data / "benchmarks" / "hotpotqa" / "dev.jsonl")[:1]
    team = Team(smollm2_engine(str(smollm2_dir)), LLMConfig(sampling={"default": {"max_new_tokens": 8}}).sampling)
    (e,) = run_decor(qa, team, Bm25Retriever(rows), DecorConfig(t_max=1, top_k=2, passage_words=20))
    assert [c.role for c in e.calls] == [decor.PLANNER, decor.FILTER, decor.ANSWERER]
    assert all(c.prompt_tokens > 0 and c.completion_tokens > 0 for c in e.calls)
    assert all((c.format_error is None) != ("fallback" in c.meta) for c in e.calls)
    assert e.queries and isinstance(e.final_answer, str) and e.meta["rounds"] == 1
    (j,) = decor_rewards([e], RuleJudge(), DecorConfig().reward)
    assert all(c.reward is not None for c in e.calls)
