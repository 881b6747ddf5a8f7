"""QAgent (issue 15): the Table 5 prompt and turn parser, the multi-turn workflow (stop strings, <= 3 queries per
search block, the retry path, batching, K), the plug-in generator, the token mask of a trajectory on the real
SmolLM2 tokenizer, both rewards against hand-computed values, and the evaluate / ask integration."""
import re
import sys
from pathlib import Path

import pytest
from helpers_agents import Bm25Retriever, KeywordRetriever, ScriptedEngine, smollm2_engine

from ragteam.agents.core import FormatError
from ragteam.systems.qagent import roles as qagent
from ragteam.systems.qagent.workflow import (QAgentConfig, generator_messages, knowledge, run_qagent,
                                            trajectory_text, trajectory_tokens)
from ragteam.eval.evaluate import EvalConfig, SystemSpec, WorkflowConfigs, run_system, summarize
from ragteam.llm import SamplingConfig, Team, chat_text
from ragteam.retrieval.base import Hit
from ragteam.systems.qagent.rewards import format_ok, qagent_reward_stage2, qagent_rewards_stage1, qagent_rewards_stage2

REPO = Path(__file__).resolve().parents[1]

PASSAGES = [("Ed Wood", "Ed Wood was an American filmmaker born in Poughkeepsie."),
            ("Poughkeepsie", "Poughkeepsie is a city in New York state."),
            ("Scott Derrickson", "Scott Derrickson is an American director born in Denver."),
            ("Denver", "Denver is the capital of Colorado."),
            ("Doctor Strange", "Doctor Strange is a film directed by Scott Derrickson.")]

ROWS = [{"id": "A", "question": "Where was Ed Wood born?", "golden_answers": ["Poughkeepsie"]},
        {"id": "B", "question": "Which state has Denver as capital?", "golden_answers": ["Colorado"]},
        {"id": "C", "question": "What is the capital of France?", "golden_answers": ["Paris"]},
        {"id": "D", "question": "Who directed Doctor Strange?", "golden_answers": ["Scott Derrickson"]},
        {"id": "E", "question": "What animal has stripes?", "golden_answers": ["Zebra"]}]

# Every plan, reflection, query or answer that the plug-in generator must never see carries "zq".
SCRIPT = {
    "A": ["<plan>zq find Ed Wood</plan>\n<search>\n<query>Ed Wood zqquery</query>\n<query>Poughkeepsie city</query>\n"
          "</search>\nSHOULD NOT APPEAR</answer>",                                       # cut at </search>
          "<reflection>zq he was born in Poughkeepsie</reflection>\n<answer>\n Poughkeepsie\n </answer> after"],
    "B": ["I am not sure zq.",                                                            # neither tag: retry
          "<plan>zq look everything up</plan><search><query>Ed Wood</query><query>Poughkeepsie city</query>"
          "<query>Doctor Strange film</query><query>Denver capital</query></search>",     # 4 queries: first 3 run
          "<reflection>zq</reflection><plan>zq</plan><search><query>Ed Wood</query></search>"],  # duplicate passage
    "C": ["<answer>zq Paris</answer>"],                                                   # answers without search
    "D": ["<plan>zq</plan><search><query>zzzz</query></search>",                          # finds nothing
          "<answer>Scott Derrickson</answer>"],                                           # no <reflection>
    "E": ["no idea zq", "still no idea zq", "none zq"],                                  # three EOS turns
}
GENERATOR = {"A": "Poughkeepsie, New York", "B": "Denver", "C": "Paris", "D": "I do not know", "E": "Zebra crossing"}


