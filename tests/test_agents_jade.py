"""JADE: Appendix E prompts, the plan grammar, every parser, and Algorithm 1 with a scripted engine (the paper's
case studies of App. F replayed, batching across episodes at different nodes and modules, fallbacks, round limit)."""
import json

import pytest
from helpers_agents import Bm25Retriever, KeywordRetriever, ScriptedEngine, question_of, smollm2_engine

from ragteam.agents.core import FormatError
from ragteam.data.formats import load_qa
from ragteam.llm import SamplingConfig, Team
from ragteam.records import read_episodes, write_episodes
from ragteam.retrieval.base import Hit
from ragteam.systems.jade import roles as jade
from ragteam.systems.jade.workflow import JadeConfig, run_jade

# ---- prompts ----------------------------------------------------------------------------------------------------


def test_prompts_are_appendix_e_split_into_system_and_question_parts():
    m = jade.planner_messages("Who wrote Hamlet?")
    assert [x["role"] for x in m] == ["system", "user"]
    assert m[0]["content"].startswith("You are a helpful assistant specialized in planning workflows.")
    assert m[0]["content"].endswith("3. IMPORTANT: If you choose QDS or QDP, DO NOT add any other tools/agents. "
                                    "The workflow must ONLY contain QDS or QDP in those cases.")
    assert m[1]["content"] == ("Question: Who wrote Hamlet?\nNow, generate the appropriate Workflow based on the "
                               "rules. Output strictly inside <workflow>...</workflow> tags.")
    docs = [Hit(str(i), f'"T{i}"\nword{i} ' + "x " * 30, 0.0) for i in range(5)]
    ds = jade.ds_messages("q?", docs, passage_words=3)[1]["content"]
    assert ds.splitlines()[0] == "Question: q?"
    assert ds.splitlines()[1] == "Document0 (Title: T0): word0 x x ..."            # clipped to 3 words
    assert ds.count("\nDocument") == 5 and ds.endswith(
        "Output their IDs (0, 1, …, 4) as comma-separated values strictly inside <id>...</id> tags.")
    # AG without documents drops the {doc_content} line; with them, one line per document
    assert jade.ag_messages("q?", [])[1]["content"] == ("Question: q?\nNow, generate the brief and accurate answer. "
                                                       "Output strictly inside <answer>...</answer> tags.")
    assert jade.ag_messages("q?", docs[:2])[1]["content"].count("\nDocument") == 2
    summ = jade.as_messages("Q0?", [("q1?", "a1"), ("q2?", "a2")])[1]["content"]
    assert summ.startswith("Original Question: Q0?\nSub-question 1: q1?\nAnswer: a1\nSub-question 2: q2?\nAnswer: a2\n"
                           "Now, answer the Original Question based on the observations.")
    # QR sees resolved answers only when there are some
    assert jade.qr_messages("q?")[1]["content"].startswith("Original Question: q?\n")
    assert jade.qr_messages("q?", [("q1?", "a1")])[1]["content"].startswith("Sub-question 1: q1?\nAnswer: a1\n"
                                                                            "Original Question: q?\n")
    with pytest.raises(ValueError, match="at least one candidate"):
        jade.ds_messages("q?", [])


# ---- the plan grammar ---------------------------------------------------------------------------------------------

VALID = ["QDS", "QDP", "AG", "QR,AG", "R,AG", "QR,R,AG", "R,DS,AG", "QR,R,DS,AG"]
INVALID = {
    "QDS,R,AG": "whole plan", "QDP,QDS": "whole plan", "R,QDP": "whole plan",        # decomposition alone
    "R": "last module must be AG", "R,DS": "last module must be AG", "AG,R": "last module must be AG",
    "DS,AG": "DS needs R", "DS,R,AG": "DS needs R",                                 # R before DS
    "R,R,AG": "repeats", "AG,AG": "repeats",
    "R,QR,AG": "out of the order",                                                  # QR first (official code)
    "R,X,AG": "unknown module 'X'", "RA,AG": "unknown module", "R,,AG": "empty module", "": "empty module",
}


@pytest.mark.parametrize("plan", VALID)
def test_valid_plans(plan):
    assert jade.validate_plan(plan.split(",")) == plan.split(",")
    assert jade.parse_plan(f"<workflow>{plan}</workflow>") == plan.split(",")


