"""The joint systems' own training reward on evaluation episodes (`ragteam.rewards.team`, issue 25 §3): worked out
by hand for a right, a wrong and a degenerate output of JADE, DECOR, QAgent (end to end and as a plug-in) and
M-ASK (whose inference episodes, answered once, are refused with the fix), and `evaluate` averaging it x100 per
row and pairing it between rows with an interval."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from helpers_agents import DrawingEngine, KeywordRetriever, ScriptedEngine

from ragteam.eval.evaluate import EvalConfig, WorkflowConfigs
from ragteam.io import write_jsonl
from ragteam.llm import Completion, EngineConfig, EnginePool, LLMConfig, Team
from ragteam.records import AgentCall, Episode
from ragteam.rewards.team import set_team_rewards as set_rewards
from ragteam.systems.registry import team_reward
from ragteam.systems.decor import roles as decor
from ragteam.systems.decor.rewards import Judgement, assign_rewards as assign_decor
from ragteam.systems.decor.workflow import DecorRewardConfig
from ragteam.systems.jade import roles as jade
from ragteam.systems.jade.rewards import JadeRewardConfig, assign_rewards as assign_jade
from ragteam.systems.jade.workflow import JadeConfig, run_jade
from ragteam.systems.mask.workflow import MaskConfig
from ragteam.systems.qagent import roles as qagent
from ragteam.systems.qagent.workflow import QAgentConfig, run_qagent

REPO = Path(__file__).resolve().parents[1]
ROWS = [{"id": "x", "question": "What is the capital of Francia?", "golden_answers": ["Paris"]}]
FRANCE = KeywordRetriever([("Francia", "Paris is the capital of Francia"), ("Rome", "Rome capital Italy"),
                           ("Berlin", "Berlin capital Germany")])


def set_team_rewards(episodes, workflow, *, hit_weight=0.5, passage_words=None, mask_penalty=1.0):
    """Evaluate's call for a row of kind `workflow`, with the params its systems' team rewards read."""
    cfgs = WorkflowConfigs(joint={"qagent": {"hit_weight": hit_weight}},
                           qagent=QAgentConfig(passage_words=passage_words), mask=MaskConfig(format_penalty=mask_penalty))
    set_rewards(episodes, workflow, team_reward(workflow), cfgs)


def _jade(plan: str, answer: str) -> Episode:
    reply = lambda role, m: {jade.PLANNER: plan, jade.AG: answer}[role]  # noqa: E731
    (ep,) = run_jade(ROWS, Team(ScriptedEngine(reply)), FRANCE, JadeConfig(top_k=3))
    assign_jade(ep, JadeRewardConfig())
    set_team_rewards([ep], "jade")
    return ep


def test_jade_team_reward_is_the_episode_return_by_hand():
    right = _jade("<workflow>R,AG</workflow>", "<answer>Paris</answer>")
    assert right.metrics["team_reward"] == pytest.approx(1.0)          # R_global = F1 1, α = β = 0, no penalty
    # both calls malformed: −1 each (Eq. 7), and the fallback answer "Paris, I think" has F1 2·(1/3·1)/(1/3 + 1) = 0.5
    wrong = _jade("I would retrieve then answer.", "Paris, I think")
    assert [c.format_error is not None for c in wrong.calls] == [True, True]
    assert wrong.metrics["team_reward"] == pytest.approx(-2.0 + 0.5)
    # degenerate: an answer tag with nothing in it scores no better than a wrong answer, and below the right one
    empty = _jade("<workflow>R,AG</workflow>", "<answer></answer>")
    assert empty.metrics["team_reward"] <= 0.0 < right.metrics["team_reward"]


def _decor_episode(malformed: bool) -> Episode:
    ep = Episode(question_id="x", question="q?", golden_answers=["Paris"], final_answer="Paris")
    for role in (decor.PLANNER, decor.FILTER, decor.PLANNER, decor.ANSWERER):
        ep.add_call(AgentCall(role=role, prompt=[], format_error="bad" if malformed and role == decor.FILTER else None))
    ep.add_call(AgentCall(role=decor.SUMMARIZER, prompt=[]))          # frozen helper: no reward
    return ep


def test_decor_team_reward_is_the_mean_r_total_over_policy_calls_and_the_gate_reads_the_penalty():
    cfg = DecorRewardConfig()                                          # λ 0.5, α 0.6, β 0.4, penalty −1
    ok = _decor_episode(False)
    # R_team = 0.5·F1 1 + 0.5·LJ 1 = 1; R_role +1, −1, (not judged) 0, +1 -> R_total 0.6 + 0.4·r_role
    assign_decor([ok], [Judgement(lj=1.0, roles={0: 1.0, 1: -1.0, 3: 1.0})], cfg)
    set_team_rewards([ok], "decor")
    assert ok.metrics["team_reward"] == pytest.approx((1.0 + 0.2 + 0.6 + 1.0) / 4)
    # the gate: one malformed Filter call -> every policy call −1, whatever the answer and however many calls followed
    bad = _decor_episode(True)
    assign_decor([bad], [Judgement(lj=1.0)], cfg)
    set_team_rewards([bad], "decor")
    assert bad.metrics["team_reward"] == pytest.approx(-1.0)


QA_ROWS = [{"id": "A", "question": "Where was Ed Wood born?", "golden_answers": ["Poughkeepsie"]},
           {"id": "B", "question": "Who directed Doctor Strange?", "golden_answers": ["Scott Derrickson"]},
           {"id": "C", "question": "What animal has stripes?", "golden_answers": ["Zebra"]}]
QA_PASSAGES = [("Ed Wood", "Ed Wood was an American filmmaker born in Poughkeepsie."),
               ("Doctor Strange", "Doctor Strange is a film directed by Scott Derrickson.")]
# A: searches, finds the gold, answers right; B: searches, finds the gold, answers wrong; C: never writes a tag
QA_SCRIPT = {"A": ["<plan>p</plan><search><query>Ed Wood</query></search>", "<reflection>r</reflection><answer>Poughkeepsie</answer>"],
             "B": ["<plan>p</plan><search><query>Doctor Strange</query></search>", "<reflection>r</reflection><answer>Sam Raimi</answer>"],
             "C": ["no idea", "still no idea"]}
# the plug-in generator G: right on B (where the agent was wrong), wrong on A
QA_GENERATOR = {"A": "New York", "B": "Scott Derrickson", "C": "Zebra"}


def _qagent_reply(role, m):
    by_q = {r["question"]: r["id"] for r in QA_ROWS}
    if role == "qagent":
        qid = by_q[re.search(r"Question: (.*)\.$", m[0]["content"]).group(1)]
        so_far = m[-1]["content"] if m[-1]["role"] == "assistant" else ""
        return QA_SCRIPT[qid][min(so_far.count("<information>") + so_far.count(qagent.PROMPT_RETHINK), 1)]
    return QA_GENERATOR[by_q[re.search(r"Question: (.*)", m[-1]["content"]).group(1)]]


def test_qagent_team_reward_is_eq7_end_to_end_and_eq10_as_a_plug_in():
    cfg = QAgentConfig(max_turns=2, top_k=1)
    own = {e.question_id: e for e in run_qagent(QA_ROWS, Team(ScriptedEngine(_qagent_reply)), KeywordRetriever(
        QA_PASSAGES), cfg)}
    set_team_rewards(list(own.values()), "qagent")
    # Eq. 7: format gate x strict EM of its own answer: right 1, wrong 0, no tag at all 0
    assert {q: e.metrics["team_reward"] for q, e in own.items()} == {"A": 1.0, "B": 0.0, "C": 0.0}
    plug = {e.question_id: e for e in run_qagent(QA_ROWS, Team(ScriptedEngine(_qagent_reply)), KeywordRetriever(
        QA_PASSAGES), cfg, plugin=True)}
    set_team_rewards(list(plug.values()), "qagent_plugin", hit_weight=0.5)
    # Eq. 10: EM(A*, G(q, K)) + 0.5 Hit: A: G wrong, K holds the gold (0.5); B: G right, gold in K (1.5);
    # C: G's "Zebra" contains the gold, K is empty (1.0)
    assert {q: e.metrics["team_reward"] for q, e in plug.items()} == {"A": 0.5, "B": 1.5, "C": 1.0}


def test_a_plug_in_answer_the_fallback_resampled_scores_the_stub_training_would_have_rewarded():
    """Training never resamples (a trainer's Team has no fallback), so stage 2 reads a generator stub as "": the
    evaluation's resampled right answer earns only Hit, though it still counts for the row's EM / F1."""
    from ragteam.llm import AnswerFallback, SamplingConfig

    def reply(role, m):
        if role == "answer_agent" and f"Question: {QA_ROWS[1]['question']}" in m[-1]["content"]:
            return ""                                        # G's greedy output on B: nothing (a stub)
        return _qagent_reply(role, m)

    cfg = QAgentConfig(max_turns=2, top_k=1)
    team = Team(DrawingEngine(reply, lambda m: ["", "Scott Derrickson"]), {"answer_agent": SamplingConfig(max_new_tokens=8)},
                fallback=AnswerFallback(samples=2))
    plug = {e.question_id: e for e in run_qagent(QA_ROWS, team, KeywordRetriever(QA_PASSAGES), cfg, plugin=True)}
    b = plug["B"]
    gen = [c for c in b.calls if c.role == "answer_agent"][-1]
    assert gen.meta["resampled"]["draw"] == 2 and b.final_answer == "Scott Derrickson"
    set_team_rewards(list(plug.values()), "qagent_plugin", hit_weight=0.5)
    # B: 1.5 had G answered itself (test above); resampled, EM(A*, "") = 0 and the gold in K gives 0.5 Hit
    assert {q: e.metrics["team_reward"] for q, e in plug.items()} == {"A": 0.5, "B": 0.5, "C": 1.0}
    # a resampled call where the workflow never resamples (JADE) is refused, not scored as the policy's answer
    ep = _jade("<workflow>R,AG</workflow>", "<answer>Paris</answer>")
    ep.calls[-1].meta["resampled"] = {"from": "", "draw": 1, "of": 4}
    with pytest.raises(ValueError, match=r"call\(s\) \[1\] were resampled.*jade workflow never asks for"):
        set_team_rewards([ep], "jade")


MASK_ROWS = [{"id": "right", "question": "What is the capital of Xland?", "golden_answers": ["Xville"]},
             {"id": "wrong", "question": "What is the river of Xland?", "golden_answers": ["Long"]},
             {"id": "stub", "question": "garbled Xland?", "golden_answers": ["Xville"]}]
MASK_PASSAGES = [("Xland", "Xville is the capital of Xland."), ("river", "The Long river flows through Xland.")]


def _mask_reply(role: str, messages) -> str:
    """A plan guessing "Paris", one search finding "Xville", then <end>; both questions end on "Xville" (right for
    the capital, wrong for the river), the garbled one writes empty tags everywhere (a stub each parser refuses)."""
    from ragteam.systems.mask import roles as M

    user = messages[-1]["content"]
    if "garbled" in user:
        return {M.PLANNING: "<predicted_answer></predicted_answer>", M.SEARCH: "<search></search>",
                M.SUMMARY: "<evidence></evidence>", M.UPDATE: "",
                M.ANSWER: "<predicted_answer></predicted_answer>"}[role]
    if role == M.PLANNING:
        return "<q1>Which place?</q1><a1>unkown</a1><predicted_answer>Paris</predicted_answer>"
    if role == M.SEARCH:
        return "<end>" if "1. Query:" in user else "<search>Xland</search>"
    if role == M.SUMMARY:
        return "<evidence>Xville is the capital of Xland.</evidence>"
    if role == M.UPDATE:
        return "<Update>t1</Update>"
    answer = "Xville" if "capital" in user else "Paris"
    return f"<predicted_answer>{answer}</predicted_answer>"


def _mask(every_turn: bool) -> list[Episode]:
    from ragteam.systems.mask.workflow import MaskConfig, run_mask

    return run_mask(MASK_ROWS, Team(ScriptedEngine(_mask_reply)), KeywordRetriever(MASK_PASSAGES),
                    MaskConfig(max_turns=3, top_k=1, answer_every_turn=every_turn))


def test_mask_team_reward_is_the_mean_turn_level_reward_by_hand():
    right, wrong, stub = _mask(every_turn=True)
    set_team_rewards([right, wrong, stub], "mask", mask_penalty=1.0)
    # right: Planning a_0 Paris F1 0; turn 1 Search/Summary/Update ΔF1 = F1(Xville) − F1(Paris) = 1 each, Answer 1;
    # turn 2's <end> 0: (0 + 1 + 1 + 1 + 1 + 0) / 6
    assert [c.role.removeprefix("mask_") for c in right.calls] == ["planning", "search", "summary", "update", "answer",
                                                                   "search"]
    assert right.metrics["team_reward"] == pytest.approx(4 / 6)
    # wrong: Paris, then Xville, against "Long": F1 0 everywhere, no call malformed
    assert wrong.metrics["team_reward"] == 0.0
    # the stub: empty tags in every role parse as malformed, −1 each and F1 0 (the fallbacks answer nothing), so it
    # scores below the wrong answer, which scores below the right one
    assert stub.metrics["team_reward"] == pytest.approx(-1.0)
    assert stub.metrics["team_reward"] < wrong.metrics["team_reward"] < right.metrics["team_reward"]


def test_mask_answers_the_same_either_way_and_inference_episodes_are_refused_with_the_fix():
    once, every = _mask(every_turn=False), _mask(every_turn=True)
    assert [e.final_answer for e in once] == [e.final_answer for e in every] == ["Xville", "Xville", ""]
    assert [e.meta["answered_every_turn"] for e in once + every] == [False] * 3 + [True] * 3
    with pytest.raises(ValueError, match=r"need the Answer agent after every turn.*answer_every_turn: true"):
        set_team_rewards(once, "mask")


def test_a_jade_call_without_its_reward_is_refused():
    ep = Episode(question_id="x", question="q?", golden_answers=["a"], calls=[AgentCall(role=jade.PLANNER, prompt=[])])
    with pytest.raises(ValueError, match="have no reward"):
        set_team_rewards([ep], "jade")


def test_evaluate_reports_the_team_reward_per_row_and_its_paired_difference(tmp_path):
    sys.path.insert(0, str(REPO))
    import stages.evaluate as stage

    write_jsonl(tmp_path / "b" / "hotpotqa.jsonl", [dict(ROWS[0], id=f"x{i}") for i in range(3)])
    base = lambda role, m: {jade.PLANNER: "retrieve then answer", jade.AG: "Paris, I think",  # noqa: E731
                            "generator": "Paris"}[role]
    trained = lambda role, m: {jade.PLANNER: "<workflow>R,AG</workflow>", jade.AG: "<answer>Paris</answer>"}[role]  # noqa: E731
    engines = {"models/llm": ScriptedEngine(base), "models/t": ScriptedEngine(trained)}
    ev = EvalConfig(n_questions=3, systems={"jade": {"workflow": "jade"},
                                            "jade_trained": {"workflow": "jade", "model": "models/t"},
                                            "native": {"workflow": "native"}})
    metrics = stage.run(LLMConfig(), WorkflowConfigs(jade=JadeConfig(top_k=3)), ev, benchmarks=tmp_path / "b",
                        results=tmp_path / "r", report=tmp_path / "r.md", figures=tmp_path / "f", retriever=FRANCE,
                        engines=EnginePool(EngineConfig(), loader=lambda p, c: engines[p]),
                        differences=tmp_path / "compare.json")
    assert metrics["jade"]["avg"]["team_reward"] == -150.0 and metrics["jade_trained"]["avg"]["team_reward"] == 100.0
    assert metrics["jade"]["avg"]["team_reward_ci"] == [-150.0, -150.0]
    assert "team_reward" not in metrics["native"]["avg"]                 # a baseline has no training reward
    diff = json.loads((tmp_path / "compare.json").read_text())["jade_trained vs jade"]["avg"]["team_reward"]
    assert diff["diff"] == 250.0 and diff["significant"]
    md = (tmp_path / "r.md").read_text()
    assert "Team reward ×100" in md and "Δteam reward ×100 [CI]" in md and "**+250.00 [250.00, 250.00]** †" in md


def test_the_stage_reads_qagents_hit_weight_from_its_training_params():
    from ragteam.config import ParamsError
    from ragteam.systems.qagent import hit_weight

    cfgs = WorkflowConfigs.from_params({"joint": {"qagent": {"hit_weight": 0.25}}})
    assert hit_weight(cfgs) == 0.25 and hit_weight(WorkflowConfigs.from_params({})) == 0.5
    with pytest.raises((ParamsError, ValueError), match="hit_weight"):
        hit_weight(WorkflowConfigs.from_params({"joint": {"qagent": {"hit_weight": -1}}}))


def test_an_mask_evaluation_row_gets_its_team_reward_only_where_it_answers_every_turn():
    from ragteam.systems.mask.workflow import MaskConfig
    from ragteam.eval.evaluate import SystemSpec, run_system, summarize

    cfgs = WorkflowConfigs(mask=MaskConfig(max_turns=3, top_k=1))
    team, retr = Team(ScriptedEngine(_mask_reply)), KeywordRetriever(MASK_PASSAGES)
    every = run_system(SystemSpec(workflow="mask", answer_every_turn=True), MASK_ROWS, team, retr, cfgs, "mask")
    once = run_system(SystemSpec(workflow="mask"), MASK_ROWS, team, retr, cfgs, "mask")
    assert [e.metrics["team_reward"] for e in every] == pytest.approx([4 / 6, 0.0, -1.0])
    assert all("team_reward" not in e.metrics for e in once)
    # the same answers, scores and searches; the row that answers every turn pays one Answer call a turn more
    assert [e.metrics["f1"] for e in every] == [e.metrics["f1"] for e in once]
    s_every, s_once = summarize(every), summarize(once)
    assert s_every["searches"] == s_once["searches"] and s_every["llm_calls"] > s_once["llm_calls"]
    with pytest.raises(ValueError, match="answer_every_turn is an M-ASK row setting"):
        SystemSpec(workflow="jade", answer_every_turn=True)