def _scripted():
    by_question = {r["question"]: r["id"] for r in ROWS}

    def reply(role, m):
        if role == "qagent":
            qid = by_question[re.search(r"Question: (.*)\.$", m[0]["content"]).group(1)]
            so_far = m[-1]["content"] if m[-1]["role"] == "assistant" else ""
            turn = so_far.count("<information>") + so_far.count(qagent.PROMPT_RETHINK)  # one block per past turn
            return SCRIPT[qid][turn]
        assert role == "answer_agent", role
        return GENERATOR[by_question[re.search(r"Question: (.*)", m[-1]["content"]).group(1)]]

    return ScriptedEngine(reply)


def _run(plugin=False, **cfg):
    eng, ret = _scripted(), KeywordRetriever(PASSAGES)
    cfg = QAgentConfig(**{"max_turns": 3, **cfg})
    eps = run_qagent(ROWS, Team(eng, {"qagent": SamplingConfig(max_new_tokens=64, stop=["\n\n\n"])}), ret, cfg,
                     plugin=plugin)
    return {e.question_id: e for e in eps}, eng, ret


# ---- prompt and parser ---------------------------------------------------------------------------------------------

def test_prompt_is_table_5_with_the_question_filled_in():
    m = qagent.agent_messages("Who wrote Hamlet?")
    assert m == [{"role": "user", "content": qagent.QAGENT_PROMPT.format(question="Who wrote Hamlet?")}]
    text = m[0]["content"]
    assert text.startswith("Search for information to answer the given question. You can search as many times")
    assert "(no more than 3)" in text and "After planing, you can call" in text and "<search >xxx</search>" in text
    assert "reflect within <reflect>and </reflect>after receiving information." in text   # the paper's mismatch
    assert "such as <search>\n <query>query1</query>\n <query>query2</query>\n\n <query>queryk</query>\n </search>." \
        in text                                                                           # \n escapes = newlines
    assert text.endswith("The answer, “xxx”, should be a few short words.\nQuestion: Who wrote Hamlet?.")
    assert not any(stop in qagent.PROMPT_RETHINK for stop in qagent.STOP_STRINGS)  # parroting it cannot stop a turn
    assert qagent.continue_messages("q", "") == qagent.agent_messages("q")
    assert qagent.continue_messages("q", "<plan>")[-1] == {"role": "assistant", "content": "<plan>"}


@pytest.mark.parametrize("turn, after_info, parsed", [
    ("<plan>p</plan>\n<search>\n <query> a  b </query>\n <query>c</query>\n</search>", False,
     {"action": "search", "queries": ["a b", "c"]}),
    ("<plan>p</plan><search ><query>a</query></search>", False, {"action": "search", "queries": ["a"]}),
    ("<reflection>r</reflection><plan>p</plan><search><query>a</query></search>", True,
     {"action": "search", "queries": ["a"]}),
    ("<reflect>r</reflect>\n<answer>\n Paris\n </answer>", True, {"action": "answer", "answer": "Paris"}),
    ("<answer>Paris</answer>", False, {"action": "answer", "answer": "Paris"}),
])
def test_parse_turn_reads_search_and_answer_turns(turn, after_info, parsed):
    assert qagent.parse_turn(turn, after_information=after_info) == parsed


@pytest.mark.parametrize("turn, after_info, reason, fallback", [
    ("The answer is Paris.", False, "neither", {"action": "retry"}),
    ("", False, "empty turn", {"action": "retry"}),
    ("<plan>p</plan><search><query>a</query>", False, "neither", {"action": "retry"}),     # EOS inside the block
    ("<search><query>a</query></search>", False, "no <plan>", {"action": "search", "queries": ["a"]}),
    ("<plan>p</plan><search><query>a</query><query>b</query><query>c</query><query>d</query></search>", False,
     "4 queries", {"action": "search", "queries": ["a", "b", "c"]}),
    ("<plan>p</plan><search> capital of France </search>", False, "without a non-empty <query>",
     {"action": "search", "queries": ["capital of France"]}),
    ("<plan>p</plan><search><query> </query></search>", False, "without a non-empty <query>", {"action": "retry"}),
    ("<plan>p</plan><search><query>a</query></search>", True, "no <reflection>",
     {"action": "search", "queries": ["a"]}),
    ("<information>made up</information><answer>x</answer>", False, "<information>",
     {"action": "answer", "answer": "x"}),
    ("<reflection>r</reflection><answer> </answer>", True, "empty <answer>", {"action": "answer", "answer": ""}),
])
def test_malformed_turns_are_format_errors_with_documented_fallbacks(turn, after_info, reason, fallback):
    got = qagent.parse_turn(turn, after_information=after_info)
    assert isinstance(got, FormatError) and reason in got.reason
    assert qagent.fallback_turn(turn) == fallback


