"""Workflow control flow with a scripted engine: rounds, judge stops, evidence cap, fallbacks, batching, records."""
import re

import pytest
from helpers_agents import DrawingEngine, KeywordRetriever, ScriptedEngine, n_queries, question_of

from ragteam.agents import maps
from ragteam.agents.baselines import BaselineConfig, run_iter_retgen, run_native, run_standard_rag
from ragteam.agents.debate import DebateConfig, debate_snapshots, run_debate
from ragteam.agents.maps_workflow import MapsConfig, run_maps
from ragteam.llm import Completion, Team
from ragteam.records import read_episodes, write_episodes


def corpus(n_questions: int, n_rounds: int, per_query: int) -> KeywordRetriever:
    """Passages that only the query `q{i}r{r}` finds (per_query of them), so every round adds new chunks."""
    return KeywordRetriever([(f"Q{i}R{r}D{j}", f"passage about q{i}r{r} number {j}")
                             for i in range(n_questions) for r in range(n_rounds + 1) for j in range(per_query)])


def rows(n: int) -> list[dict]:
    return [{"id": f"id{i}", "question": f"What is q{i}r0 ?", "golden_answers": [f"ans{i}"]} for i in range(n)]


def qidx(messages) -> int:
    return int(re.search(r"q(\d+)r0", question_of(messages)).group(1))


def maps_reply(stop_after: dict[int, int], answer: str = "ans{i}"):
    """Query agent asks for the next round's keyword; the judge says sufficient once round stop_after[i] is done."""
    def reply(role, m):
        i, pooled = qidx(m), n_queries(m)
        if role == "query_agent":
            return f"q{i}r{pooled}"          # pool holds rounds 0..pooled-1: ask for round `pooled`
        if role == "judge_agent":
            return maps.SUFFICIENT if pooled - 1 >= stop_after[i] else maps.INSUFFICIENT
        if role == "answer_agent":
            return answer.format(i=i)
        raise AssertionError(role)
    return reply


def per_question(draws):
    """DrawingEngine's draws: draws[i] for question i."""
    return lambda m: draws[qidx(m)]


def test_maps_judge_sufficient_at_round_k_gives_exactly_k_rounds_and_batches_every_step():
    stop_after = {0: 1, 1: 2, 2: 3, 3: 99}   # question 3 never satisfies the judge -> the round budget (4)
    eng, ret = ScriptedEngine(maps_reply(stop_after)), corpus(4, 5, 2)
    team = Team(eng)
    eps = run_maps(rows(4), team, ret, MapsConfig(max_rounds=4, top_k=2, judge_initial=False), system="maps")
    assert [e.meta["rounds"] for e in eps] == [1, 2, 3, 4]
    assert [e.meta["stop_reason"] for e in eps] == ["judge_sufficient"] * 3 + ["round_budget"]
    # one engine call per step over every episode still at that step, never one prompt at a time
    assert eng.steps("query_agent") == [4, 3, 2, 1]
    assert eng.steps("judge_agent") == [4, 3, 2]          # no verdict after the last budgeted round
    assert eng.steps("answer_agent") == [4]
    assert [len(q) for q in ret.log] == [4, 4, 3, 2, 1]   # one batched retrieval per step
    assert team.calls == {"query_agent": 4, "judge_agent": 3, "answer_agent": 1}
    for i, ep in enumerate(eps):
        k = ep.meta["rounds"]
        assert ep.queries == [ep.question] + [f"q{i}r{r}" for r in range(1, k + 1)]   # question is query 1
        assert [c.role for c in ep.calls].count("query_agent") == k
        assert ep.final_answer == f"ans{i}" and ep.cost["retrieval_calls"] == k + 1
        assert all(len(ids) == 2 for ids in ep.retrieved_ids)
    # the answer agent sees the final pool, in the paper's layout
    answer_prompt = eps[2].calls[-1].prompt[0]["content"]
    assert n_queries(eps[2].calls[-1].prompt) == 4 and answer_prompt.count('Doc 1(Title: "Q2R3D0")') == 1


