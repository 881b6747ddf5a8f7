"""MAPS data synthesis (Algorithm 1) with a scripted engine: labels, Q1/Q2 routing, T1 snapshots, T2, judge labels."""
import pytest
from helpers_agents import KeywordRetriever, ScriptedEngine, n_queries, question_of

from ragteam.agents.debate import DebateConfig
from ragteam.llm import Completion, SamplingConfig, Team
from ragteam.train import synthesis

PASSAGES = [("Ann Lee", "Ann Lee was born in Paris."), ("Paris", "Paris is a city in France."),
            ("Bob Ray", "Bob Ray was born in Rome."), ("Rome", "Rome is a city in Italy."),
            ("Cy Dow", "Cy Dow is a painter."), ("Oslo", "Oslo is a city in Norway.")]
ROWS = [{"id": "q1", "question": "Where was Ann Lee born?", "golden_answers": ["Paris"], "metadata": {}},
        {"id": "q2", "question": "In which country was Bob Ray born?", "golden_answers": ["Italy"], "metadata": {}},
        {"id": "q3", "question": "What does Cy Dow paint?", "golden_answers": ["portraits"], "metadata": {}}]
KNOWN = {"Where was Ann Lee born?": "Paris"}  # the scripted answer agent only knows this one


def _reply(role, msgs):
    q = question_of(msgs)
    if role == "answer_agent":
        return KNOWN.get(q, "I do not know")
    if role == "proponent":
        return "The documents suffice."
    if role == "opponent":  # expand twice, then concede: 3 rounds, snapshots of 1, 2, 3 queries
        return "Concede" if n_queries(msgs) >= 3 else "Not enough.\nQuery Expansion: [Rome Italy city]"
    if role == "moderator":
        return "Opponent"
    raise AssertionError(role)


def test_difficulty_routes_hard_to_q1_and_counts_k_samples():
    eng = ScriptedEngine(_reply)
    team, ret = Team(eng), KeywordRetriever(PASSAGES)
    rule = synthesis.DifficultyRule(k=4, easy_min=4, hard_max=0, metric="acc")
    out = synthesis.label_difficulty(ROWS, team, ret, rule, top_k=2, temperature=1.0, max_new_tokens=8,
                                     passage_words=None, seed=0)
    assert [r["metadata"]["difficulty"] for r in out] == ["easy", "hard", "hard"]
    assert [r["metadata"]["n_correct"] for r in out] == [4, 0, 0]
    assert eng.steps("answer_agent") == [3]  # one batched call for all questions
    assert rule.label(2) == "medium"


def test_debate_samples_snapshot_every_round_and_split_top_k():
    eng = ScriptedEngine(_reply)
    ret = KeywordRetriever(PASSAGES)
    t1, eps = synthesis.debate_samples(ROWS, Team(eng), ret, DebateConfig(max_rounds=3), first_n_top3=1)
    by_q = {}
    for s in t1:
        by_q.setdefault(s["question_id"], []).append(s)
    assert set(by_q) == {"q1", "q2", "q3"}
    for q, samples in by_q.items():
        assert [s["n_queries"] for s in samples] == [1, 2, 3]  # initial retrieval + 2 expansions, then concede
        assert [s["round"] for s in samples] == [0, 1, 2]
        assert {s["top_k"] for s in samples} == ({3} if q == "q1" else {5})
        assert samples[-1]["pool"]["queries"][1] == "Rome Italy city"
    assert len({s["id"] for s in t1}) == len(t1)
    assert all(len(s["pool"]["docs"][0]) <= s["top_k"] for s in t1)


def test_query_samples_are_single_retrieval_pools():
    t2 = synthesis.query_samples(ROWS[1:], KeywordRetriever(PASSAGES), top_k=2)
    assert [s["pool"]["queries"] for s in t2] == [[r["question"]] for r in ROWS[1:]]
    assert all(s["n_queries"] == 1 and 1 <= s["n_chunks"] <= 2 for s in t2)


class _MixedEngine:
    """Sample i of each prompt answers `answers[question][i % len]`: lets a candidate be unanimous or mixed."""

    model_path = "mixed"

    def __init__(self, answers):
        self.answers = answers

    def generate(self, prompts, sampling: SamplingConfig):
        return [[Completion(self.answers[question_of(m)][i % len(self.answers[question_of(m)])], 10, 2, "stop")
                 for i in range(sampling.n)] for m in prompts]