def test_information_block_layout():
    hits = [[Hit("1", '"Ed Wood"\nEd Wood was an American filmmaker.', 1.0)], [],
            [Hit("2", '"Denver"\nDenver is the capital of Colorado.', 1.0)]]
    assert qagent.information_block(hits) == ("\n\n<information>Doc 1(Title: Ed Wood) Ed Wood was an American "
                                              "filmmaker.\nDoc 2(Title: Denver) Denver is the capital of Colorado."
                                              "</information>\n")
    assert qagent.information_block(hits, passage_words=2).count(" ...") == 2
    assert qagent.information_block([[]]) == "\n\n<information>No documents found.</information>\n"


# ---- the workflow ---------------------------------------------------------------------------------------------------

def test_workflow_stops_batches_retrieves_at_most_3_queries_and_retries():
    eps, eng, ret = _run()
    # one engine call per turn over every unfinished episode, always with Algorithm 1's stop strings
    assert eng.steps("qagent") == [5, 4, 2]
    assert all({"</search>", "</answer>", "\n\n\n"} <= set(s.stop) for s in eng.samplings)
    # one batch_search per turn: A's 2 + D's 1 queries; B's first 3 of 4; B's last one
    assert ret.log == [["Ed Wood zqquery", "Poughkeepsie city", "zzzz"],
                       ["Ed Wood", "Poughkeepsie city", "Doctor Strange film"], ["Ed Wood"]]
    a = eps["A"]
    assert [c.response for c in a.calls] == [SCRIPT["A"][0].split("SHOULD")[0].rstrip("\n") ,
                                             SCRIPT["A"][1][: SCRIPT["A"][1].index("</answer>") + 9]]
    assert a.calls[0].response.endswith("</search>") and a.calls[0].meta["finish"] == "stop_string"
    assert a.calls[0].meta["injected_kind"] == "information" and a.calls[0].retrieved_ids == ["0", "1"]
    assert a.calls[0].meta["injected"] == qagent.information_block(
        [ret.search("Ed Wood zqquery", 1), ret.search("Poughkeepsie city", 1)])
    assert "injected" not in a.calls[1].meta and a.final_answer == "Poughkeepsie"
    assert a.meta["rounds"] == 2 and a.meta["stop_reason"] == "answer" and a.cost["retrieval_calls"] == 2
    # the trajectory is one growing assistant message
    assert a.calls[1].prompt[-1] == {"role": "assistant", "content": a.calls[0].response + a.calls[0].meta["injected"]}
    # B: a turn without tags gets the retry text and counts; 4 queries -> 3 run; B turns, no answer
    b = eps["B"]
    assert b.calls[0].format_error and b.calls[0].meta["fallback"] == {"action": "retry"}
    assert b.calls[0].meta["finish"] == "eos" and b.calls[0].meta["injected"] == qagent.PROMPT_RETHINK
    assert b.calls[1].prompt[-1]["content"] == "I am not sure zq." + qagent.PROMPT_RETHINK
    assert "4 queries" in b.calls[1].format_error and b.calls[1].meta["queries"] == ["Ed Wood", "Poughkeepsie city",
                                                                                      "Doctor Strange film"]
    assert b.calls[2].format_error is None and b.calls[2].meta["injected_kind"] == "information"
    assert b.meta == {**b.meta, "rounds": 3, "stop_reason": "max_turns", "agent_answer": None, "retries": 1}
    assert b.final_answer == "" and b.cost["retrieval_calls"] == 4
    # K is the deduplicated union, in first-retrieved order
    assert [h.id for h in knowledge(b)] == ["0", "1", "4"] and b.cost["passages"] == 3.0
    assert b.queries == ["Ed Wood", "Poughkeepsie city", "Doctor Strange film", "Ed Wood"]
    assert b.retrieved_ids == [["0"], ["1"], ["4"], []]
    # C answers at once; D searched, found nothing, answered without reflecting; E used up its turns
    assert eps["C"].final_answer == "zq Paris" and eps["C"].cost["passages"] == 0 and len(eps["C"].calls) == 1
    assert eps["D"].calls[0].meta["injected"] == "\n\n<information>No documents found.</information>\n"
    assert "no <reflection>" in eps["D"].calls[1].format_error and eps["D"].final_answer == "Scott Derrickson"
    assert eps["E"].meta["retries"] == 3 and eps["E"].meta["format_errors"] == 3
    assert all(e.cost["llm_calls"] == len(e.calls) for e in eps.values())