@pytest.mark.parametrize("plan,why", INVALID.items())
def test_invalid_plans_are_format_errors_naming_the_rule(plan, why):
    err = jade.parse_plan(f"<workflow>{plan}</workflow>")
    assert isinstance(err, FormatError) and why in err.reason


def test_plan_parser_tolerates_spacing_case_and_surrounding_text_but_needs_the_tags():
    assert jade.parse_plan("Sure!\n<workflow> r, ds ,ag </workflow> done") == ["R", "DS", "AG"]
    assert jade.parse_plan("<WORKFLOW>QDS</WORKFLOW><workflow>R,AG</workflow>") == ["QDS"]     # the first block
    for bad in ("R,DS,AG", "<workflow>R,AG", "workflow: R,AG", ""):
        assert isinstance(jade.parse_plan(bad), FormatError)
    assert jade.parse_plan("").reason == "empty output"


# ---- the executors' parsers ---------------------------------------------------------------------------------------

def test_parse_rewrite():
    assert jade.parse_rewrite("<query> Heritage of\n Fred Astaire </query>") == "Heritage of Fred Astaire"
    assert jade.parse_rewrite("<query></query>").reason == "empty <query>"
    assert isinstance(jade.parse_rewrite("Heritage of Fred Astaire"), FormatError)
    assert "longer than 100" in jade.parse_rewrite("<query>" + "w " * 101 + "</query>").reason


def test_parse_subquestions():
    text = ("<q1>Who is the actor that first performed Something's Gotta Give?</q1>\n"
            "<q2>What is the heritage of this actor?</q2>")
    assert jade.parse_subquestions(text) == ["Who is the actor that first performed Something's Gotta Give?",
                                             "What is the heritage of this actor?"]
    assert jade.parse_subquestions("<q1>a?</q1>") == ["a?"]
    assert "numbered [2, 3]" in jade.parse_subquestions("<q2>a?</q2><q3>b?</q3>").reason
    assert "numbered [1, 3]" in jade.parse_subquestions("<q1>a?</q1><q3>b?</q3>").reason
    assert "at most 4" in jade.parse_subquestions("".join(f"<q{i}>s{i}?</q{i}>" for i in range(1, 6))).reason
    assert jade.parse_subquestions("<q1>a?</q1><q2> A? </q2>").reason == "duplicate sub-questions"
    assert jade.parse_subquestions("<q1> </q1>").reason == "empty sub-question"
    assert isinstance(jade.parse_subquestions("1. a?\n2. b?"), FormatError)
    assert isinstance(jade.parse_subquestions("<q1>a?</q2>"), FormatError)          # mismatched tags


def test_parse_doc_ids_accepts_document_prefixes_and_bare_ids():
    assert jade.parse_doc_ids("<id>Document0, Document1, Document2, Document4</id>") == [0, 1, 2, 4]
    assert jade.parse_doc_ids("<id>0,4, 1</id>") == [0, 4, 1]
    assert jade.parse_doc_ids("<id>document 3, Document3, 3</id>") == [3]              # duplicates dropped
    assert jade.parse_doc_ids("<id></id>") == []                                       # nothing helpful (valid)
    assert "not a document id" in jade.parse_doc_ids("<id>Document0 and Document1</id>").reason
    assert isinstance(jade.parse_doc_ids("Document0, Document1"), FormatError)
    assert jade.check_doc_ids([0, 4], 5) == [0, 4]
    assert jade.check_doc_ids([0, 5], 5).reason == "document id 5 outside 0..4"


def test_parse_answer_and_its_fallback():
    assert jade.parse_answer("<answer>American</answer>") == "American"
    assert jade.parse_answer("The answer: <answer> 1982 </answer>.") == "1982"
    assert jade.parse_answer("<answer></answer>").reason == "empty <answer>"
    assert "longer than 40" in jade.parse_answer("<answer>" + "w " * 41 + "</answer>").reason
    assert isinstance(jade.parse_answer("<answer>Fred Astaire"), FormatError)          # cut off before </answer>
    assert jade.fallback_answer("<answer>Fred Astaire") == "Fred Astaire"
    assert jade.fallback_answer("\n  The answer is Paris.\nMore text") == "The answer is Paris."
    assert jade.fallback_answer("<answer></answer>") == "" and jade.fallback_answer("") == ""


# ---- Algorithm 1: the case studies of App. F replayed -------------------------------------------------------------