def test_judge_labels_by_sixteen_sample_unanimity():
    cands = synthesis.query_samples(ROWS, KeywordRetriever(PASSAGES), top_k=2)
    eng = _MixedEngine({ROWS[0]["question"]: ["Paris"], ROWS[1]["question"]: ["Rome"],
                        ROWS[2]["question"]: ["portraits", "landscapes"]})
    out, stats = synthesis.label_judge(cands, Team(eng), n_samples=16, temperature=1.0, max_new_tokens=8,
                                       passage_words=None, seed=0)
    assert [(r["question_id"], r["label"]) for r in out] == [("q1", synthesis.SUFFICIENT),
                                                            ("q2", synthesis.INSUFFICIENT)]
    assert stats["dropped"] == 1 and abs(stats["drop_rate"] - 1 / 3) < 1e-9
    assert out[0]["messages"][-1] == {"role": "assistant", "content": "Sufficient Information"}
    assert out[0]["messages"][0]["content"].startswith("Determine whether the EXISTING QUERIES")


def test_split_questions_routes_by_label_and_caps_each_pool():
    label = {"h": "hard", "e": "easy", "m": "medium"}
    rows = [{"id": str(i), "metadata": {"difficulty": label[c]}} for i, c in enumerate("hehmhhme")]
    q1, q2 = synthesis.split_questions(rows, ["hard"])
    assert [r["id"] for r in q1] == ["0", "2", "4", "5"] and [r["id"] for r in q2] == ["1", "3", "6", "7"]
    q1, q2 = synthesis.split_questions(rows, ["hard", "medium"], max_q1=3, max_t2=1)
    assert [r["id"] for r in q1] == ["0", "2", "3"] and [r["id"] for r in q2] == ["1"]  # first n, order kept
    q1, q2 = synthesis.split_questions(rows, ["hard"], max_q1=100, max_t2=0)  # a cap above the count: all
    assert len(q1) == 4 and len(q2) == 4


def test_judge_label_thresholds_relax_unanimity_and_are_checked():
    cands = synthesis.query_samples(ROWS, KeywordRetriever(PASSAGES), top_k=2)
    # q3's answers alternate: 8 of 16 contain the gold "portraits"; q1 16/16; q2 0/16
    eng = _MixedEngine({ROWS[0]["question"]: ["Paris"], ROWS[1]["question"]: ["Rome"],
                        ROWS[2]["question"]: ["portraits", "landscapes"]})
    gold = ROWS[2]["golden_answers"][0]
    assert gold == "portraits"
    out, stats = synthesis.label_judge(cands, Team(eng), n_samples=16, temperature=1.0, max_new_tokens=8,
                                       passage_words=None, seed=0, sufficient_min=8)
    assert [r["label"] for r in out] == [synthesis.SUFFICIENT, synthesis.INSUFFICIENT, synthesis.SUFFICIENT]
    assert out[2]["n_correct"] == 8 and stats["dropped"] == 0
    out, _ = synthesis.label_judge(cands, Team(eng), n_samples=16, temperature=1.0, max_new_tokens=8,
                                   passage_words=None, seed=0, sufficient_min=9, insufficient_max=8)
    assert out[2]["label"] == synthesis.INSUFFICIENT
    with pytest.raises(ValueError, match="insufficient_max \\(8\\) < sufficient_min \\(8\\)"):
        synthesis.label_judge(cands, Team(eng), n_samples=16, temperature=1.0, max_new_tokens=8,
                              passage_words=None, seed=0, sufficient_min=8, insufficient_max=8)


def test_oversampling_balances_the_judge_labels_deterministically():
    from ragteam.train.maps import oversample_labels
    from ragteam.train.sft import SFTSample

    def s(i, label):
        return SFTSample(id=f"c{i}", prompt=[{"role": "user", "content": f"q{i}"}], completion=label)

    rows = [s(0, "Sufficient Information")] + [s(i, "Insufficient Information") for i in range(1, 6)]
    out = oversample_labels(rows)
    assert [r.completion for r in out].count("Sufficient Information") == 5
    assert [r.completion for r in out].count("Insufficient Information") == 5
    assert [r.id for r in out[6:]] == ["c0#r1", "c0#r2", "c0#r3", "c0#r4"]
    assert oversample_labels(rows) == out and oversample_labels([]) == []