def test_max_turns_and_retry_prompt_are_params():
    eps, eng, _ = _run(max_turns=1, retry_prompt="\nTry again.\n")
    assert eng.steps("qagent") == [5]
    assert eps["B"].calls[0].meta["injected"] == "\nTry again.\n" and eps["B"].meta["stop_reason"] == "max_turns"
    assert eps["A"].final_answer == "" and len(knowledge(eps["A"])) == 2      # searched on its last turn: K kept


def test_plugin_generator_answers_from_question_and_k_only():
    eps, eng, _ = _run(plugin=True)
    assert eng.steps("answer_agent") == [5]                                    # one batched call for every question
    for e in eps.values():
        g = e.calls[-1]
        assert g.role == "answer_agent" and e.final_answer == GENERATOR[e.question_id]
        assert g.prompt == generator_messages(e.question, knowledge(e))
        seen = "\n".join(m["content"] for m in g.prompt)
        assert "zq" not in seen and "<" not in seen                          # no plan, query, reflection or answer
        assert all(h.text in seen for h in knowledge(e)) and e.question in seen
        assert g.meta["passages"] == e.cost["passages"] == len(knowledge(e))
    assert eps["A"].final_answer == "Poughkeepsie, New York" and eps["A"].meta["agent_answer"] == "Poughkeepsie"
    assert eps["C"].meta["agent_answer"] == "zq Paris" and eps["C"].final_answer == "Paris"