CASE1_Q = "Something's Gotta Give was first performed by an actor of what heritage?"
CASE2_Q = "when did canada become fully independent from britain?"
SUB1 = "Who is the actor that first performed Something's Gotta Give?"
SUB2 = "What is the heritage of this actor?"
REWRITE1, REWRITE2 = "Actor who first performed Something's Gotta Give", "Heritage of Fred Astaire"

PASSAGES = [
    ("Something's Gotta Give (song)", "Something's Gotta Give was written for and first performed by Fred Astaire "
                                      "in the 1955 musical film Daddy Long Legs"),
    ("Fred Astaire", "Fred Astaire was an American dancer of Austrian heritage"),
    ("Astaire family", "Fritz Austerlitz father of Fred Astaire came from Linz"),
    ("Adele Astaire", "Adele Astaire sister of Fred danced with him on Broadway"),
    ("Astaire heritage", "Fred Astaire heritage American born in Omaha Nebraska"),
    ("Canada Act 1982", "The Canada Act 1982 made canada fully independent from britain"),
    ("Statute of Westminster", "The Statute of Westminster 1931 gave canada legislative independence from britain"),
    ("Patriation", "Patriation of the canadian constitution from britain in 1982"),
    ("British North America", "Confederation of canada in 1867 under britain"),
    ("Constitution Act", "The Constitution Act 1982 of canada"),
]


def case_reply(role: str, m) -> str:
    """The outputs shown in App. F for both case studies, keyed by role and question."""
    q, user = question_of(m), m[-1]["content"]
    if role == jade.PLANNER:
        return {CASE1_Q: "<workflow>QDS</workflow>", REWRITE1: "<workflow>R,AG</workflow>",
                REWRITE2: "<workflow>R,DS,AG</workflow>", CASE2_Q: "<workflow>R,DS,AG</workflow>"}[q]
    if role == jade.QDS:
        assert q == CASE1_Q
        return f"<q1>{SUB1}</q1>\n<q2>{SUB2}</q2>"
    if role == jade.QR:
        if q == SUB1:
            return f"<query>{REWRITE1}</query>"
        assert q == SUB2 and f"Sub-question 1: {REWRITE1}\nAnswer: Fred Astaire" in user   # the resolved answer
        return f"<query>{REWRITE2}</query>"
    if role == jade.DS:
        return {REWRITE2: "<id>Document0, Document1, Document2, Document4</id>",
                CASE2_Q: "<id>Document0, Document1, Document4</id>"}[q]
    if role == jade.AG:
        assert "Document0" in user                                     # answers from retrieved evidence
        return {REWRITE1: "<answer>Fred Astaire</answer>", REWRITE2: "<answer>American</answer>",
                CASE2_Q: "<answer>1982</answer>"}[q]
    if role == jade.AS:
        assert q == CASE1_Q and "Answer: American" in user
        return "<answer>American</answer>"
    raise AssertionError(role)


def case_rows(copies: int = 1) -> list[dict]:
    return [r for k in range(copies) for r in (
        {"id": f"c1-{k}", "question": CASE1_Q, "golden_answers": ["American"]},
        {"id": f"c2-{k}", "question": CASE2_Q, "golden_answers": ["1982"]})]


