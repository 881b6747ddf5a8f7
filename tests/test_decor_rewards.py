"""DECOR rewards: verdict parser, Eq. 2 and 3 by hand, the format gate, the rule judge on hand-made episodes, the
LLM judge driven by a scripted engine (YES / NO / garbage)."""
from __future__ import annotations

import re

import pytest
from helpers_agents import KeywordRetriever, ScriptedEngine

from ragteam.agents.core import FormatError
from ragteam.llm import Team
from ragteam.records import Episode
from ragteam.systems.decor import rewards as R
from ragteam.systems.decor.workflow import DecorConfig, DecorRewardConfig, run_decor

PASSAGES = [("Alpha Band", "Alpha Band covered the song Red Sky in 1977."),
            ("Red Sky", "Red Sky is a song written by Dana Low."),
            ("Beta City", "Beta City is the capital of Gamma."),
            ("Gamma", "Gamma is a country whose capital is Beta City."),
            ("Omega (band)", "Omega is a band formed by Dana Low.")]


def P(q: str) -> str:
    return f"<think>missing fact</think>\n<search>{q}</search>"


def F(e: str) -> str:
    return f"<think>kept what matters</think>\n<filter>{e}</filter>"


def A(a: str) -> str:
    return f"<think>from the memory</think>\n<answer>{a}</answer>"


# question -> (golds, supporting titles, planner replies by turn, answerer reply); filter replies by search query
CASES = {
    "Who covered Red Sky?": (["Alpha Band"], ["Alpha Band"],
                             [P("Red Sky covered"), P("Red Sky covered"), P("None")], A("the Alpha Band group")),
    "What is the capital of Gamma?": (["Beta City"], None, [P("Beta City capital"), P("None")], A("Delta")),
    "Who wrote Red Sky?": (["Dana Low"], ["Red Sky"], [P("Red Sky writer"), P("Gamma capital"), P("None")],
                           A("Dana Low")),
    "Which band did Dana Low form?": (["Omega"], ["Omega (band)", "Red Sky"], [P("Dana Low band formed"), P("None")],
                                      A("Omega")),
    "Dana Low formed which band?": (["Omega"], ["Omega (band)", "Red Sky"], [P("band formed by Dana Low"), P("None")],
                                    A("Omega")),
    "Who sang Red Sky?": (["Alpha Band"], None, ["Red Sky singer"], A("x")),   # malformed Planner output
}
FILTERS = {"Red Sky covered": F("Alpha Band covered the song Red Sky in 1977."),
           "Beta City capital": F("Gamma is a country."),
           "Red Sky writer": F("Alpha Band covered the song Red Sky."),
           "Gamma capital": F("Dana Low wrote it."),
           "Dana Low band formed": F("Omega is a band formed by Dana Low."),
           "band formed by Dana Low": F("Omega is a band formed by Dana Low, who wrote the song Red Sky."),
           "Red Sky singer": F("x")}


def reply(role, m):
    text = m[0]["content"]
    if role == "decor_planner":
        q = re.search(r"^query: (.*)$", text, re.MULTILINE).group(1)
        turn = len(re.findall(r"^Search \d+: ", text.split("history search information: ", 1)[1], re.MULTILINE))
        return CASES[q][2][turn]
    if role == "decor_filter":
        return FILTERS[re.search(r"^Search Query: (.*)$", text, re.MULTILINE).group(1)]
    if role == "decor_answerer":
        return CASES[re.search(r"^- User's query: (.*)$", text, re.MULTILINE).group(1)][3]
    raise AssertionError(role)


def rollouts(questions=tuple(CASES)) -> list[Episode]:
    rows = [{"id": str(i), "question": q, "golden_answers": CASES[q][0],
             "metadata": {"supporting_titles": CASES[q][1]} if CASES[q][1] else {}} for i, q in enumerate(questions)]
    return run_decor(rows, Team(ScriptedEngine(reply)), KeywordRetriever(PASSAGES),
                     DecorConfig(t_max=3, top_k=2), truncate_on_format_error=True)


def roles_of(ep: Episode) -> list[str]:
    return [c.role.removeprefix("decor_")[0].upper() for c in ep.calls]


# ---- parsers and equations ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [("YES", True), ("no", False), ("NO.", False), ("**Yes**", True),
                                        ("Output: NO", False), ("YES\nThe prediction matches.", True),
                                        ('"yes"', True), ("  No  ", False)])