# ---- the token mask -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def test_mask_covers_exactly_the_injected_tokens(tokenizer):
    eps, _, _ = _run()
    enc = lambda t: tokenizer(t, add_special_tokens=False).input_ids  # noqa: E731
    a = eps["A"]
    t = trajectory_tokens(a, tokenizer)
    prompt = enc(chat_text(tokenizer, qagent.agent_messages(a.question)))
    seg1, info, seg2 = enc(a.calls[0].response), enc(a.calls[0].meta["injected"]), enc(a.calls[1].response)
    assert t.prompt_len == len(prompt) and t.input_ids == prompt + seg1 + info + seg2
    assert t.loss_mask == [0] * len(prompt) + [1] * len(seg1) + [0] * len(info) + [1] * len(seg2)
    # the engine's view of the same text (one tokenisation of the continued assistant message) has the same ids
    assert t.input_ids == enc(chat_text(tokenizer, qagent.continue_messages(a.question, trajectory_text(a))))
    assert tokenizer.decode([i for i, m in zip(t.input_ids[t.prompt_len:], t.loss_mask[t.prompt_len:]) if not m]) \
        == a.calls[0].meta["injected"]
    # B: retry text masked, <information> masked, the <information> after its last turn left out (conditions nothing)
    b = eps["B"]
    tb = trajectory_tokens(b, tokenizer)
    masked = [i for i, m in zip(tb.input_ids[tb.prompt_len:], tb.loss_mask[tb.prompt_len:]) if not m]
    assert masked == enc(qagent.PROMPT_RETHINK) + enc(b.calls[1].meta["injected"])
    assert tokenizer.decode([i for i, m in zip(tb.input_ids, tb.loss_mask) if m]) == "".join(
        c.response for c in b.calls)
    assert tb.n_generated == sum(len(enc(c.response)) for c in b.calls)
    # E: three EOS-ended turns; the last one's EOS is the policy's and is trained on
    te = trajectory_tokens(eps["E"], tokenizer)
    assert te.input_ids[-1] == tokenizer.eos_token_id and te.loss_mask[-1] == 1
    assert te.loss_mask.count(0) - te.prompt_len == 2 * len(enc(qagent.PROMPT_RETHINK))
    assert tokenizer.eos_token_id not in tb.input_ids[tb.prompt_len:]    # B ended on a stop string
    # a record whose prompts do not continue the trajectory is refused
    bad = b.model_copy(deep=True)
    bad.calls[2].prompt[-1]["content"] += "x"
    with pytest.raises(ValueError, match="call 3 does not continue the trajectory"):
        trajectory_tokens(bad, tokenizer)


class _SampledIds:
    """The scripted engine with the token ids a real engine records (token in, token out): the prompt as the chat
    template encodes it, and each completion, stop string included, as sampled with every `</` split into `<` `/`
    (a real SmolLM2 split whose text re-encodes as the single token `</`), plus EOS on EOS-ended turns."""

    def __init__(self, inner, tokenizer):
        self.inner, self.tok = inner, tokenizer

    def sampled(self, text):
        enc = lambda t: self.tok(t, add_special_tokens=False).input_ids  # noqa: E731
        ids = []
        for i, piece in enumerate(text.split("</")):
            ids += (enc("<") + enc("/") if i else []) + enc(piece)
        return ids

    def generate(self, prompts, sampling):
        from dataclasses import replace

        out = []
        for m, cs in zip(prompts, self.inner.generate(prompts, sampling)):
            pid = tuple(self.tok(chat_text(self.tok, m), add_special_tokens=False).input_ids)
            out.append([replace(c, prompt_ids=pid, token_ids=tuple(
                self.sampled(c.text + (c.stop_reason or "")) + ([] if c.stop_reason else [self.tok.eos_token_id])))
                for c in cs])
        return out


def test_trajectory_tokens_are_the_sampled_ids_of_each_turn_and_the_injected_text(tokenizer):
    """Issue 23 §4: each generated segment enters the trajectory as the ids the engine sampled, not a re-encoding
    of its text (which merges `<` `/` into `</`); only the injected blocks are tokenised; the mask is unchanged in
    kind: sampled 1, injected 0; an EOS the policy sampled (turn end) is its own and stays."""
    enc = lambda t: tokenizer(t, add_special_tokens=False).input_ids  # noqa: E731
    eng = _SampledIds(_scripted(), tokenizer)
    team = Team(eng, {"qagent": SamplingConfig(max_new_tokens=64)}, keep_token_ids=True)   # as in training
    eps = {e.question_id: e for e in run_qagent(ROWS, team, KeywordRetriever(PASSAGES), QAgentConfig(max_turns=3))}
    a = eps["A"]
    t = trajectory_tokens(a, tokenizer)
    c1, c2 = a.calls[0], a.calls[1]
    seg1, seg2 = eng.sampled(c1.response), eng.sampled(c2.response)
    assert c1.response_ids == seg1 and seg1 != enc(c1.response)       # the sampled split differs from a re-encoding
    assert t.input_ids == c1.prompt_ids + seg1 + enc(c1.meta["injected"]) + seg2
    assert t.loss_mask == [0] * len(c1.prompt_ids) + [1] * len(seg1) + [0] * len(enc(c1.meta["injected"])) \
        + [1] * len(seg2)
    # E: three EOS-ended turns, each segment with the EOS it sampled, retry text in between
    e = eps["E"]
    te = trajectory_tokens(e, tokenizer)
    gen = [i for i, m in zip(te.input_ids, te.loss_mask) if m]
    assert gen == [i for c in e.calls for i in c.response_ids] and gen.count(tokenizer.eos_token_id) == 3


