"""IRCoT and SuRe (FlashRAG's versions) with scripted engines: every branch, batching, records and fallbacks."""
import re

import pytest
from helpers_agents import KeywordRetriever

from ragteam.agents import ircot, sure
from ragteam.agents.core import FormatError
from ragteam.eval.evaluate import ROLES, SystemSpec, WorkflowConfigs, run_system
from ragteam.llm import Completion, Team
from ragteam.retrieval.base import Hit

PASSAGES = [("Ann Lee", "Ann Lee was born in Paris."), ("Paris", "Paris is a city in France."),
            ("Bob Ray", "Bob Ray was born in Rome."), ("Rome", "Rome is a city in Italy."),
            ("Cy Dow", "Cy Dow is a painter."), ("Oslo", "Oslo is a city in Norway.")]
ROWS = [{"id": "a", "question": "Where was Ann Lee born?", "golden_answers": ["Paris"]},
        {"id": "b", "question": "In which country was Bob Ray born?", "golden_answers": ["Italy"]},
        {"id": "c", "question": "What does Cy Dow paint?", "golden_answers": ["portraits"]}]


class RoleEngines:
    """A Team's engines, one per role, each replying reply(role, messages); logs (role, batch size) per call.

    (IRCoT's and SuRe's prompts are not routed by helpers_agents.role_of: SuRe's have no system prompt.)
    """

    def __init__(self, reply):
        self.reply, self.log = reply, []

    def __call__(self, role):
        outer = self

        class _Engine:
            model_path = "scripted"

            def generate(self, prompts, sampling):
                outer.log.append((role, len(prompts)))
                return [[Completion(outer.reply(role, m), 10, 5, "stop")] * sampling.n for m in prompts]

        return _Engine()

    def steps(self, role):
        return [n for r, n in self.log if r == role]


def _question(msgs) -> str:
    return re.findall(r"Question: (.*)", msgs[-1]["content"])[-1].strip()


# ---- IRCoT ----------------------------------------------------------------------------------------------------------

def _ircot_reply(role, msgs):
    assert role == ircot.ROLE and msgs[0]["content"] == ircot.IRCOT_SYSTEM
    q, first = _question(msgs), msgs[-1]["content"].endswith("\nThought:")  # no thought written yet
    if q.startswith("Where was Ann"):                   # answers at its first thought
        return "Ann Lee was born in Paris. So the answer is: Paris."
    if q.startswith("In which country"):                # needs one retrieval with its thought
        return ("Bob Ray was born in Rome." if first else
                "Rome is a city in Italy. So the answer is: Italy")
    return "Cy Dow is a painter"                        # never concludes


def test_ircot_stops_at_the_answer_or_after_max_iterations_one_call_per_step():
    eng, ret = RoleEngines(_ircot_reply), KeywordRetriever(PASSAGES)
    cfg = ircot.IRCoTConfig(top_k=2, max_iterations=3, max_chunks=20)
    eps = ircot.run_ircot(ROWS, Team(eng), ret, cfg, system="ircot")
    a, b, c = eps
    assert eng.steps(ircot.ROLE) == [3, 2, 1]           # every unfinished question in one call per iteration
    assert len(ret.log) == 3 and ret.log[0] == [r["question"] for r in ROWS]
    assert ret.log[1] == ["Bob Ray was born in Rome.", "Cy Dow is a painter"]
    assert ret.log[2] == ["Cy Dow is a painter"]        # no retrieval after the last allowed thought
    assert (a.final_answer, a.meta["stop_reason"], a.meta["iterations"]) == ("Paris.", "answer", 1)
    assert (b.final_answer, b.meta["stop_reason"], b.meta["iterations"]) == ("Italy", "answer", 2)
    assert c.meta["stop_reason"] == "max_iterations" and c.meta["iterations"] == 3
    assert c.final_answer == "Cy Dow is a painter Cy Dow is a painter Cy Dow is a painter"  # FlashRAG's fallback
    assert "answer_format_error" in c.meta and "answer_format_error" not in a.meta
    assert b.queries == [ROWS[1]["question"], "Bob Ray was born in Rome."]
    assert b.calls[0].retrieved_ids == b.retrieved_ids[1]  # the thought's call records what it retrieved
    assert [x.cost["llm_calls"] for x in eps] == [1, 2, 3]
    assert [x.cost["retrieval_calls"] for x in eps] == [1, 2, 3]