def test_case_studies_replayed_give_the_traces_of_the_paper(tmp_path):
    eng, ret = ScriptedEngine(case_reply), KeywordRetriever(PASSAGES)
    c1, c2 = run_jade(case_rows(), Team(eng), ret, JadeConfig(top_k=5))
    # Case 1: QDS at the root; each sub-question rewritten (with the answers so far), planned, solved; AS answers
    assert [c.role for c in c1.calls] == [jade.PLANNER, jade.QDS, jade.QR, jade.PLANNER, jade.AG, jade.QR,
                                          jade.PLANNER, jade.DS, jade.AG, jade.AS]
    assert [p["plan"] for p in c1.meta["plans"]] == ["QDS", "R,AG", "R,DS,AG"]
    assert c1.final_answer == "American" and c1.meta["stop_reason"] == "answered"
    root, n1, n2 = c1.meta["trace"]
    assert root["expanded"] and root["answer"] is None and root["query"] == CASE1_Q
    assert (n1["query"], n1["asked"], n1["answer"], n1["kind"]) == (REWRITE1, SUB1, "Fred Astaire", "serial")
    assert (n2["query"], n2["asked"], n2["answer"], n2["parent"]) == (REWRITE2, SUB2, "American", 0)
    assert c1.queries == [REWRITE1, REWRITE2]                         # R searched with the rewrites
    assert c1.calls[3].retrieved_ids == c1.retrieved_ids[0]           # ids on the call whose output R used (plan)
    assert c1.calls[2].meta["stage"] == "pre_plan"
    ds, ag = c1.calls[7], c1.calls[8]
    assert ds.parsed == [0, 1, 2, 4] and ds.meta["selected_ids"] == [c1.retrieved_ids[1][i] for i in (0, 1, 2, 4)]
    assert ag.prompt[1]["content"].count("\nDocument") == 4           # AG reads DS's selection only
    assert c1.meta["workflow"] == {"rounds": 3, "retrievals": 2, "ds_calls": 1, "plans": 3, "plans_decompose": 1,
                                   "decomposed": 1, "max_rounds_hit": 0}
    # Case 2: one Plan-Solve round, no AS (the paper's trace ends at AG)
    assert [c.role for c in c2.calls] == [jade.PLANNER, jade.DS, jade.AG]
    assert c2.final_answer == "1982" and c2.calls[1].parsed == [0, 1, 4] and c2.meta["rounds"] == 1
    assert c2.meta["workflow"]["decomposed"] == 0 and c2.cost["retrieval_calls"] == 1
    assert all(c.format_error is None for e in (c1, c2) for c in e.calls)
    assert c1.cost["llm_calls"] == 10 and c1.meta["format_errors"] == 0
    write_episodes(tmp_path / "e.jsonl", [c1, c2])                    # the records round-trip
    assert read_episodes(tmp_path / "e.jsonl")[0].meta["trace"] == c1.meta["trace"]


def test_episodes_at_different_nodes_and_modules_advance_together():
    """Case 1 and Case 2 interleave: every engine call holds one role, whatever node each episode is at."""
    one = ScriptedEngine(case_reply)
    run_jade(case_rows(1), Team(one), KeywordRetriever(PASSAGES), JadeConfig(top_k=5))
    assert one.log == [(jade.PLANNER, 2), (jade.QDS, 1), (jade.QR, 1), (jade.DS, 1), (jade.PLANNER, 1),
                       (jade.AG, 1), (jade.AG, 1), (jade.QR, 1), (jade.PLANNER, 1), (jade.DS, 1), (jade.AG, 1),
                       (jade.AS, 1)]
    many, ret = ScriptedEngine(case_reply), KeywordRetriever(PASSAGES)
    team = Team(many)
    eps = run_jade(case_rows(3), team, ret, JadeConfig(top_k=5))
    assert many.log == [(role, 3 * n) for role, n in one.log]         # same steps, three times the batch
    assert [len(b) for b in ret.log] == [3, 3, 3]                     # one batch_search per retrieval step
    assert team.calls[jade.PLANNER] == 3 and team.calls[jade.AG] == 3
    assert [e.final_answer for e in eps] == ["American", "1982"] * 3


# ---- fallbacks and limits -----------------------------------------------------------------------------------------

ROWS = [{"id": "x", "question": "What is the capital of Francia?", "golden_answers": ["Paris"]}]
FRANCE = KeywordRetriever([("Francia", "Paris is the capital of Francia"), ("Rome", "Rome capital Italy"),
                           ("Berlin", "Berlin capital Germany")])


def scripted(**by_role):
    def reply(role, m):
        out = by_role[role]
        return out(m) if callable(out) else out
    return reply


def test_malformed_plan_falls_back_to_retrieve_and_answer():
    eng = ScriptedEngine(scripted(**{jade.PLANNER: "I would retrieve then answer.", jade.AG: "Paris, I think"}))
    (ep,) = run_jade(ROWS, Team(eng), FRANCE, JadeConfig(top_k=3))
    plan, ag = ep.calls
    assert plan.format_error.startswith("no <workflow>") and plan.meta["fallback"] == "R,AG"
    assert ep.meta["plans"] == [{"round": 1, "node": 0, "plan": "R,AG", "fallback": True}]
    assert ag.format_error and ag.meta["fallback"] == "Paris, I think" and ep.final_answer == "Paris, I think"
    assert ep.queries == [ROWS[0]["question"]] and ep.meta["format_errors"] == 2