# ---- rewards ---------------------------------------------------------------------------------------------------------

def test_stage1_reward_is_format_gate_times_strict_em():
    eps, _, _ = _run()
    assert {k: format_ok(e) for k, e in eps.items()} == {"A": True, "B": False, "C": True, "D": False, "E": False}
    ordered = [eps[k] for k in "ABCDE"]
    # A: format ok, "Poughkeepsie" = gold; C: format ok but "zq Paris" is not strictly "Paris";
    # D: right answer, no <reflection> after <information> -> gated; B, E: never answered
    assert qagent_rewards_stage1(ordered) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert [e.calls[-1].reward for e in ordered] == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_stage2_reward_is_generator_contains_em_plus_half_hit_in_one_batched_call():
    eps, eng, _ = _run()
    ordered = [eps[k] for k in "ABCDE"]
    rewards = qagent_rewards_stage2(ordered, Team(eng))
    assert eng.steps("answer_agent") == [5]
    # A: G "Poughkeepsie, New York" contains the gold (1) + Hit: a retrieved passage holds it (0.5)
    # B: G "Denver" (0), no passage of K says Colorado (0); C: G "Paris" (1), no search: K is empty (0; its own
    # "zq Paris" is not retrieval); D: G "I do not know" (0), its own "Scott Derrickson" is no Hit (K is empty);
    # E: G "Zebra crossing" (1), K empty
    assert rewards == [1.5, 0.0, 1.0, 0.0, 1.0]
    assert [e.calls[-2].reward if e.calls[-1].role == "answer_agent" else None for e in ordered] == rewards
    assert [e.calls[-1].meta["hit"] for e in ordered] == [1.0, 0.0, 0.0, 0.0, 0.0]
    paris = [Hit("p", '"France"\nParis is the capital of France.', 0.0)]
    assert qagent_reward_stage2("the city of Paris", [], ["Paris"], hit_weight=0.25) == 1.0
    assert qagent_reward_stage2("Lyon", paris, ["paris"]) == 0.5
    assert qagent_reward_stage2("Lyon", paris, ["paris"], passage_words=2) == 0.5      # "Paris is ..."
    assert qagent_reward_stage2("Lyon", paris, ["capital of France"], passage_words=2) == 0.0  # clipped away


# Hit and the stage-2 EM count whole tokens of the retrieved passages / of G's answer (issue 23 §3): a substring
# test over the whole trajectory paid gold "no" for "not" and gold "2" for the `Doc 2` label
TOKEN_PASSAGES = [("Crown", "Tom is not the king of Freedonia."), ("Court", "The court met in the spring."),
                  ("Freedonia", "Freedonia's army marched north.")]
TOKEN_ROWS = [{"id": "no", "question": "Is Tom the king?", "golden_answers": ["no"]},
              {"id": "two", "question": "How many courts are there?", "golden_answers": ["2"]},
              {"id": "fr", "question": "Whose army marched north?", "golden_answers": ["Freedonia"]},
              {"id": "own", "question": "Where is the court?", "golden_answers": ["Paris"]}]
TOKEN_SCRIPT = {"no": "<plan>check</plan><search><query>Tom king</query></search>",
                "two": "<plan>check</plan><search><query>Tom king</query><query>court spring</query></search>",
                "fr": "<plan>check</plan><search><query>army marched</query></search>",
                "own": "<plan>maybe Paris</plan><search><query>court spring</query></search>"}