def test_maps_judge_decides_on_the_initial_retrieval_as_in_the_paper_case_studies():
    """judge_initial (default, MAPS Tables 4-5: "Retrieval Round 0 ... Judge Agent"): a question whose first pool
    the judge finds sufficient is answered with 0 rounds and no query agent call; the others go on, judged after
    every round but the last."""
    stop_after = {0: 0, 1: 1, 2: 99}
    eng, ret = ScriptedEngine(maps_reply(stop_after)), corpus(3, 4, 1)
    eps = run_maps(rows(3), Team(eng), ret, MapsConfig(max_rounds=2, top_k=1), system="maps")
    assert [e.meta["rounds"] for e in eps] == [0, 1, 2]
    assert [e.meta["stop_reason"] for e in eps] == ["judge_sufficient", "judge_sufficient", "round_budget"]
    assert eng.steps("judge_agent") == [3, 2] and eng.steps("query_agent") == [2, 1]
    assert [c.role for c in eps[0].calls] == ["judge_agent", "answer_agent"]
    assert [c.meta.get("round") for c in eps[1].calls] == [0, 1, 1, None]      # judge, query, judge, answer
    # off: a round always runs before the first verdict
    eng = ScriptedEngine(maps_reply(stop_after))
    eps = run_maps(rows(3), Team(eng), corpus(3, 4, 1), MapsConfig(max_rounds=2, top_k=1, judge_initial=False), system="maps")
    assert [e.meta["rounds"] for e in eps] == [1, 1, 2] and eng.steps("judge_agent") == [3]


def test_maps_caps_evidence_at_20_chunks():
    eng, ret = ScriptedEngine(maps_reply({0: 99, 1: 99})), corpus(2, 6, 8)
    eps = run_maps(rows(2), Team(eng), ret, MapsConfig(max_rounds=5, top_k=8, max_chunks=20, judge_initial=False), system="maps")
    for ep in eps:
        assert [len(ids) for ids in ep.retrieved_ids] == [8, 8, 4]     # 8 + 8 + 4 = 20, then stop
        assert ep.meta["rounds"] == 2 and ep.meta["stop_reason"] == "evidence_cap"
        assert ep.calls[-1].prompt[0]["content"].count("\nDoc ") == 20
    assert eng.steps("judge_agent") == [2]     # round 2 reached the cap: no verdict could change anything


def test_maps_fixed_rounds_skips_the_judge():
    eng = ScriptedEngine(maps_reply({0: 1, 1: 1, 2: 1}))
    eps = run_maps(rows(3), Team(eng), corpus(3, 4, 1), MapsConfig(max_rounds=3, top_k=1, fixed_rounds=3), system="maps")
    assert [e.meta["rounds"] for e in eps] == [3, 3, 3] and eng.steps("judge_agent") == []
    assert eng.steps("query_agent") == [3, 3, 3]


def test_maps_format_errors_use_the_documented_fallbacks():
    def reply(role, m):
        return {"query_agent": "The the of and", "judge_agent": "Maybe?", "answer_agent": "\n\n"}[role]
    eng = ScriptedEngine(reply)
    [ep] = run_maps(rows(1), Team(eng), corpus(1, 3, 1), MapsConfig(max_rounds=2, top_k=1, judge_initial=False), system="maps")
    q, j, a = (next(c for c in ep.calls if c.role == r) for r in ("query_agent", "judge_agent", "answer_agent"))
    assert q.format_error and q.parsed is None and q.meta["fallback"] == maps.keywords(ep.question) == "q0r0"
    assert q.meta["duplicate_query"] is True       # the fallback repeats query 1: no new chunks
    assert j.format_error and j.meta["fallback"] == maps.INSUFFICIENT
    assert ep.meta["rounds"] == 2                  # insufficient -> the budget ran out
    assert a.format_error and ep.final_answer == ""
    assert ep.meta["format_errors"] == 4           # 2 query + 1 judge + 1 answer


