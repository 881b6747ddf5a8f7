"""DECOR prompts, parsers, fallbacks and Algorithm 1 (batched), with scripted engines and a keyword retriever."""
from __future__ import annotations

import re

import pytest
from helpers_agents import KeywordRetriever, ScriptedEngine

from ragteam.agents.core import FormatError
from ragteam.llm import Team
from ragteam.retrieval.base import Hit
from ragteam.systems.decor import roles as decor
from ragteam.systems.decor.workflow import DecorConfig, run_decor

# ---- prompts --------------------------------------------------------------------------------------------------------


def test_prompts_are_the_papers_with_their_placeholders():
    assert decor.PLANNER_PROMPT.startswith("You are the planner for a question-answering system.\n")
    assert "7. Output ONLY in the following format—no extra text:\n<think>" in decor.PLANNER_PROMPT
    assert decor.PLANNER_PROMPT.endswith("Input:\nquery: {query}\nhistory search information: "
                                         "{history_search_information}")
    assert decor.FILTER_PROMPT.endswith("Search Query: {query}\nRetrieval Results: {retrieval_result}")
    assert "keep it—even if it seems minor." in decor.FILTER_PROMPT
    assert decor.ANSWERER_PROMPT.endswith("- User's query: {query}\n- History search information: "
                                          "{history_search_information}")
    m = decor.planner_messages("Who?", [])
    assert len(m) == 1 and m[0]["role"] == "user"
    assert m[0]["content"].endswith(f"query: Who?\nhistory search information: {decor.EMPTY_HISTORY}")


def test_render_memory_and_docs():
    mem = [decor.MemoryEntry(("q1", "q2"), "facts", summary=True), decor.MemoryEntry(("q3",), "e3"),
           decor.MemoryEntry(("q4",), "")]
    assert decor.render_memory(mem) == ("Searches 1-2: q1; q2\nInformation (summarised): facts\n\n"
                                        "Search 3: q3\nInformation: e3\n\nSearch 4: q4\n"
                                        "Information: (nothing relevant kept)")
    assert decor.memory_words([]) == 0 and decor.memory_words(mem[1:2]) == len("Search 3: q3 Information: e3".split())
    hits = [Hit("1", '"Paris"\nParis is the capital of France and its largest city', 1.0)]
    assert decor.render_docs(hits, 3) == 'Doc 1(Title: "Paris"): Paris is the ...'
    assert decor.render_docs([], 3) == decor.NO_RESULTS
    assert decor.history_evidence(decor.render_memory(mem)) == "facts\ne3\n(nothing relevant kept)"
    assert decor.MemoryEntry.from_dict(mem[0].to_dict()) == mem[0]


# ---- parsers ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("<think>\nneed the year\n</think>\n<search>\nKendalls Heaven's Just a Sin Away year\n</search>\n",
     {"action": "search", "query": "Kendalls Heaven's Just a Sin Away year"}),
    ("<think>x</think><search>None</search>", {"action": "stop"}),
    ("<think>x</think>\n<search> none. </search>", {"action": "stop"}),
    ("<think>x</think><search>multi\nline   query</search>", {"action": "search", "query": "multi line query"}),
])
def test_parse_planner(text, want):
    assert decor.parse_planner(text) == want


@pytest.mark.parametrize("text, reason", [
    ("", "empty response"),
    ("<search>q</search>", "no <think> block"),
    ("<think>x</think> q", "no <search> block"),
    ("<think>x</think><search>q", "<search> not closed"),
    ("<think>x<search>q</search>", "<think> not closed"),
    ("<think>x</think><search>a</search><search>b</search>", "<search> duplicated"),
    ("Sure! <think>x</think><search>q</search>", "text outside"),
    ("<think>x</think><search>q</search> Hope this helps", "text outside"),
    ("<search>q</search><think>x</think>", "out of order"),
    ("<think>x</think><search>  </search>", "empty <search>"),
    ("<think>x</think><search>[your precise search query]</search>", "placeholder"),
    ("<think>x <b>y</b></think><search>q</search>", "nested"),
])
def test_parse_planner_malformed(text, reason):
    out = decor.parse_planner(text)
    assert isinstance(out, FormatError) and reason in out.reason