TOKEN_GENERATOR = {"no": "not sure", "two": "I cannot tell", "fr": "Freedonia", "own": "somewhere"}


def test_hit_and_stage2_em_are_whole_token_matches_over_passages_and_answer():
    by_question = {r["question"]: r["id"] for r in TOKEN_ROWS}

    def reply(role, m):
        if role == "qagent":
            qid = by_question[re.search(r"Question: (.*)\.$", m[0]["content"]).group(1)]
            so_far = m[-1]["content"] if m[-1]["role"] == "assistant" else ""
            return "<reflection>done</reflection><answer>x</answer>" if so_far else TOKEN_SCRIPT[qid]
        return TOKEN_GENERATOR[by_question[re.search(r"Question: (.*)", m[-1]["content"]).group(1)]]

    eng = ScriptedEngine(reply)
    eps = run_qagent(TOKEN_ROWS, Team(eng), KeywordRetriever(TOKEN_PASSAGES), QAgentConfig(max_turns=2, top_k=1))
    text = {e.question_id: trajectory_text(e) for e in eps}
    assert "not" in text["no"] and "Doc 2" in text["two"] and "maybe Paris" in text["own"]
    rewards = dict(zip([e.question_id for e in eps], qagent_rewards_stage2(eps, Team(eng))))
    # "no": G's "not sure" and the passage's "not" are no match; "2": nor are the `Doc 2` label or the "Doc 1/2"
    # numbering; "Freedonia": G exact (1) and the possessive "Freedonia's" in a passage (0.5); "Paris": only in
    # the agent's own plan, not in a retrieved passage
    assert rewards == {"no": 0.0, "two": 0.0, "fr": 1.5, "own": 0.0}
    gen = {e.question_id: e.calls[-1].meta for e in eps}
    assert {k: (g["em"], g["hit"]) for k, g in gen.items()} == {
        "no": (0.0, 0.0), "two": (0.0, 0.0), "fr": (1.0, 1.0), "own": (0.0, 0.0)}


# ---- evaluation --------------------------------------------------------------------------------------------------

def test_evaluate_stage_runs_both_systems_and_reports_passages(tmp_path):
    sys.path.insert(0, str(REPO))
    import stages.evaluate as stage
    from ragteam.io import write_jsonl
    from ragteam.llm import EngineConfig, EnginePool, LLMConfig
    from ragteam.agents.maps_workflow import MapsConfig

    write_jsonl(tmp_path / "b" / "hotpotqa.jsonl", ROWS)
    eng = _scripted()
    ev = EvalConfig(n_questions=5, systems={"qagent": {"workflow": "qagent"},
                                            "qagent_plugin": {"workflow": "qagent_plugin"}})
    metrics = stage.run(LLMConfig(), WorkflowConfigs(qagent=QAgentConfig(max_turns=3)), ev, benchmarks=tmp_path / "b",
                        results=tmp_path / "r", report=tmp_path / "r.md", figures=tmp_path / "f",
                        retriever=KeywordRetriever(PASSAGES), engines=EnginePool(EngineConfig(), loader=lambda p, c: eng),
                        differences=tmp_path / "compare.json")
    # end to end: A and D right (contains), C contains Paris; F1 from the project's metrics
    assert metrics["qagent"]["avg"]["acc"] == 60.0 and metrics["qagent"]["avg"]["em"] == 40.0
    assert metrics["qagent_plugin"]["avg"]["acc"] == 60.0                 # A, C, E: G's answers contain the gold
    assert metrics["qagent"]["avg"]["passages"] == metrics["qagent_plugin"]["avg"]["passages"] == (2 + 3) / 5
    table = (tmp_path / "r.md").read_text()
    assert "Passages/q" in table and "| qagent_plugin |" in table and "max_turns 3" in table


