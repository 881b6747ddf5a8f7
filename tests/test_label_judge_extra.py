"""label_judge.extra_candidates: single-retrieval pools of training-pool questions that synthesize did not use are
added to the judge candidates and labelled like the others; wrong requests fail naming the param, nothing written."""
import pytest
from helpers_agents import KeywordRetriever, ScriptedEngine, question_of

import ragteam.retrieval
from ragteam.agents import maps
from ragteam.agents.core import QueryPool
from ragteam.agents.maps_workflow import MapsConfig
from ragteam.config import ParamsError, parse_section
from ragteam.io import DataError, read_jsonl, write_jsonl
from ragteam.llm import LLMConfig, Team
from stages import label_judge
from stages.common import LabelJudgeParams

PASSAGES = [("Ann Lee", "Ann Lee was born in Paris."), ("Bob Ray", "Bob Ray was born in Rome."),
            ("Cy Dow", "Cy Dow was born in Oslo."), ("Di Fox", "Di Fox was born in Lima."),
            ("Ed Gray", "Ed Gray was born in Kyiv.")]
RETRIEVER = KeywordRetriever(PASSAGES)
POOL = [{"id": f"p{i}", "question": f"Where was {name} born?", "golden_answers": [city]}
        for i, (name, city) in enumerate([("Ann Lee", "Paris"), ("Bob Ray", "Rome"), ("Cy Dow", "Oslo"),
                                          ("Di Fox", "Lima"), ("Ed Gray", "Kyiv")])]
XP = label_judge.ExtraParams(retriever="data/indexes/bm25/bm25s", t2_top_k=1)


class Pool:
    """A scripted "trained answer agent": right on Ann Lee and Cy Dow, wrong on everyone else."""

    def team(self, role_models, default, sampling):
        right = {"Where was Ann Lee born?": "Paris", "Where was Cy Dow born?": "Oslo"}
        return Team(ScriptedEngine(lambda r, m: right.get(question_of(m), "Nowhere")), sampling)


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    opened = []
    monkeypatch.setattr(ragteam.retrieval, "open_retriever", lambda index: opened.append(index) or RETRIEVER)
    write_jsonl(tmp_path / "data/prepared/train/pool.jsonl", POOL)
    (tmp_path / "models/agents/answer").mkdir(parents=True)
    (tmp_path / "models/agents/answer/config.json").write_text("{}")   # the scripted Pool stands in for it
    # synthesize labelled p0 and p1 and made one candidate of them (p0)
    write_jsonl(tmp_path / "data/synthesis/difficulty.jsonl", [{"id": "p0", "label": "easy"}, {"id": "p1",
                                                                                                "label": "hard"}])
    pool = QueryPool()
    pool.add(POOL[0]["question"], RETRIEVER.search(POOL[0]["question"], 1))
    write_jsonl(tmp_path / "data/synthesis/judge_candidates.jsonl", [
        {"id": "t2_p0", "question_id": "p0", "question": POOL[0]["question"], "golden_answers": ["Paris"],
         "top_k": 1, "round": 0, "pool": pool.to_dict(), "source": "t2/single_retrieval"}])
    return opened


def test_extra_candidates_are_unused_pool_questions_in_pool_order_with_their_single_retrieval(workspace):
    extra = label_judge.extra_candidates(2, XP)
    assert workspace == ["data/indexes/bm25/bm25s"]
    assert [c["question_id"] for c in extra] == ["p2", "p3"]        # p0, p1 were synthesize's; pool order after that
    assert {c["source"] for c in extra} == {label_judge.EXTRA_SOURCE}
    pools = [QueryPool.from_dict(c["pool"]) for c in extra]
    assert [p.queries for p in pools] == [["Where was Cy Dow born?"], ["Where was Di Fox born?"]]
    assert [[h.title for hs in p.hits for h in hs] for p in pools] == [["Cy Dow"], ["Di Fox"]]   # top t2_top_k = 1
    assert [c["golden_answers"] for c in extra] == [["Oslo"], ["Lima"]]