def test_malformed_decomposition_solves_the_node_in_the_same_round():
    eng = ScriptedEngine(scripted(**{jade.PLANNER: "<workflow>QDP</workflow>", jade.QDP: "1. capital?\n2. Francia?",
                                     jade.AG: "<answer>Paris</answer>"}))
    (ep,) = run_jade(ROWS, Team(eng), FRANCE, JadeConfig(top_k=3))
    assert [c.role for c in ep.calls] == [jade.PLANNER, jade.QDP, jade.AG]
    assert ep.calls[1].format_error and ep.calls[1].meta["fallback"] == "R,AG"
    assert ep.final_answer == "Paris" and ep.meta["rounds"] == 1 and ep.meta["workflow"]["decomposed"] == 0
    assert ep.cost["retrieval_calls"] == 1 and len(ep.meta["trace"]) == 1


def test_document_selector_out_of_range_keeps_every_candidate_and_in_plan_qr_searches():
    eng = ScriptedEngine(scripted(**{jade.PLANNER: "<workflow>QR,R,DS,AG</workflow>",
                                     jade.QR: "<query>capital Francia</query>", jade.DS: "<id>Document7</id>",
                                     jade.AG: "<answer>Paris</answer>"}))
    (ep,) = run_jade(ROWS, Team(eng), FRANCE, JadeConfig(top_k=3))
    qr, ds, ag = ep.calls[1:]
    assert ep.queries == ["capital Francia"] and qr.retrieved_ids == ep.retrieved_ids[0]
    assert ds.format_error == "document id 7 outside 0..2" and ds.parsed is None and ds.meta["rejected"] == [7]
    assert ag.prompt[1]["content"].count("\nDocument") == 3 and ag.prompt[1]["content"].startswith(
        "Question: What is the capital of Francia?")                  # AG answers the node's question, not QR's
    assert ep.meta["workflow"]["ds_calls"] == 1


def test_selector_is_skipped_without_candidates_and_empty_outputs_never_crash():
    eng = ScriptedEngine(scripted(**{jade.PLANNER: "<workflow>R,DS,AG</workflow>", jade.AG: ""}))
    rows = [{"id": "y", "question": "zzz qqq?", "golden_answers": ["a"]}]
    (ep,) = run_jade(rows, Team(eng), FRANCE, JadeConfig(top_k=3))    # no passage shares a word: no candidates
    assert [c.role for c in ep.calls] == [jade.PLANNER, jade.AG] and ep.meta["ds_skipped"] == [{"round": 1, "node": 0}]
    assert ep.final_answer == "" and ep.calls[1].format_error == "empty output"
    assert "Document" not in ep.calls[1].prompt[1]["content"]


def test_endless_decomposition_stops_at_the_round_limit_with_the_reason_recorded():
    def qds(m):
        return f"<q1>part of {question_of(m)}</q1>"                   # every node decomposes into one more node
    eng = ScriptedEngine(scripted(**{jade.PLANNER: "<workflow>QDS</workflow>", jade.QDS: qds, jade.QR: "junk",
                                     jade.AS: "<answer>unknown</answer>"}))
    (ep,) = run_jade(ROWS, Team(eng), FRANCE, JadeConfig(max_rounds=3))
    assert ep.meta["stop_reason"] == "max_rounds" and ep.meta["rounds"] == 3
    assert ep.meta["workflow"]["max_rounds_hit"] == 1 and ep.meta["workflow"]["plans_decompose"] == 3
    assert [n["kind"] for n in ep.meta["trace"]] == ["root", "serial", "serial", "serial"]
    assert [n["parent"] for n in ep.meta["trace"]] == [None, 0, 1, 2]
    assert ep.calls[-1].role == jade.AS and ep.final_answer == "unknown"
    assert "Sub-question" not in ep.calls[-1].prompt[1]["content"]    # nothing was answered
    qrs = [c for c in ep.calls if c.role == jade.QR]
    assert len(qrs) == 2 and all(c.meta["stage"] == "pre_plan" and c.format_error for c in qrs)