def test_parse_verdict(text, want):
    assert R.parse_verdict(text) is want


@pytest.mark.parametrize("text", ["", "maybe", "YES or NO", "No, yes it is", "The answer is yes", "Yesterday",
                                  "N/A", "<think>hmm"])
def test_parse_verdict_malformed(text):
    assert isinstance(R.parse_verdict(text), FormatError)


def test_eq2_and_eq3_by_hand():
    assert R.team_reward(0.8, 1.0, 0.5) == pytest.approx(0.9)        # 0.5·0.8 + 0.5·1
    assert R.team_reward(0.4, 1.0, 0.3) == pytest.approx(0.82)       # 0.3·0.4 + 0.7·1
    assert R.team_reward(0.4, 0.0, 1.0) == pytest.approx(0.4)        # λ = 1: F1 only
    assert R.total_reward(0.9, 1.0, 0.6, 0.4) == pytest.approx(0.94)     # 0.6·0.9 + 0.4·1
    assert R.total_reward(0.9, -1.0, 0.6, 0.4) == pytest.approx(0.14)    # 0.54 − 0.4
    assert R.total_reward(0.0, -1.0, 0.6, 0.4) == pytest.approx(-0.4)
    assert R.total_reward(0.5, 1.0, 0.6, 0.2) == pytest.approx(0.5)      # β set apart from α
    assert DecorRewardConfig().beta_value == pytest.approx(0.4) and DecorRewardConfig(beta=0.2).beta_value == 0.2


def test_prompts_are_the_papers():
    assert R.JUDGE_ANSWER_PROMPT.endswith("Question: {question}\nPrediction: {pred}\nReference Answer: {answer}\n"
                                          "Output:")
    assert 'separated by "@@@".' in R.JUDGE_ANSWER_PROMPT and "Reference Answer: 2.6 parsecs@@@8.6 ly\nOutput: YES" \
        in R.JUDGE_ANSWER_PROMPT
    assert "- History is empty, but the planner outputs <search>None</search>." in R.JUDGE_PLANNER_PROMPT
    assert R.JUDGE_FILTER_PROMPT.endswith("- Golden Answer: {golden_answer}\nOutput ONLY:\nYES or NO")
    assert R.JUDGE_ANSWERER_PROMPT.startswith("You are an evaluator judging whether the answerer followed")
    m = R.judge_answer_messages("Q?", "p", ["a", "b"])[0]["content"]
    assert m.endswith("Question: Q?\nPrediction: p\nReference Answer: a@@@b\nOutput:")


# ---- rule judge and rewards -----------------------------------------------------------------------------------------

def test_rule_judge_and_rewards_on_hand_made_episodes():
    eps = rollouts()
    e1, e2, e3, e4, e5, e6 = eps
    assert roles_of(e1) == ["P", "F", "P", "F", "P", "A"] and roles_of(e2) == ["P", "F", "P", "A"]
    assert roles_of(e3) == ["P", "F", "P", "F", "P", "A"] and roles_of(e6) == ["P"]
    js = R.decor_rewards(eps, R.RuleJudge(), DecorRewardConfig())
    # e1: new supporting passage (+1); kept the answer and the supporting title (+1); repeated query (−1);
    #     STOP with the answer in memory (+1); answer contained (+1). F1("the Alpha Band group") = 0.8, LJ = 1
    assert js[0].lj == 1.0 and js[0].roles == {0: 1.0, 1: 1.0, 2: -1.0, 3: 1.0, 4: 1.0, 5: 1.0}
    assert e1.meta["reward"]["f1"] == pytest.approx(0.8) and e1.meta["reward"]["team"] == pytest.approx(0.9)
    assert [c.reward for c in e1.calls] == pytest.approx([0.94, 0.94, 0.14, 0.94, 0.94, 0.94])
    # e2: answer inside the query (−1); dropped the answer the passages had (−1); STOP without it (−1);
    #     M_T lacks the answer: the Answerer is not judged (0). R_team = 0
    assert js[1].lj == 0.0 and js[1].roles == {0: -1.0, 1: -1.0, 2: -1.0}
    assert [c.reward for c in e2.calls] == pytest.approx([-0.4, -0.4, -0.4, 0.0])
    # e3: supporting passage "Red Sky" (+1); Filter lost "Dana Low" (−1); query finds nothing useful (−1);
    #     Filter states an answer its passages lack (−1); STOP, memory holds the answer (+1); right answer (+1)
    assert js[2].roles == {0: 1.0, 1: -1.0, 2: -1.0, 3: -1.0, 4: 1.0, 5: 1.0}
    assert [c.reward for c in e3.calls] == pytest.approx([1.0, 0.2, 0.2, 0.2, 1.0, 1.0])
    # e4 / e5: both supporting passages retrieved; only e5's evidence mentions "Red Sky" as well as "Omega"
    # (the title "Omega (band)" is mentioned as "Omega")
    assert e4.meta["turns"][0]["docs"][0]["contents"].startswith('"Omega (band)"')
    assert js[3].roles[1] == -1.0 and js[4].roles[1] == 1.0
    # e6: malformed Planner output -> gate: every policy call −1, nothing judged
    assert not R.format_ok(e6) and js[5].roles == {} and [c.reward for c in e6.calls] == [-1.0]
    assert e6.meta["reward"]["format_ok"] is False and e6.meta["reward"]["team"] == 0.0