def test_a_lead_in_is_continued_until_it_answers_or_its_budget_is_spent():
    """"Answer:" then EOS is not an answer: the answer step continues it inside the same assistant turn, EOS
    forbidden for the first token, within what is left of the budget, and again while the text is still a stub;
    the call keeps the answer-less text it continued. A stub that never answers stops when the role's budget is
    spent and stays no answer; a real answer is never continued."""
    from ragteam.agents.core import LEAD_IN_MIN_TOKENS, continue_lead_ins
    from ragteam.llm import Completion, SamplingConfig

    def reply(role, m):
        if role == "answer_agent" and m[-1]["role"] == "assistant":        # the continuation of a lead-in
            text = m[-1]["content"]
            if text.startswith("Final answer:"):
                return " answer:"                                         # never answers
            return {"Answer:": " ans1", "The answer is:": "\n", "The answer is:\n": "ans2"}[text]
        if role == "answer_agent":
            return {0: "ans0", 1: "Answer:", 2: "The answer is:", 3: "Final answer:"}[qidx(m)]
        return maps_reply({0: 0, 1: 0, 2: 0, 3: 0})(role, m)

    eng = ScriptedEngine(reply)
    team = Team(eng, {"answer_agent": SamplingConfig(max_new_tokens=24)})
    eps = run_maps(rows(4), team, corpus(4, 2, 1), MapsConfig(max_rounds=1, top_k=1), system="maps")
    assert [e.final_answer for e in eps] == ["ans0", "ans1", "ans2", ""]
    answers = [e.calls[-1] for e in eps]
    assert [c.meta.get("lead_in") for c in answers[:3]] == [None, "Answer:", "The answer is:\n"]
    assert answers[1].response == "Answer: ans1" and answers[1].format_error is None
    assert answers[2].response == "The answer is:\nans2"   # a line break, then the answer in its second round
    assert answers[3].format_error.startswith(maps.LEAD_IN_ERROR)       # still a stub when the budget ran out
    # tokens (scripted: words + 1 per completion): "Final answer:" 3, each " answer:" continuation 2 -> 11 rounds
    # reach 25 >= 24, and the next round is not asked for
    assert answers[3].completion_tokens == 25 and answers[3].response.count("answer:") == 12
    steps = eng.steps("answer_agent")
    # the first call; round 1: one call per distinct budget left; round 2: both stubs left have 19; then 9 rounds
    assert steps[:5] == [4, 1, 1, 1, 2] and steps[5:] == [1] * 9
    # round 1's budgets: "Answer:" 22 left, "The answer is:" 20, "Final answer:" 21
    conts = [(s.max_new_tokens, s.n) for s in eng.samplings if s.min_new_tokens == LEAD_IN_MIN_TOKENS]
    assert len(conts) == len(steps) - 1 and sorted(conts[:3]) == [(20, 1), (21, 1), (22, 1)] and conts[3] == (19, 1)
    # token ids: the lead-in's EOS is dropped, the continuation's ids follow; n samples are continued one by one
    lead = Completion("Answer:", 5, 2, "stop", token_ids=(7, 2))
    more = Team(lambda _role: type("E", (), {"generate": lambda self, p, s: [
        [Completion(" x", 6, 2, "stop", token_ids=(9, 2))] for _ in p]})())
    [[a, b]] = continue_lead_ins(more, "answer_agent", [[{"role": "user", "content": "q"}]],
                                 [[lead, Completion("y", 5, 2, "stop")]], maps.is_stub,
                                 SamplingConfig(max_new_tokens=8, n=2))
    assert (a.text, a.token_ids, a.completion_tokens, a.lead_in) == ("Answer: x", (7, 9, 2), 4, "Answer:")
    assert b.text == "y" and b.lead_in is None