def test_ircot_prompt_carries_thoughts_and_passages_by_ascending_best_score():
    seen = []

    def reply(role, msgs):
        seen.append(msgs)
        return "Ann Lee was born in Paris, France."

    ircot.run_ircot(ROWS[1:2], Team(RoleEngines(reply)), KeywordRetriever(PASSAGES),
                    ircot.IRCoTConfig(top_k=2, max_iterations=2), system="ircot")
    first, second = (m[-1]["content"] for m in seen)
    # the question's hits (scores = shared words): Bob Ray 5, Ann Lee 3 -> ascending, the best passage last
    assert re.findall(r"Wikipedia Title: (.*)", first) == ['"Ann Lee"', '"Bob Ray"']
    assert second.endswith("Question: In which country was Bob Ray born?\nThought: Ann Lee was born in Paris, France.")
    # the thought's hits: Ann Lee 6 (its best score now), Paris 3 -> Paris 3, Bob Ray 5, Ann Lee 6
    assert re.findall(r"Wikipedia Title: (.*)", second) == ['"Paris"', '"Bob Ray"', '"Ann Lee"']


def test_ircot_prompt_text_is_flashrags():
    hit = Hit("0", '"Ann Lee"\nAnn Lee was born in Paris.', 1.0)
    msgs = ircot.ircot_messages("Where?", [hit], [])
    assert msgs[0]["content"].startswith("You serve as an intelligent assistant")
    assert msgs[0]["content"].endswith("So the answer is: no.\n\n")
    assert msgs[1]["content"] == 'Wikipedia Title: "Ann Lee"\nAnn Lee was born in Paris.\n\nQuestion: Where?\nThought:'
    assert ircot.ircot_messages("Where?", [hit], ["t1.", "t2."])[1]["content"].endswith("\nThought: t1. t2.")


def test_ircot_evidence_cap_and_empty_thought_fallback():
    eng = RoleEngines(lambda role, m: "" if _question(m).startswith("Where") else "Bob Ray was born in Rome.")
    ret = KeywordRetriever(PASSAGES)
    eps = ircot.run_ircot(ROWS[:2], Team(eng), ret, ircot.IRCoTConfig(top_k=2, max_iterations=2, max_chunks=2), system="ircot")
    empty, capped = eps
    assert empty.calls[0].format_error == "empty thought" and empty.meta["stop_reason"] == "empty_thought"
    assert empty.final_answer == "" and empty.cost["retrieval_calls"] == 1  # nothing retrieved with nothing
    assert ret.log[1] == ["Bob Ray was born in Rome."]                       # only the other question searched
    assert sum(len(x) for x in capped.retrieved_ids) == 2                    # the cap holds: no third passage


def test_ircot_parsers():
    assert ircot.parse_ircot_answer(["a.", "So the answer is: Rome. So the answer is: x"]) == "Rome."
    assert isinstance(ircot.parse_ircot_answer(["no conclusion"]), FormatError)
    assert ircot.parse_thought("  two\n lines ") == "two lines"
    assert isinstance(ircot.parse_thought(" \n "), FormatError)


# ---- SuRe -----------------------------------------------------------------------------------------------------------