def test_rule_judge_stop_on_empty_history_and_whole_word_containment():
    def stop_reply(role, m):
        return {"decor_planner": P("None"), "decor_answerer": A("not known")}[role]
    rows = [{"id": "1", "question": "Is Gamma a country?", "golden_answers": ["no"]}]
    eps = run_decor(rows, Team(ScriptedEngine(stop_reply)), KeywordRetriever(PASSAGES), DecorConfig())
    (j,) = R.RuleJudge().judge(eps)
    assert j.roles == {0: -1.0}              # STOP in turn 1; the Answerer (empty memory) is not judged
    assert j.lj == 0.0                       # "no" is not contained in "not known" as a word


def test_rule_judge_reads_possessives_as_the_entity():
    """Issue 23 §3: the normaliser turns "Freedonia's" into "freedonias"; a Filter that kept the supporting title,
    or the answer, in the possessive must still get +1, and an answer in the possessive is right (R_LJ 1)."""
    passages = [("Freedonia", "Freedonia is a small country. Its army is led by Rufus T. Firefly.")]
    cases = {"Who leads the army of Freedonia?": (["Rufus T. Firefly"], "Freedonia's army is led by Rufus T. Firefly.",
                                                  "Rufus T. Firefly"),
             "Which country does Rufus T. Firefly lead the army of?": (["Freedonia"],
                                                                      "Rufus T. Firefly leads Freedonia's army.",
                                                                      "Freedonia's")}

    def poss_reply(role, m):
        text = m[0]["content"]
        if role == "decor_planner":
            q = re.search(r"^query: (.*)$", text, re.MULTILINE).group(1)
            return P("None") if "Search 1:" in text else P(q)
        if role == "decor_filter":
            return F(cases[re.search(r"^Search Query: (.*)$", text, re.MULTILINE).group(1)][1])
        return A(cases[re.search(r"^- User's query: (.*)$", text, re.MULTILINE).group(1)][2])

    rows = [{"id": str(i), "question": q, "golden_answers": c[0], "metadata": {"supporting_titles": ["Freedonia"]}}
            for i, (q, c) in enumerate(cases.items())]
    eps = run_decor(rows, Team(ScriptedEngine(poss_reply)), KeywordRetriever(passages), DecorConfig(t_max=2, top_k=1))
    assert [roles_of(e) for e in eps] == [["P", "F", "P", "A"]] * 2
    js = R.RuleJudge().judge(eps)
    # Filter (call 1): title "Freedonia" mentioned as "Freedonia's" (first), the gold kept as "Freedonia's"
    # (second); the answer "Freedonia's" is the gold Freedonia
    assert [j.roles[1] for j in js] == [1.0, 1.0]
    assert [j.lj for j in js] == [1.0, 1.0] and [j.roles[3] for j in js] == [1.0, 1.0]


def test_summarizer_calls_get_no_reward_and_penalty_is_configurable():
    eps = rollouts(("Who covered Red Sky?", "Who sang Red Sky?"))
    eps[0].calls.insert(2, eps[0].calls[1].model_copy(update={"role": "decor_summarizer", "reward": None}))
    R.decor_rewards(eps, R.RuleJudge(), DecorRewardConfig(format_penalty=-2.0))
    assert eps[0].calls[2].reward is None and eps[1].calls[0].reward == -2.0