def test_trained_qagent_needs_a_checkpoint_and_roles_route_to_it():
    with pytest.raises(ValueError, match="systems.qt: trained_agents needs agents.qagent"):
        EvalConfig(systems={"qt": {"workflow": "qagent_plugin", "trained_agents": True}})
    from ragteam.eval.evaluate import role_models

    ev = EvalConfig(systems={"qt": {"workflow": "qagent_plugin", "trained_agents": True,
                                    "base_roles": ["answer_agent"]},
                             "qm": {"workflow": "qagent_plugin", "trained_agents": True, "base_roles": ["qagent"]}},
                    agents={"qagent": "models/agents/qagent", "answer_agent": "models/agents/answer"})
    assert role_models(ev.systems["qt"], ev.agents) == {"qagent": "models/agents/qagent"}
    assert role_models(ev.systems["qm"], ev.agents) == {"answer_agent": "models/agents/answer"}
    spec = SystemSpec(workflow="qagent")
    with pytest.raises(ValueError, match="needs a retriever"):
        run_system(spec, ROWS, Team(_scripted()), None, WorkflowConfigs(), "qagent")


def test_summarize_averages_passages_only_where_recorded():
    eps, _, _ = _run(plugin=True)
    s = summarize(list(eps.values()))
    assert s["passages"] == 1.0
    for e in eps.values():
        del e.cost["passages"]
    assert "passages" not in summarize(list(eps.values()))


def test_cli_ask_runs_qagent_with_calls(monkeypatch, ask_params):
    from typer.testing import CliRunner

    import ragteam.llm.hf
    import ragteam.retrieval
    from ragteam.cli import app

    class Fake(ScriptedEngine):
        def __init__(self, path, cfg):
            super().__init__(lambda role, m: "<plan>p</plan><search><query>Ed Wood</query></search>"
                             if len(m) == 1 else "<reflection>r</reflection><answer>Poughkeepsie</answer>")

    monkeypatch.setattr(ragteam.llm.hf, "HFEngine", Fake)
    monkeypatch.setattr(ragteam.retrieval, "open_retriever", lambda index: KeywordRetriever(PASSAGES))
    res = CliRunner().invoke(app, ["ask", "Where was Ed Wood born?", "--system", "qagent", "--calls",
                                   "--params", str(ask_params), "--index", "idx"])
    assert res.exit_code == 0, res.output
    assert "A: Poughkeepsie" in res.output and "2 round(s), answer" in res.output
    assert "[qagent] '<plan>p</plan><search><query>Ed Wood</query></search>'" in res.output


# ---- the real model ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_runs_the_workflow_end_to_end(smollm2_dir, shared_data, tokenizer):
    import json

    from ragteam.data.formats import load_qa

    corpus = [json.loads(x) for x in (shared_data / "corpus" / "mini_wiki.jsonl").read_text().splitlines()]
    rows = load_qa(shared_data / "benchmarks" / "hotpotqa" / "dev.jsonl")[:1]
    eng = smollm2_engine(str(smollm2_dir))
    team = Team(eng, {"qagent": SamplingConfig(max_new_tokens=16), "answer_agent": SamplingConfig(max_new_tokens=8)})
    eps = run_qagent(rows, team, Bm25Retriever(corpus), QAgentConfig(max_turns=2, passage_words=20), plugin=True)
    for e in eps:
        agent = [c for c in e.calls if c.role == "qagent"]
        assert 1 <= len(agent) == e.meta["rounds"] <= 2 and e.calls[-1].role == "answer_agent"
        assert all(c.meta["finish"] in ("stop_string", "eos", "length") for c in agent)
        assert isinstance(e.final_answer, str)
        t = trajectory_tokens(e, tokenizer)
        gen = [i for i, m in zip(t.input_ids, t.loss_mask) if m and i != tokenizer.eos_token_id]
        assert tokenizer.decode(gen) == "".join(c.response for c in agent)
        assert len(t.input_ids) == len(t.loss_mask) and t.prompt_len == eng.encode(agent[0].prompt).__len__()