def _sure_reply(role, msgs):
    text = msgs[-1]["content"]
    assert len(msgs) == 1 and msgs[0]["role"] == "user"   # FlashRAG: one user turn, no system prompt
    if role == "candidate_generator":
        q = _question(msgs)
        return {"Where was Ann Lee born?": "(a) Paris, (b) Rome",
                "In which country was Bob Ray born?": "(a) France\n(b) Italy\n(c) Norway"}.get(q, "I cannot say")
    if role == "summarizer":
        pred = re.search(r"Prediction: (.*)", text).group(1)
        return "" if pred == "Norway" else f"The passages say {pred}. [DONE] trailing text"
    if role == "verifier":
        pred = re.search(r"Prediction: (.*)", text).group(1)
        return {"Paris": "True", "Rome": "False", "France": "True", "Italy": "True"}.get(pred, "maybe")
    if role == "ranker":
        s1 = re.search(r"Passage 1: (.*)", text).group(1)
        if "Paris" in s1 or "Italy" in s1:
            return "Passage 1"
        return "Passage 2" if "France" in s1 or "Rome" in s1 else "I cannot tell"
    raise AssertionError(role)


def test_sure_picks_the_best_supported_candidate_with_batched_steps():
    eng, ret = RoleEngines(_sure_reply), KeywordRetriever(PASSAGES)
    eps = sure.run_sure(ROWS, Team(eng), ret, sure.SuReConfig(top_k=2), system="sure")
    a, b, c = eps
    # one call per step over every question, candidate and ordered pair: 2 + 3 candidates, 2 + 6 pairs
    assert eng.log == [("candidate_generator", 3), ("summarizer", 5), ("verifier", 5), ("ranker", 8)]
    assert len(ret.log) == 1
    assert a.final_answer == "Paris" and a.meta["scores"] == [2.0, 0.0]  # Paris: valid 1 + won as Passage 1
    # Italy: valid 1 + 2 wins shown first; France: valid 1 + 0 (loses both times it is Passage 1);
    # Norway: empty summary (fallback), no True/False (0), its two pairs undecided (0.5 each)
    assert b.meta["candidates"] == ["France", "Italy", "Norway"]
    assert b.meta["scores"] == [1.0, 3.0, 1.0] and b.final_answer == "Italy"
    assert b.meta["summaries"][0] == "The passages say France." and b.meta["summaries"][2] == ""
    errs = [x.format_error for x in b.calls if x.format_error]
    assert "empty summary" in errs and any("True/False" in e for e in errs) and any("Passage 1" in e for e in errs)
    # no candidate parsed: FlashRAG's empty answer, and no further calls for that question
    assert c.final_answer == "" and c.meta["candidates"] == [] and len(c.calls) == 1
    assert c.calls[0].format_error.startswith("no '(a) ...' candidate")
    assert [x.cost["llm_calls"] for x in eps] == [1 + 2 + 2 + 2, 1 + 3 + 3 + 6, 1]


def test_sure_ranking_tie_goes_to_the_first_candidate_and_only_first_position_counts():
    best, totals = sure.pick([1, 1], {(0, 1): 0.5, (1, 0): 0.5})
    assert (best, totals) == (0, [1.5, 1.5])
    best, totals = sure.pick([0, 0], {(0, 1): 0.0, (1, 0): 0.0})  # both say "Passage 2": nobody is credited
    assert (best, totals) == (0, [0.0, 0.0])
    assert sure.pick([0, 1, 1], {}) == (1, [0, 1, 1])


def test_sure_max_candidates_bounds_the_pairs():
    eng = RoleEngines(_sure_reply)
    eps = sure.run_sure(ROWS[1:2], Team(eng), KeywordRetriever(PASSAGES), sure.SuReConfig(top_k=2, max_candidates=2), system="sure")
    assert eps[0].meta["candidates"] == ["France", "Italy"] and eng.steps("ranker") == [2]


