"""M-ASK: the parsers on well-formed and malformed text, the workflow through every branch (scripted engine),
and the turn-level rewards (Eq. 2-3) against hand-computed values."""
from __future__ import annotations

import re

import pytest
from helpers_agents import KeywordRetriever, ScriptedEngine

from ragteam.agents.core import FormatError
from ragteam.llm import Team
from ragteam.systems.mask import roles as M
from ragteam.systems.mask.workflow import MaskConfig, run_mask
from ragteam.systems.mask.rewards import (annotate_mask_episode, answer_reward, end_reward, format_penalty,
                                          iteration_reward, planning_reward)

# ---- prompts ------------------------------------------------------------------------------------------------------


def test_prompts_keep_the_papers_wording_and_typos():
    assert "write \u2018unkown\u2019 exactly" in M.PLANNING_SYSTEM
    assert "has an answer 'unkown' or unclear" in M.SEARCH_SYSTEM
    assert "<Add>t(n+1)</Add> where n is current number of t's" in M.UPDATE_SYSTEM
    msgs = M.planning_messages("Who?")
    assert M.EXAMPLE_SLOT not in msgs[0]["content"] and "<predicted_answer>yes</predicted_answer>" in msgs[0]["content"]
    assert msgs[1]["content"] == "Query: Who?"
    k = M.KnowledgeState("Q?", [M.Step("a?", "A"), M.Step("b?", M.UNKNOWN)])
    s = M.search_messages(k, [M.SearchRecord("q1", "e1")])[1]["content"]
    assert "Thinking trajectory: t1: Q: a? | A: A\nt2: Q: b? | A: unkown" in s
    assert "Search history: 1. Query: q1 | Summary: e1" in s
    assert "Search history: (No previous searches)" in M.search_messages(k, [])[1]["content"]
    u = M.update_messages(k, "new q", "ev")[1]["content"]
    assert u.endswith("New query: new q\nEvidence: ev") and u.startswith("Original question: Q?\n")
    a = M.answer_messages(k)[1]["content"]
    assert a.startswith("Question: Q? Thinking trajectory: t1: Q: a? | A: A")


# ---- parsers ------------------------------------------------------------------------------------------------------


def test_parse_plan():
    p = M.parse_plan("<q1>Who founded X?</q1>\n<a1>Bob</a1>\n<q2>Where?</q2>\n"
                     "<predicted_answer> Paris </predicted_answer>")
    assert p == {"steps": [["Who founded X?", "Bob"], ["Where?", M.UNKNOWN]], "predicted_answer": "Paris"}
    assert M.parse_plan("<predicted_answer>yes</predicted_answer>") == {"steps": [], "predicted_answer": "yes"}
    many = "".join(f"<q{i}>s{i}?</q{i}><a{i}>x</a{i}>" for i in range(1, 9)) + "<predicted_answer>z</predicted_answer>"
    assert len(M.parse_plan(many)["steps"]) == M.MAX_PLAN_STEPS
    for bad in ("", "   ", "<q1>a</q1><a1>b</a1>", "<predicted_answer></predicted_answer>", "<predicted_answer>Paris",
                "Paris is the answer."):
        assert isinstance(M.parse_plan(bad), FormatError), bad


def test_parse_search():
    assert M.parse_search("<search> capital of  Xland </search>") == {"action": "search", "query": "capital of Xland"}
    assert M.parse_search("<end>") == {"action": "end"}
    assert M.parse_search(" <END> ") == {"action": "end"}
    assert M.parse_search("<end> <search>x</search>") == {"action": "end"}          # the first one wins
    assert M.parse_search("<search>x</search>\n<end>")["action"] == "search"
    long = "<search>" + " ".join(f"w{i}" for i in range(50)) + "</search>"
    assert len(M.parse_search(long)["query"].split()) == M.MAX_QUERY_WORDS
    for bad in ("", "<search></search>", "<search>unclosed", "I would search for the capital", "</end"):
        assert isinstance(M.parse_search(bad), FormatError), bad
    assert M.search_fallback("capital of <b>Xland</b>\nmore", "Q?") == "capital of Xland"
    assert M.search_fallback("  ", "What is Q?") == "What is Q?"