def test_parse_filter_answerer_summary():
    assert decor.parse_filter("<think>kept 1</think>\n<filter>The Kendalls are a duo.\nThey sang.</filter>") == \
        "The Kendalls are a duo. They sang."
    assert isinstance(decor.parse_filter("<think>x</think><answer>a</answer>"), FormatError)
    assert isinstance(decor.parse_filter("<think>x</think><filter>[Your final integrated paragraph—only factual "
                                         "content, one paragraph.]</filter>"), FormatError)
    assert decor.parse_answerer("<think>r</think>\n<answer>\nThe Kendalls\n</answer>") == "The Kendalls"
    for bad in ("The Kendalls", "<think>r</think><answer>x</answer> extra", "<answer>x</answer>",
                "<think>r</think><answer></answer>"):
        assert isinstance(decor.parse_answerer(bad), FormatError), bad
    assert decor.parse_summary("- Paris is in France.\n2) It has 2M people.\n\n") == \
        "Paris is in France. It has 2M people."
    assert isinstance(decor.parse_summary(" \n - \n"), FormatError)


def test_fallbacks_salvage_what_is_usable():
    assert decor.salvage("<think>long reasoning cut off", "answer") is None
    assert decor.salvage("<think>r <answer>x</answer> still thinking", "answer") is None
    assert decor.salvage("<think>r</think> <answer>Paris", "answer") == "Paris"
    assert decor.salvage("noise <search>q one</search> tail", "search") == "q one"
    assert decor.salvage("<think>r</think><search></search>", "search") == ""
    # planner: first salvaged line of an opened <search>, else the question in turn 1, else STOP
    assert decor.fallback_planner("<think>r</think>\n<search>Kendalls song\nmore", "Q?", 2) == \
        {"action": "search", "query": "Kendalls song"}
    assert decor.fallback_planner("The user's query is: Q?", "Q?", 2) == {"action": "stop"}
    assert decor.fallback_planner("<think>unclosed", "Q?", 1) == {"action": "search", "query": "Q?"}
    assert decor.fallback_planner("<think>unclosed", "Q?", 2) == {"action": "stop"}
    assert decor.fallback_planner("<search>None", "Q?", 3) == {"action": "stop"}
    assert len(decor.fallback_planner("<search>" + "w " * 100, "Q?", 2)["query"].split()) == decor.MAX_QUERY_WORDS
    assert decor.fallback_filter("<think>r</think><filter>a\n\nb") == "a b"
    assert decor.fallback_filter("<think>r") == "" and decor.fallback_filter("1. Relevance: Keep every") == ""
    assert decor.fallback_answerer("<think>r</think>Answer: Paris.\nBecause...") == "Paris"
    assert decor.fallback_answerer("<think>r") == ""


# ---- Algorithm 1 ------------------------------------------------------------------------------------------------

PASSAGES = [("Alpha Band", "Alpha Band covered the song Red Sky in 1977."),
            ("Red Sky", "Red Sky is a song written by Dana Low."),
            ("Beta City", "Beta City is the capital of Gamma."),
            ("Gamma", "Gamma is a country whose capital is Beta City.")]
ROWS = [{"id": "a", "question": "Who covered Red Sky?", "golden_answers": ["Alpha Band"],
         "metadata": {"supporting_titles": ["Alpha Band"]}},
        {"id": "b", "question": "What is the capital of Gamma?", "golden_answers": ["Beta City"]},
        {"id": "c", "question": "Who wrote Red Sky?", "golden_answers": ["Dana Low"]}]


def _field(text: str, label: str) -> str:
    m = re.search(rf"^{label}: (.*)$", text, flags=re.MULTILINE)
    assert m, text[-300:]
    return m.group(1)