def test_an_output_that_still_gives_no_answer_is_replaced_by_the_first_fresh_sample_that_parses():
    """The answer fallback (llm.answer_fallback): after the lead-in continuation, an answer call that still gives no
    answer (a stub to the end of its budget, an empty output) gets `samples` fresh draws of its prompt in one engine
    call at the fallback's temperature, seeded; the first draw that parses answers, every token spent is counted and
    the call records the stub. No draw parses: the stub stays no answer. A real answer never goes there, and a
    trainer's Team (token ids kept) or a Team without a fallback never resamples."""
    from ragteam.llm import AnswerFallback, SamplingConfig, call_seed

    def reply(role, m):
        if role == "answer_agent" and m[-1]["role"] == "assistant":
            return " answer:"                                          # a continuation that never answers
        if role == "answer_agent":
            return {0: "ans0", 1: "Answer:", 2: "", 3: "The answer is:"}[qidx(m)]
        return maps_reply({i: 0 for i in range(4)})(role, m)

    draws = {1: ["", "Answer:", "drawn1", "late"], 2: ['Doc 1(Title: "x"): y', "drawn2", "x", "y"],
             3: ["Answer:", "", "The answer is", "(no new documents)"]}
    fb = AnswerFallback(samples=4, temperature=0.8, top_p=0.9, seed=5)
    eng = DrawingEngine(reply, per_question(draws))
    team = Team(eng, {"answer_agent": SamplingConfig(max_new_tokens=8)}, fallback=fb)
    eps = run_maps(rows(4), team, corpus(4, 2, 1), MapsConfig(max_rounds=1, top_k=1), system="maps")
    assert [e.final_answer for e in eps] == ["ans0", "drawn1", "drawn2", ""]
    answers = [e.calls[-1] for e in eps]
    assert "resampled" not in answers[0].meta and answers[0].completion_tokens == 2
    assert answers[1].meta["resampled"] == {"from": "Answer: answer: answer: answer:", "draw": 3, "of": 4}
    assert answers[2].meta["resampled"] == {"from": "", "draw": 2, "of": 4}
    assert answers[3].meta["resampled"]["draw"] == 0 and answers[3].format_error.startswith(maps.LEAD_IN_ERROR)
    assert answers[1].response == "drawn1" and answers[1].format_error is None
    # every token spent: the stub continued to its budget (2 + 3 x 2 = 8), then the 4 draws (1 + 2 + 2 + 2)
    assert answers[1].completion_tokens == 8 + 7 and answers[2].completion_tokens == 1 + 5 + 2 + 2 + 2
    fallback_calls = [s for s in eng.samplings if s.n > 1]
    assert len(fallback_calls) == 1 and eng.log[-1] == ("answer_agent", 3)      # one call for the three
    s = fallback_calls[0]
    assert (s.n, s.temperature, s.top_p, s.max_new_tokens, s.min_new_tokens) == (4, 0.8, 0.9, 8, 0)
    n_before = len(eng.samplings) - 1                   # the Team's calls before the fallback's: its seed
    assert s.seed == call_seed(5, "answer_agent", n_before)
    # the same run again draws with the same seed; a trainer's Team or one without a fallback never resamples
    for other in (Team(DrawingEngine(reply, per_question(draws)), {"answer_agent": SamplingConfig(max_new_tokens=8)},
                       fallback=fb, keep_token_ids=True),
                  Team(DrawingEngine(reply, per_question(draws)), {"answer_agent": SamplingConfig(max_new_tokens=8)})):
        eps2 = run_maps(rows(4), other, corpus(4, 2, 1), MapsConfig(max_rounds=1, top_k=1), system="maps")
        assert [e.final_answer for e in eps2] == ["ans0", "", "", ""]
        assert all(sp.n == 1 for sp in other.engine("answer_agent").samplings)
        assert not any("resampled" in c.meta for e in eps2 for c in e.calls)
    again = DrawingEngine(reply, per_question(draws))
    run_maps(rows(4), Team(again, {"answer_agent": SamplingConfig(max_new_tokens=8)}, fallback=fb),
             corpus(4, 2, 1), MapsConfig(max_rounds=1, top_k=1), system="maps")
    assert [x.seed for x in again.samplings if x.n > 1] == [s.seed]
    # samples 0: off
    off = DrawingEngine(reply, per_question(draws))
    eps3 = run_maps(rows(4), Team(off, {"answer_agent": SamplingConfig(max_new_tokens=8)},
                                  fallback=AnswerFallback(samples=0)),
                    corpus(4, 2, 1), MapsConfig(max_rounds=1, top_k=1), system="maps")
    assert [e.final_answer for e in eps3] == ["ans0", "", "", ""] and all(x.n == 1 for x in off.samplings)


def test_the_evaluation_counts_a_resampled_answer_as_a_format_error_and_reports_the_share_answered_so():
    from ragteam.eval.evaluate import silence, summarize
    from ragteam.llm import AnswerFallback, SamplingConfig

    def reply(role, m):
        if role == "answer_agent":
            return {0: "ans0", 1: "", 2: ""}[qidx(m)]
        return maps_reply({i: 0 for i in range(3)})(role, m)

    team = Team(DrawingEngine(reply, lambda m: {1: ["ans1", "x"], 2: ["Answer:", ""]}[qidx(m)]),
                {"answer_agent": SamplingConfig(max_new_tokens=8)}, fallback=AnswerFallback(samples=2))
    eps = run_maps(rows(3), team, corpus(3, 2, 1), MapsConfig(max_rounds=1, top_k=1, judge_initial=False), system="maps")
    assert [e.final_answer for e in eps] == ["ans0", "ans1", ""]
    assert [silence(e) for e in eps] == [{"no_answer": 0.0, "format_error_questions": 0.0},
                                         {"no_answer": 0.0, "format_error_questions": 1.0},
                                         {"no_answer": 1.0, "format_error_questions": 1.0}]
    out = summarize(eps)
    assert out["resampled_questions"] == round(100 * 2 / 3, 2) and out["resampled_answered"] == round(100 / 3, 2)