def test_parse_summary():
    assert M.parse_summary("<evidence>Xville is the capital.</evidence>") == "Xville is the capital."
    assert M.parse_summary("<evidence>No useful information</evidence>") == M.NO_USEFUL_INFORMATION
    assert len(M.parse_summary("<evidence>" + "w " * 200 + "</evidence>").split()) == M.MAX_EVIDENCE_WORDS
    for bad in ("", "Xville is the capital.", "<evidence>cut off", "<evidence> </evidence>"):
        assert isinstance(M.parse_summary(bad), FormatError), bad


def test_parse_update():
    assert M.parse_update("<Update>t1</Update>", 2) == M.UpdateOp("update", 1)
    assert M.parse_update("<update> t2 </update>", 2) == M.UpdateOp("update", 2)
    assert M.parse_update("<Add>t3</Add>", 2) == M.UpdateOp("add", 3)
    assert M.parse_update("<Add>t(3)</Add>", 2) == M.UpdateOp("add", 3)
    assert M.parse_update("<Add>t(n+1)</Add>", 2) == M.UpdateOp("add", 3)       # the prompt's literal key
    assert M.parse_update("<Add>t2</Add> <Update>t1</Update>", 1) == M.UpdateOp("add", 2)
    for bad, n in (("", 1), ("<Update>t3</Update>", 2), ("<Update>t0</Update>", 2), ("<Add>t5</Add>", 2),
                   ("Update t1", 1), ("<Update>first</Update>", 1), ("<Add>t2", 1)):
        assert isinstance(M.parse_update(bad, n), FormatError), bad


def test_parse_final_answer_and_fallback():
    assert M.parse_final_answer("<predicted_answer>Xville</predicted_answer>") == "Xville"
    for bad in ("", "Xville", "<predicted_answer></predicted_answer>", "<predicted_answer>Xville"):
        assert isinstance(M.parse_final_answer(bad), FormatError), bad
    assert M.answer_fallback("<predicted_answer>Xville is") == "Xville is"        # cut at max_new_tokens
    assert M.answer_fallback("The answer is Xville.\nBecause ...") == "Xville"
    assert M.answer_fallback("<predicted_answer>") == "" and M.answer_fallback("") == ""


def test_knowledge_state_apply():
    k = M.KnowledgeState("Q?", [M.Step("a?", "guess")])
    k.apply(M.UpdateOp("update", 1), "q1", "e1")
    k.apply(M.UpdateOp("add", 2), "q2", "e2")
    assert [(s.query, s.answer) for s in k.thinking_trajectory] == [("q1", "e1"), ("q2", "e2")]
    with pytest.raises(ValueError, match="no step t3"):
        k.apply(M.UpdateOp("update", 3), "q", "e")
    assert M.KnowledgeState.from_dict(k.to_dict()) == k


# ---- the workflow, scripted ---------------------------------------------------------------------------------------

PASSAGES = [("Xland", "Xville is the capital of Xland."), ("Xland river", "The Long river flows through Xland."),
            ("Other", "Nothing about it here.")]


def _turn(messages) -> int:
    """Past searches in a Search prompt."""
    return len(re.findall(r"\d+\. Query: ", messages[-1]["content"]))


def reply(role: str, messages) -> str:
    user = messages[-1]["content"]
    q = re.search(r"(?:Query|Original question|Question): (.*?)(?:\n| Thinking trajectory:|$)", user).group(1)
    if role == M.PLANNING:
        return "no tags at all" if "garbled" in q else "<q1>What is the capital?</q1><a1>unkown</a1>\n" \
                                                       "<predicted_answer>Paris</predicted_answer>"
    if "garbled" in user:
        return "garbled: I am not sure what to do here"
    if role == M.SEARCH:
        if "stop" in q:
            return "<end>"
        return ["<search>capital of Xland</search>", "<search>Xland river</search>", "<end>"][min(_turn(messages), 2)]
    if role == M.SUMMARY:
        return "<evidence>Xville is the capital of Xland.</evidence>" if "capital" in q else \
            "<evidence>The Long river flows through Xland.</evidence>"
    if role == M.UPDATE:
        return "<Update>t1</Update>" if "New query: capital of Xland" in user else "<Add>t2</Add>"
    if role == M.ANSWER:
        return "<predicted_answer>Xville</predicted_answer>"
    raise AssertionError(role)


ROWS = [{"id": "a", "question": "What is the capital of Xland?", "golden_answers": ["Xville"]},
        {"id": "b", "question": "Please stop: what is the capital of Xland?", "golden_answers": ["Xville"]},
        {"id": "c", "question": "garbled question about Xland?", "golden_answers": ["Xville"]}]