def scripted(searches: int = 1, bad: dict | None = None):
    """Planner searches `searches` times (the question's words, then '<question> more'), then STOPs; Filter keeps
    the first retrieved passage; Answerer answers with the first two words of the memory's first evidence.
    `bad` = {(role, question): text} replaces a reply with malformed text."""
    bad = bad or {}

    def reply(role, m):
        text = m[0]["content"]
        if role == "decor_planner":
            q, hist = _field(text, "query"), text.split("history search information: ", 1)[1]
            out = bad.get((role, q))
            n = len(re.findall(r"^Search(?:es)? \d", hist, flags=re.MULTILINE))
            n += sum(len(x.split(";")) - 1 for x in re.findall(r"^Searches [\d-]+: (.*)$", hist, re.MULTILINE))
            search = "None" if n >= searches else (q if n == 0 else f"{q} more {n}")
            return out or f"<think>\nfact missing\n</think>\n<search>\n{search}\n</search>"
        if role == "decor_filter":
            q = _field(text, "Search Query")
            doc = re.search(r'Doc 1\(Title: "[^"]*"\): (.*)', text)
            kept = doc.group(1) if doc else ""
            return bad.get((role, q.split(" more")[0])) or f"<think>k</think>\n<filter>{kept}</filter>"
        if role == "decor_answerer":
            q = _field(text, "- User's query")
            ev = re.search(r"^Information[^:]*: (.*)$", text, flags=re.MULTILINE)
            ans = " ".join(ev.group(1).split()[:2]) if ev else "unknown"
            return bad.get((role, q)) or f"<think>from memory</think>\n<answer>{ans}</answer>"
        if role == "decor_summarizer":
            return "- " + _field(text, "Search 1").upper()
        raise AssertionError(role)
    return reply


def test_algorithm_1_batched_stop_memory_and_barriers():
    engine, ret = ScriptedEngine(scripted(searches=1)), KeywordRetriever(PASSAGES)
    eps = run_decor(ROWS, Team(engine), ret, DecorConfig(t_max=4, top_k=2, l_max=1000))
    # one engine call per (role, step) over all waiting episodes, one batch_search per turn
    assert engine.log == [("decor_planner", 3), ("decor_filter", 3), ("decor_planner", 3), ("decor_answerer", 3)]
    assert ret.log == [[r["question"] for r in ROWS]]
    ep = eps[0]
    assert [c.role for c in ep.calls] == ["decor_planner", "decor_filter", "decor_planner", "decor_answerer"]
    assert all(c.episode_id == ep.episode_id and c.format_error is None for c in ep.calls)
    assert ep.meta["stop_reason"] == "planner_stop" and ep.meta["rounds"] == 1
    assert ep.queries == ["Who covered Red Sky?"] and ep.calls[0].retrieved_ids == ep.retrieved_ids[0]
    assert ep.meta["supporting_titles"] == ["Alpha Band"] and "supporting_titles" not in eps[1].meta
    turn = ep.meta["turns"][0]
    assert turn["query"] == ep.queries[0] and [d["id"] for d in turn["docs"]] == ep.retrieved_ids[0]
    assert ep.meta["memory"] == [{"queries": [ep.queries[0]], "evidence": turn["evidence"], "summary": False}]
    # information barrier: the Planner and the Answerer see the filtered evidence, never the raw passages
    second = ep.calls[1].response  # the Filter kept only Doc 1
    raw_docs = [d["contents"].split("\n", 1)[1] for d in turn["docs"]]
    assert len(raw_docs) == 2 and raw_docs[0] in second and raw_docs[1] not in second
    for c in (ep.calls[2], ep.calls[3]):
        assert raw_docs[1] not in c.prompt[0]["content"] and turn["evidence"] in c.prompt[0]["content"]
    assert ep.calls[2].meta == {"turn": 2, "history": decor.render_memory(
        [decor.MemoryEntry((ep.queries[0],), turn["evidence"])])}
    assert ep.calls[1].meta["search_query"] == ep.queries[0] and "Doc 1(Title:" in ep.calls[1].meta["retrieval_result"]
    assert ep.final_answer == " ".join(turn["evidence"].split()[:2])
    assert ep.cost["llm_calls"] == 4 and ep.cost["retrieval_calls"] == 1 and ep.meta["format_errors"] == 0