def test_the_engine_pool_gives_its_teams_the_answer_fallback_seeded_by_llm_seed():
    from ragteam.llm import AnswerFallback, EngineConfig, EnginePool, LLMConfig

    team = EnginePool(LLMConfig(seed=11), loader=lambda p, c: None).team({}, "m")
    assert team.fallback == AnswerFallback(samples=4, temperature=0.8, top_p=1.0, seed=11)
    team = EnginePool(LLMConfig(seed=11, answer_fallback={"samples": 2, "seed": 3}),
                      loader=lambda p, c: None).team({}, "m")
    assert (team.fallback.samples, team.fallback.seed) == (2, 3)
    assert EnginePool(EngineConfig(), loader=lambda p, c: None).team({}, "m").fallback is None
    with pytest.raises(ValueError, match="samples"):
        LLMConfig(answer_fallback={"samples": -1})


def test_episode_records_cost_and_round_trip(tmp_path):
    eps = run_maps(rows(2), Team(ScriptedEngine(maps_reply({0: 1, 1: 2}))), corpus(2, 3, 2),
                   MapsConfig(max_rounds=3, top_k=2, judge_initial=False), system="maps")
    ep = eps[1]
    assert ep.cost["llm_calls"] == len(ep.calls) == 5                     # q, j, q, j, answer
    assert ep.cost["prompt_tokens"] == sum(c.prompt_tokens for c in ep.calls) > 0
    assert ep.cost["completion_tokens"] == sum(c.completion_tokens for c in ep.calls) > 0
    assert ep.cost["seconds"] >= 0 and all(c.episode_id == ep.episode_id for c in ep.calls)
    assert ep.calls[0].retrieved_ids == ep.retrieved_ids[1]               # the query agent's call owns its hits
    write_episodes(tmp_path / "e.jsonl", eps)
    back = read_episodes(tmp_path / "e.jsonl")
    # the file is the reproducible record: ids from system/question, no wall time; everything else round-trips
    assert [b.episode_id for b in back] == [f"maps/{e.question_id}" for e in eps]
    assert all(c.episode_id == b.episode_id for b in back for c in b.calls)
    assert [b.cost for b in back] == [{k: v for k, v in e.cost.items() if k != "seconds"} for e in eps]
    skip = {"episode_id", "cost", "calls"}
    assert [b.model_dump(exclude=skip) for b in back] == [e.model_dump(exclude=skip) for e in eps]
    assert [[c.model_dump(exclude={"episode_id"}) for c in b.calls] for b in back] == \
        [[c.model_dump(exclude={"episode_id"}) for c in e.calls] for e in eps]
    # a second run (new random ids, other wall times) writes the same bytes; a repeated question gets #2
    again = run_maps(rows(2), Team(ScriptedEngine(maps_reply({0: 1, 1: 2}))), corpus(2, 3, 2),
                     MapsConfig(max_rounds=3, top_k=2, judge_initial=False), system="maps")
    again[0].cost["seconds"] += 1.0
    assert again[0].episode_id != eps[0].episode_id
    write_episodes(tmp_path / "again.jsonl", again)
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "e.jsonl").read_bytes()
    write_episodes(tmp_path / "twice.jsonl", [*eps, *again])
    assert [b.episode_id for b in read_episodes(tmp_path / "twice.jsonl")][2:] == ["maps/id0#2", "maps/id1#2"]


# ---- DRAG -----------------------------------------------------------------------------------------------------------


def test_debate_rounds_winners_snapshots_and_batching():
    def reply(role, m):
        i, pooled = qidx(m), n_queries(m)
        if role == "proponent":
            return f"The documents answer it: ans{i}."
        if role == "opponent":
            if i == 0:
                return f"Missing facts.\nQuery Expansion: [q0r{pooled}]" if pooled == 1 else "Concede"
            if i == 2:
                return "I disagree."                                   # malformed -> fallback concede
            return f"Not enough.\nQuery Expansion: [q{i}r{pooled}]"
        if role == "moderator":
            return "Proponent" if i == 1 else "Opponent"
        if role == "answer_agent":
            return f"ans{i}"
        raise AssertionError(role)
    eng, ret = ScriptedEngine(reply), corpus(4, 4, 1)
    eps = run_debate(rows(4), Team(eng), ret, DebateConfig(max_rounds=3, top_k=1), system="drag")
    assert [e.meta["stop_reason"] for e in eps] == ["opponent_conceded", "proponent_won", "opponent_conceded",
                                                    "round_budget"]
    assert [e.meta["snapshots"] for e in eps] == [[1, 2], [1], [1], [1, 2, 3, 4]]
    assert eng.steps("proponent") == [4, 2, 1] and eng.steps("opponent") == [4, 2, 1]
    assert eng.steps("moderator") == [3, 1, 1]     # only where the opponent asked for an expansion
    assert eng.steps("answer_agent") == [4]
    snaps = debate_snapshots(eps[3])
    assert [s.queries for s in snaps] == [eps[3].queries[:n] for n in (1, 2, 3, 4)]
    assert [s.n_chunks for s in snaps] == [1, 2, 3, 4] and snaps[-1].hits[-1][0].title == "Q3R3D0"
    assert [e.final_answer for e in eps] == ["ans0", "ans1", "ans2", "ans3"]
    opp = [c for c in eps[2].calls if c.role == "opponent"][0]
    assert opp.format_error and opp.meta["fallback"] == "concede"