def _run(training: bool, max_turns: int = 2, **kw):
    eng = ScriptedEngine(reply)
    retr = KeywordRetriever(PASSAGES)
    eps = run_mask(ROWS, Team(eng), retr, MaskConfig(max_turns=max_turns, top_k=2, **kw), training=training)
    return eps, eng, retr


def test_workflow_training_mode_branches_and_batching():
    eps, eng, retr = _run(training=True)
    a, b, c = eps
    # a: Update t1 in turn 1 (the hallucinated step is overwritten), Add t2 in turn 2, then the turn budget ends it
    assert [x.role for x in a.calls] == [M.PLANNING] + [M.SEARCH, M.SUMMARY, M.UPDATE, M.ANSWER] * 2
    assert a.calls[3].parsed == {"kind": "update", "index": 1} and a.calls[7].parsed == {"kind": "add", "index": 2}
    assert a.meta["knowledge"]["thinking_trajectory"] == [
        {"query": "capital of Xland", "answer": "Xville is the capital of Xland."},
        {"query": "Xland river", "answer": "The Long river flows through Xland."}]
    assert a.meta["stop_reason"] == "max_turns" and a.meta["workflow"]["turns"] == 2 and a.meta["workflow"]["searches"] == 2
    assert a.final_answer == "Xville" and a.queries == ["capital of Xland", "Xland river"]
    assert a.retrieved_ids[0][0] == "0" and a.calls[1].retrieved_ids == a.retrieved_ids[0]
    # b: <end> at the first Search call; training mode still ends on an Answer-agent answer
    assert [x.role for x in b.calls] == [M.PLANNING, M.SEARCH, M.ANSWER]
    assert b.calls[1].meta["end"] and b.meta["stop_reason"] == "end" and b.meta["workflow"]["turns"] == 0
    assert b.calls[2].meta["final"] and b.final_answer == "Xville" and b.cost["retrieval_calls"] == 0
    # c: every output malformed -> documented fallbacks, the rollout completes and every error is recorded
    assert all(x.format_error for x in c.calls) and len(c.calls) == 1 + 4 * 2
    assert c.calls[0].meta["fallback"]["trajectory"] == [[c.question, M.UNKNOWN]]
    assert c.calls[1].meta["query"] == "garbled: I am not sure what to do here"   # search fallback: its first line
    assert c.calls[2].meta["fallback"] == M.NO_USEFUL_INFORMATION
    assert c.calls[3].meta["fallback"] == {"kind": "add", "index": 2}
    assert len(c.meta["knowledge"]["thinking_trajectory"]) == 3 and c.meta["format_errors"] == 9
    # one engine call per role and step over every waiting episode; one batch_search per turn
    assert eng.log == [(M.PLANNING, 3), (M.SEARCH, 3), (M.SUMMARY, 2), (M.UPDATE, 2), (M.ANSWER, 2),
                       (M.SEARCH, 2), (M.SUMMARY, 2), (M.UPDATE, 2), (M.ANSWER, 2), (M.ANSWER, 1)]
    assert len(retr.log) == 2 and retr.log[0] == ["capital of Xland", "garbled: I am not sure what to do here"]
    assert all(x.finish_reason == "stop" for e in eps for x in e.calls)


def test_workflow_inference_mode_answers_once_and_ends_on_end():
    eps, eng, _ = _run(training=False, max_turns=5)
    a = eps[0]
    assert [x.role for x in a.calls] == [M.PLANNING] + [M.SEARCH, M.SUMMARY, M.UPDATE] * 2 + [M.SEARCH, M.ANSWER]
    assert a.meta["stop_reason"] == "end" and a.meta["workflow"]["turns"] == 2 and a.final_answer == "Xville"
    assert eng.steps(M.ANSWER) == [3]          # the Answer agent runs once, for all three questions together
    assert eps[1].meta["stop_reason"] == "end"
    assert eps[2].meta["stop_reason"] == "max_turns" and eps[2].meta["workflow"]["turns"] == 5


def test_initial_trajectory_question_mode():
    eps, _, _ = _run(training=False, max_turns=1, initial_trajectory="question")
    b = eps[1]   # ended at once: K_0 is one step (question, a_0)
    assert b.meta["knowledge"]["thinking_trajectory"] == [{"query": b.question, "answer": "Paris"}]