def test_t_max_forces_the_answer_and_summarizer_compresses_memory():
    engine, ret = ScriptedEngine(scripted(searches=10)), KeywordRetriever(PASSAGES)
    eps = run_decor(ROWS[:2], Team(engine), ret, DecorConfig(t_max=3, top_k=1, l_max=15))
    roles = [r for r, _ in engine.log]
    assert roles.count("decor_planner") == 3 and roles.count("decor_filter") == 3
    assert roles[-1] == "decor_answerer" and len(ret.log) == 3
    ep = eps[0]
    assert ep.meta["stop_reason"] == "t_max" and ep.meta["rounds"] == 3 and len(ep.queries) == 3
    summaries = [c for c in ep.calls if c.role == "decor_summarizer"]
    assert summaries and all(c.meta["memory_words"] > 0 for c in summaries)
    mem = [decor.MemoryEntry.from_dict(d) for d in ep.meta["memory"]]
    # the whole M_{t-1} was condensed into one entry that keeps every query, then e_t appended
    assert mem[0].summary and mem[0].queries == tuple(ep.queries[:-1]) and mem[-1].queries == (ep.queries[-1],)
    assert mem[0].evidence == mem[0].evidence.upper()           # the scripted summary
    assert ep.calls.index(summaries[-1]) < len(ep.calls) - 1     # before the Answerer


def test_fallbacks_keep_the_episode_going_without_truncation():
    bad = {("decor_planner", ROWS[0]["question"]): "<search>Red Sky covered by whom\nsecond line",
           ("decor_filter", ROWS[1]["question"]): "<think>r</think><filter>Beta City is the capital",
           ("decor_answerer", ROWS[2]["question"]): "Dana Low wrote it."}
    engine = ScriptedEngine(scripted(searches=1, bad=bad))
    eps = run_decor(ROWS, Team(engine), KeywordRetriever(PASSAGES), DecorConfig(t_max=1, top_k=1))
    p = eps[0].calls[0]
    assert p.format_error and p.meta["fallback"] == {"action": "search", "query": "Red Sky covered by whom"}
    assert eps[0].queries == ["Red Sky covered by whom"]
    f = eps[1].calls[1]
    assert f.format_error == "<filter> not closed" and f.meta["fallback"] == "Beta City is the capital"
    assert eps[1].meta["memory"][0]["evidence"] == "Beta City is the capital"
    a = eps[2].calls[-1]
    assert a.format_error and eps[2].final_answer == "Dana Low wrote it"
    assert all(e.meta["format_errors"] == 1 and "truncated" not in e.meta for e in eps)


def test_truncation_on_format_error_ends_only_that_episode():
    bad = {("decor_planner", ROWS[0]["question"]): "<think>x</think><search>q",
           ("decor_filter", ROWS[1]["question"]): "no tags"}
    engine = ScriptedEngine(scripted(searches=2, bad=bad))
    eps = run_decor(ROWS, Team(engine), KeywordRetriever(PASSAGES), DecorConfig(t_max=3, top_k=1),
                    truncate_on_format_error=True)
    assert engine.steps("decor_planner") == [3, 1, 1] and engine.steps("decor_filter") == [2, 1]
    assert engine.steps("decor_answerer") == [1]
    assert eps[0].meta["truncated"] == {"role": "decor_planner", "turn": 1} and len(eps[0].calls) == 1
    assert eps[1].meta["truncated"] == {"role": "decor_filter", "turn": 1} and eps[1].meta["memory"] == []
    assert eps[0].final_answer == "" and eps[1].final_answer == "" and eps[0].meta["stop_reason"] == "format_error"
    assert "truncated" not in eps[2].meta and eps[2].meta["stop_reason"] == "planner_stop"
    assert eps[2].meta["rounds"] == 2 and eps[2].final_answer


def test_planner_stop_in_turn_one_answers_from_empty_memory():
    def reply(role, m):
        return {"decor_planner": "<think>known</think><search>None</search>",
                "decor_answerer": "<think>guess</think><answer>x</answer>"}[role]
    engine, ret = ScriptedEngine(reply), KeywordRetriever(PASSAGES)
    eps = run_decor(ROWS[:2], Team(engine), ret, DecorConfig())
    assert engine.log == [("decor_planner", 2), ("decor_answerer", 2)] and ret.log == []
    assert all(e.meta["rounds"] == 0 and e.meta["memory"] == [] and e.final_answer == "x" for e in eps)
    assert decor.EMPTY_HISTORY in eps[0].calls[-1].prompt[0]["content"]