def test_parallel_sub_questions_are_solved_in_order_without_a_rewrite_and_nested_ones_first():
    def plan(m):
        return "<workflow>QDP</workflow>" if question_of(m) in (ROWS[0]["question"], "B?") else "<workflow>AG</workflow>"

    def ag(m):
        return f"<answer>ans {question_of(m)}</answer>"
    eng = ScriptedEngine(scripted(**{jade.PLANNER: plan, jade.QDP: lambda m: {
        ROWS[0]["question"]: "<q1>A?</q1><q2>B?</q2><q3>C?</q3>", "B?": "<q1>B1?</q1><q2>B2?</q2>"}[question_of(m)],
        jade.AG: ag, jade.AS: "<answer>Paris</answer>"}))
    (ep,) = run_jade(ROWS, Team(eng), FRANCE, JadeConfig(max_rounds=6))      # 2 decompositions + 4 leaves
    assert [n["query"] for n in ep.meta["trace"]] == [ROWS[0]["question"], "A?", "B?", "B1?", "B2?", "C?"]
    assert [n["answer"] for n in ep.meta["trace"]] == [None, "ans A?", None, "ans B1?", "ans B2?", "ans C?"]
    assert jade.QR not in {c.role for c in ep.calls} and ep.meta["rounds"] == 6
    assert ep.calls[-1].prompt[1]["content"].count("Sub-question") == 4      # AS sees the answered nodes
    assert ep.meta["workflow"]["retrievals"] == 0 and ep.final_answer == "Paris"
    assert ep.meta["stop_reason"] == "answered"
    (short,) = run_jade(ROWS, Team(eng), FRANCE, JadeConfig(max_rounds=5))
    assert short.meta["stop_reason"] == "max_rounds" and short.meta["trace"][-1]["answer"] is None


@pytest.mark.slow
def test_smollm2_runs_jade_end_to_end_and_every_malformed_call_falls_back(smollm2_dir, shared_data):
    """The real 135M model: it rarely follows the tag formats, so this exercises the fallbacks, never a crash."""
    corpus = [json.loads(x) for x in (shared_data / "corpus" / "mini_wiki.jsonl").read_text().splitlines()]
    rows = load_qa(shared_data / "benchmarks" / "hotpotqa" / "dev.jsonl")[:2]
    team = Team(smollm2_engine(str(smollm2_dir)), {"default": SamplingConfig(max_new_tokens=8)})
    eps = run_jade(rows, team, Bm25Retriever(corpus), JadeConfig(max_rounds=2, top_k=2, passage_words=15))
    for ep in eps:
        assert isinstance(ep.final_answer, str) and ep.meta["stop_reason"] in ("answered", "max_rounds")
        assert ep.calls[0].role == jade.PLANNER and ep.cost["llm_calls"] == len(ep.calls)
        assert all(c.prompt_tokens > 0 and c.completion_tokens > 0 for c in ep.calls)
        assert all("fallback" in c.meta for c in ep.calls if c.format_error)
        assert 1 <= ep.meta["rounds"] <= 2 and len(ep.meta["plans"]) == ep.meta["rounds"]


def test_base_model_experiment_counts_format_errors_per_role():
    """studies/jade_base_model/jade_base_model.py: every role's prompt once per question, malformed outputs counted per role."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "jade_base_model", Path(__file__).resolve().parents[1] / "studies" / "jade_base_model" / "jade_base_model.py")
    exp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exp)
    good = {jade.PLANNER: "<workflow>R,AG</workflow>", jade.QR: "<query>q</query>", jade.QDS: "<q1>a?</q1>",
            jade.QDP: "1. a?", jade.DS: "<id>0</id>", jade.AG: "Paris", jade.AS: "<answer>x</answer>"}
    eng = ScriptedEngine(scripted(**good))
    probe = exp.probe_roles(Team(eng), [ROWS[0]["question"], "zzz?"], FRANCE, JadeConfig(top_k=2))
    assert {r: (p["prompts"], p["format_errors"]) for r, p in probe.items()} == {
        jade.PLANNER: (2, 0), jade.QR: (2, 0), jade.QDS: (2, 0), jade.QDP: (2, 2), jade.DS: (1, 0),   # "zzz?": no docs
        jade.AG: (2, 2), jade.AS: (2, 0)}
    assert [r for r, _ in eng.log] == list(probe) and probe[jade.AG]["example"] == "Paris"
    eps = run_jade(ROWS, Team(ScriptedEngine(scripted(**good))), FRANCE, JadeConfig(top_k=2))
    assert exp.per_role_errors(eps) == {jade.PLANNER: {"calls": 1, "format_errors": 0},
                                        jade.AG: {"calls": 1, "format_errors": 1}}