# ---- rewards ------------------------------------------------------------------------------------------------------


def test_reward_equations():
    y = ["Xville"]
    assert planning_reward("Xville", y) == 1.0 and planning_reward("Paris", y) == 0.0
    assert answer_reward("the Xville city", y) == pytest.approx(2 * 0.5 * 1 / 1.5)  # P 1/2, R 1
    assert iteration_reward("Xville", "Paris", y) == 1.0 and iteration_reward("Paris", "Xville", y) == -1.0
    assert end_reward() == 0.0
    from ragteam.records import AgentCall
    assert format_penalty(AgentCall(role="x", prompt=[], format_error="bad"), 0.5) == -0.5
    assert format_penalty(AgentCall(role="x", prompt=[]), 0.5) == 0.0


def test_annotate_training_episodes():
    eps, _, _ = _run(training=True)
    for e in eps:
        annotate_mask_episode(e, penalty=1.0)
    a, b, c = eps
    # a: a_0 = Paris (F1 0); turn 1 answer Xville (1) -> ΔF1 1 for search/summary/update; turn 2 Xville -> ΔF1 0
    assert [x.reward for x in a.calls] == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert [x.reward for x in b.calls] == [0.0, 0.0, 1.0]          # Planning, <end> 0, final Answer
    # c: every call malformed (-1); answers are the fallback texts (F1 0), so ΔF1 = 0 everywhere
    assert [x.reward for x in c.calls] == [-1.0] * 9


def test_annotate_refuses_inference_episodes():
    eps, _, _ = _run(training=False)
    with pytest.raises(ValueError, match="training-mode rollout"):
        annotate_mask_episode(eps[0], 1.0)
    eps[0].golden_answers = []
    with pytest.raises(ValueError, match="no golden answers"):
        annotate_mask_episode(eps[0], 1.0)


# ---- evaluation: the mask systems -------------------------------------------------------------------------------

def test_mask_systems_in_evaluation():
    from ragteam.agents.baselines import BaselineConfig
    from ragteam.agents.maps_workflow import MapsConfig
    from ragteam.eval.evaluate import SystemSpec, WorkflowConfigs, role_models, run_system, summarize
    from ragteam.eval.report import report_markdown

    trained = SystemSpec(workflow="mask", model="models/agents/mask")
    assert role_models(trained, {"answer_agent": "models/agents/answer"}) == {r: "models/agents/mask" for r in M.ROLES}
    assert role_models(SystemSpec(workflow="mask"), {"answer_agent": "x"}) == {}
    eps = run_system(SystemSpec(workflow="mask"), ROWS, Team(ScriptedEngine(reply)), KeywordRetriever(PASSAGES),
                     WorkflowConfigs(mask=MaskConfig(max_turns=3, top_k=2)), "mask")
    assert [e.metrics["em"] for e in eps] == [1.0, 1.0, 0.0]
    s = summarize(eps)
    assert s["turns"] == s["searches"] == round((2 + 0 + 3) / 3, 4) and s["retrieval_calls"] == round(5 / 3, 3)
    md = report_markdown({"mask": {"synthetic": s, "avg": s}}, ["synthetic"], {})
    assert "| mask | 1.67 | 1.67 |" in md


def test_cli_ask_system_mask_shows_the_whole_trace(monkeypatch, ask_params):
    from pathlib import Path

    from typer.testing import CliRunner

    import ragteam.llm.hf
    import ragteam.retrieval
    from ragteam.cli import app

    class Fake(ScriptedEngine):
        def __init__(self, path, cfg):
            super().__init__(reply)

    monkeypatch.setattr(ragteam.llm.hf, "HFEngine", Fake)
    monkeypatch.setattr(ragteam.retrieval, "open_retriever", lambda index: KeywordRetriever(PASSAGES))
    res = CliRunner().invoke(app, ["ask", "What is the capital of Xland?", "--system", "mask", "--calls",
                                   "--params", str(ask_params), "--index", "idx"])
    assert res.exit_code == 0, res.output
    assert "A: Xville" in res.output and "2 turn(s), max_turns" in res.output and "2 retrievals" in res.output
    for role in M.ROLES:
        assert f"[{role}]" in res.output
    assert "[mask_update] '<Update>t1</Update>' -> {'kind': 'update', 'index': 1}" in res.output