def test_stage_labels_the_extra_candidates_with_the_synthesis_ones(workspace, tmp_path):
    lp = LabelJudgeParams(n_samples=4, temperature=0.7, max_new_tokens=4, metric="acc", extra_candidates=3)
    stats = label_judge.run(lp, LLMConfig(), MapsConfig(), engines=Pool(), xp=XP)
    rows = [r for _, r in read_jsonl(tmp_path / "data/judge/t3_judge.jsonl")]
    assert {(r["question"], r["source"], r["label"]) for r in rows} == {
        ("Where was Ann Lee born?", "t2/single_retrieval", maps.SUFFICIENT),
        ("Where was Cy Dow born?", label_judge.EXTRA_SOURCE, maps.SUFFICIENT),
        ("Where was Di Fox born?", label_judge.EXTRA_SOURCE, maps.INSUFFICIENT),
        ("Where was Ed Gray born?", label_judge.EXTRA_SOURCE, maps.INSUFFICIENT)}
    assert stats["candidates"] == 4
    assert stats["by_source"] == {"t2/single_retrieval": {maps.SUFFICIENT: 1},
                                  label_judge.EXTRA_SOURCE: {maps.SUFFICIENT: 1, maps.INSUFFICIENT: 2}}
    # 0 (the default) reads neither the pool nor a retriever: synthesize's candidates alone
    workspace.clear()
    stats0 = label_judge.run(lp.model_copy(update={"extra_candidates": 0, "min_per_label": 0}), LLMConfig(),
                             MapsConfig(), engines=Pool())
    assert stats0["candidates"] == 1 and workspace == []


def test_more_extra_candidates_than_unused_questions_fails_naming_the_param_and_keeps_the_labels(workspace, tmp_path):
    lp = LabelJudgeParams(n_samples=4, temperature=0.7, max_new_tokens=4, metric="acc", extra_candidates=3)
    label_judge.run(lp, LLMConfig(), MapsConfig(), engines=Pool(), xp=XP)
    before = (tmp_path / "data/judge/t3_judge.jsonl").read_bytes()
    with pytest.raises(DataError, match=r"label_judge.extra_candidates = 4: only 3 of the 5 questions in "
                                        r"data/prepared/train/pool.jsonl were not used by synthesize \(2 were"):
        label_judge.run(lp.model_copy(update={"extra_candidates": 4}), LLMConfig(), MapsConfig(), engines=Pool(),
                        xp=XP)
    with pytest.raises(ParamsError, match="needs synthesize.retriever"):
        label_judge.run(lp, LLMConfig(), MapsConfig(), engines=Pool())
    (tmp_path / "data/prepared/train/pool.jsonl").unlink()
    with pytest.raises(DataError, match=r"pool.jsonl: missing \(training pool\); run stage prepare_data"):
        label_judge.run(lp, LLMConfig(), MapsConfig(), engines=Pool(), xp=XP)
    assert (tmp_path / "data/judge/t3_judge.jsonl").read_bytes() == before


def test_extra_params_read_two_keys_of_the_synthesize_section():
    params = {"synthesize": {"retriever": "data/indexes/bm25/bm25s", "t2_top_k": 3, "max_questions": 64,
                             "difficulty": {"k": 4}}}
    xp = parse_section(params, "synthesize", label_judge.ExtraParams)
    assert (xp.retriever, xp.t2_top_k) == ("data/indexes/bm25/bm25s", 3)
    with pytest.raises(ParamsError, match=r"synthesize.t2_top_k: .*greater than or equal to 1"):
        parse_section({"synthesize": {"retriever": "x", "t2_top_k": 0}}, "synthesize", label_judge.ExtraParams)
    with pytest.raises(ParamsError, match=r"label_judge.extra_candidates: .*greater than or equal to 0"):
        parse_section({"label_judge": {"n_samples": 4, "temperature": 0.7, "max_new_tokens": 4,
                                       "extra_candidates": -1}}, "label_judge", LabelJudgeParams)