def test_sure_prompts_and_parsers():
    hit = Hit("0", '"Ann Lee"\nAnn Lee was born in Paris.', 1.0)
    ref = sure.reference([hit])
    assert ref == 'Passage #1 Title: "Ann Lee"\nPassage #1 Text: Ann Lee was born in Paris.\n\n'
    assert sure.candidates_messages("Q?", ref, 1)[0]["content"] == (
        "Below are 1 passages related to the question at the end. After readingthe passages, provide two correct "
        "candidates for the answer to thequestion at the end. Each answer should be in the form: (a) xx, (b)yy, and "
        "should not exceed 3 words for each candidate.\n\n" + ref + "Question: Q?\nAnswer:")
    assert sure.parse_candidates("(a) New York, (b) Paris,\n(c) ") == ["New York", "Paris"]
    assert sure.parse_candidates("(a) 1,000 (b) two\nmore text") == ["1000", "two"]
    assert isinstance(sure.parse_candidates("Paris"), FormatError)
    assert sure.parse_summary("text [DONE] more") == "text"
    assert isinstance(sure.parse_summary("[DONE]"), FormatError)
    assert sure.parse_validation(" TRUE.") == 1 and sure.parse_validation("False") == 0
    assert isinstance(sure.parse_validation("yes"), FormatError)
    assert sure.parse_ranking("passage 1 is better than Passage 2") == 1.0
    assert sure.parse_ranking("Passage 2") == 0.0 and isinstance(sure.parse_ranking("both"), FormatError)


# ---- registered as eval systems --------------------------------------------------------------------------------------

@pytest.mark.parametrize("workflow", ["ircot", "sure"])
def test_eval_runs_and_scores_the_new_workflows(workflow):
    reply = _ircot_reply if workflow == "ircot" else _sure_reply
    eng = RoleEngines(reply)
    eps = run_system(SystemSpec(workflow=workflow), ROWS, Team(eng), KeywordRetriever(PASSAGES), WorkflowConfigs(),
                     workflow)
    assert {r for r, _ in eng.log} == set(ROLES[workflow])
    assert eps[0].metrics["em"] == 1.0 and eps[0].system == workflow


@pytest.mark.slow
def test_ircot_and_sure_with_smollm2_over_the_shared_corpus(smollm2_dir, shared_data):
    """The real model and BM25 over the shared mini-Wikipedia: both workflows finish with well-formed records."""
    import json

    from helpers_agents import Bm25Retriever, smollm2_engine

    from ragteam.data.formats import load_qa
    from ragteam.llm import SamplingConfig

    corpus = [json.loads(x) for x in (shared_data / "corpus" / "mini_wiki.jsonl").read_text().splitlines()]
    rows = load_qa(shared_data / "benchmarks" / "hotpotqa" / "dev.jsonl")[:1]
    small = SamplingConfig(max_new_tokens=8)
    team = Team(smollm2_engine(str(smollm2_dir)), {"default": small, "verifier": SamplingConfig(max_new_tokens=3),
                                                   "ranker": SamplingConfig(max_new_tokens=4)})
    ret = Bm25Retriever(corpus[:3000])  # the first 3000 passages hold these questions' HotpotQA contexts
    eps = ircot.run_ircot(rows, team, ret, ircot.IRCoTConfig(top_k=2, max_iterations=2, passage_words=20), system="ircot")
    for e in eps:
        assert 1 <= e.meta["iterations"] <= 2 and isinstance(e.final_answer, str)
        assert e.calls[0].prompt[1]["content"].startswith("Wikipedia Title: ")
        assert all(c.role == ircot.ROLE and c.completion_tokens > 0 for c in e.calls)
    eps = sure.run_sure(rows, team, ret, sure.SuReConfig(top_k=2, max_candidates=2, passage_words=20), system="sure")
    for e in eps:
        assert e.calls[0].role == "candidate_generator" and isinstance(e.final_answer, str)
        n = len(e.meta["candidates"])
        assert [c.role for c in e.calls] == (["candidate_generator"] + ["summarizer"] * n + ["verifier"] * n
                                             + ["ranker"] * (n * (n - 1)))
        assert e.final_answer in e.meta["candidates"] or (n == 0 and e.final_answer == "")