def test_debate_without_answer_step_is_pure_synthesis():
    eng = ScriptedEngine(lambda role, m: {"proponent": "ok", "opponent": "Concede"}[role])
    eps = run_debate(rows(2), Team(eng), corpus(2, 1, 1), DebateConfig(max_rounds=3, top_k=1), answer=False, system="drag")
    assert eng.steps("answer_agent") == [] and all(e.final_answer is None for e in eps)
    assert [len(debate_snapshots(e)) for e in eps] == [1, 1]


# ---- baselines ------------------------------------------------------------------------------------------------------


def test_native_standard_rag_and_iter_retgen():
    gen_round = {}

    def reply(role, m):
        assert role == "generator"
        i = int(re.search(r"q(\d+)r0", m[-1]["content"]).group(1))
        gen_round[i] = gen_round.get(i, 0) + 1
        return f"guess q{i}r{gen_round[i]}"
    eng, ret = ScriptedEngine(reply), corpus(2, 3, 2)
    native = run_native(rows(2), Team(eng), system="native")
    assert eng.steps("generator") == [2] and ret.log == [] and native[0].cost["retrieval_calls"] == 0
    assert "Answer the question based on your own knowledge" in native[0].calls[0].prompt[0]["content"]

    eng, ret, gen_round = ScriptedEngine(reply), corpus(2, 3, 2), {}
    rag = run_standard_rag(rows(2), Team(eng), ret, BaselineConfig(top_k=2), system="standard_rag")
    assert ret.log == [[r["question"] for r in rows(2)]] and eng.steps("generator") == [2]
    assert 'Doc 1(Title: "Q0R0D0") passage about q0r0 number 0' in rag[0].calls[0].prompt[0]["content"]
    assert rag[0].retrieved_ids == [["0", "1"]]

    eng, ret, gen_round = ScriptedEngine(reply), corpus(2, 3, 1), {}
    it = run_iter_retgen(rows(2), Team(eng), ret, BaselineConfig(top_k=2, iterations=3), system="iter_retgen")
    assert eng.steps("generator") == [2, 2, 2]
    # FlashRAG: iteration t > 0 retrieves with "question + previous generation"
    assert ret.log[1] == [f"{r['question']} guess q{i}r1" for i, r in enumerate(rows(2))]
    assert it[1].final_answer == "guess q1r3" and it[1].cost["retrieval_calls"] == 3
    assert '"Q1R1D0"' in it[1].calls[1].prompt[0]["content"]   # iteration 2 answers from the re-retrieved docs
    assert '"Q1R1D0"' not in it[1].calls[0].prompt[0]["content"]


@pytest.mark.parametrize("workflow", ["maps", "drag"])
def test_empty_retrieval_results_do_not_break_workflows(workflow):
    eng = ScriptedEngine(lambda role, m: {"query_agent": "nothing", "judge_agent": maps.SUFFICIENT,
                                          "answer_agent": "x", "proponent": "p",
                                          "opponent": "Query Expansion: [zzz]", "moderator": "Opponent"}[role])
    ret = KeywordRetriever([("T", "unrelated text")])
    if workflow == "maps":
        eps = run_maps(rows(2), Team(eng), ret, MapsConfig(max_rounds=2, top_k=3), system="maps")
    else:
        eps = run_debate(rows(2), Team(eng), ret, DebateConfig(max_rounds=2, top_k=3), system="drag")
    assert all(e.final_answer == "x" and all(ids == [] for ids in e.retrieved_ids) for e in eps)
    assert "(no new documents)" in eps[0].calls[-1].prompt[0]["content"]