# ---- LLM judge ----------------------------------------------------------------------------------------------------

def judge_reply(verdicts):
    def reply(role, m):
        assert role == "decor_judge"
        text = m[0]["content"]
        for key, prompt in (("answer", R.JUDGE_ANSWER_PROMPT), ("planner", R.JUDGE_PLANNER_PROMPT),
                            ("filter", R.JUDGE_FILTER_PROMPT), ("answerer", R.JUDGE_ANSWERER_PROMPT)):
            if text.startswith(prompt[:100]):
                return verdicts[key]
        raise AssertionError(text[:80])
    return reply


def test_llm_judge_yes_no_and_garbage_is_a_recorded_error():
    eps = rollouts(("Who covered Red Sky?", "What is the capital of Gamma?", "Who sang Red Sky?"))
    engine = ScriptedEngine(judge_reply({"answer": "YES", "planner": "NO", "filter": "I cannot tell.",
                                         "answerer": "yes."}))
    js = R.decor_rewards(eps, R.LLMJudge(Team(engine)), DecorRewardConfig())
    # one engine call for every judge prompt: B.1 for the two answered episodes, B.2-B.4 for the 10 policy calls
    # of the two that pass the gate; the gated one (no answer) sends nothing
    assert engine.log == [("decor_judge", 2 + 6 + 4)]
    e1, e2, e6 = eps
    assert js[0].lj == 1.0 and js[0].roles == {0: -1.0, 1: 0.0, 2: -1.0, 3: 0.0, 4: -1.0, 5: 1.0}
    assert len(js[0].errors) == 2 and all(e.startswith("decor_filter: not YES or NO") for e in js[0].errors)
    assert len(e1.meta["judge_calls"]) == 7 and len(e1.meta["judge_errors"]) == 2
    bad = [c for c in e1.meta["judge_calls"] if c["format_error"]]
    assert [c["meta"]["judged"] for c in bad] == ["decor_filter", "decor_filter"] and bad[0]["parsed"] is None
    assert bad[0]["response"] == "I cannot tell." and bad[0]["role"] == "decor_judge"
    ok = e1.meta["judge_calls"][0]
    assert ok["meta"] == {"judged": "answer", "call_index": None} and ok["parsed"] == "YES"
    assert "Prediction: the Alpha Band group\nReference Answer: Alpha Band\n" in ok["prompt"][0]["content"]
    # F1 0.8, LJ 1 -> R_team 0.9: NO -> 0.54 − 0.4, judge error -> 0.54 (no role signal), YES -> 0.94
    assert [c.reward for c in e1.calls] == pytest.approx([0.14, 0.54, 0.14, 0.54, 0.14, 0.94])
    assert js[1].lj == 1.0 and e2.meta["reward"]["lj"] == 1.0        # the LLM says YES to "Delta": its call
    assert e6.meta["judge_calls"] == [] and [c.reward for c in e6.calls] == [-1.0]
    # planner judge input: the history that Planner saw, its raw output and the golds
    b2 = next(c for c in e1.meta["judge_calls"] if c["meta"]["call_index"] == 2)["prompt"][0]["content"]
    assert "- History Search Information: Search 1: Red Sky covered\n" in b2
    assert "- Planner Output: <think>missing fact</think>\n<search>Red Sky covered</search>" in b2


def test_llm_judge_lj_only_and_garbage_answer_verdict():
    eps = rollouts(("Who covered Red Sky?", "Who wrote Red Sky?"))
    engine = ScriptedEngine(judge_reply({"answer": "Absolutely"}))
    R.score_lj(eps, R.LLMJudge(Team(engine)))
    assert engine.log == [("decor_judge", 2)]                       # roles not judged for the LJ metric
    assert [e.metrics["lj"] for e in eps] == [0.0, 0.0]
    assert all(e.meta["judge_errors"] == ["answer (call None): not YES or NO: 'Absolutely'"] for e in eps)
    assert isinstance(R.make_judge(DecorConfig(judge="llm"), Team(engine)), R.LLMJudge)
    assert isinstance(R.make_judge(DecorConfig(), Team(engine)), R.RuleJudge)
