"""The mirror-study scripts: studies/judge_pools/judge_pools.py (extra judge candidates),
studies/joint_mirror/joint_mirror.py (LJ intervals from per-question results),
studies/replicate_mirror/replicate_maps_seeds.py (a chosen subset of stages) and studies/team_mirror/team_mirror.py
(trained vs untrained MAPS per seed, paired with one untrained run)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers_agents import KeywordRetriever

REPO = Path(__file__).resolve().parents[1]


def _load(name: str, study: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "studies" / study / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


judge_pools = _load("judge_pools", "judge_pools")
joint_mirror = _load("joint_mirror", "joint_mirror")
replicate = _load("replicate_maps_seeds", "replicate_mirror")
team = _load("team_mirror", "team_mirror")


def _jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    pool = [{"id": f"q{i}", "question": f"Where was person{i} born?", "golden_answers": [f"city{i}"]}
            for i in range(6)]
    _jsonl(src / "data/prepared/train/pool.jsonl", pool)
    (src / "data/indexes/bm25/bm25s").mkdir(parents=True)
    (src / "models/llm").mkdir(parents=True)
    _jsonl(src / "data/synthesis/difficulty.jsonl", pool[:2])  # synthesis used q0, q1
    _jsonl(src / "data/synthesis/t1_answer.jsonl", [{"id": "q0#t1_0"}])
    _jsonl(src / "data/synthesis/judge_candidates.jsonl",
           [{"id": "q0#t1_0", "question_id": "q0", "source": "t1/debate"},
            {"id": "q1#t2_0", "question_id": "q1", "source": "t2/single_retrieval"}])
    return src


def test_judge_pools_adds_unused_pool_questions_after_synthesis_candidates(tmp_path, monkeypatch):
    import ragteam.retrieval

    src = _source(tmp_path)
    passages = [(f"person{i}", f"person{i} was born in city{i}.") for i in range(6)]
    opened = []
    monkeypatch.setattr(ragteam.retrieval, "open_retriever",
                        lambda path: opened.append((path, Path.cwd())) or KeywordRetriever(passages))
    dest = tmp_path / "out/source"
    info = judge_pools.build_source(src, dest, extra=3, top_k=2, retriever_dir="data/indexes/bm25/bm25s")
    assert info == {"synthesis_candidates": 2, "extra_candidates": 3,
                    "by_source": {"t1/debate": 1, "t2/single_retrieval": 1, "extra/single_retrieval": 3}}
    # the index is opened from the new workspace (it names its corpus relative to it)
    assert opened == [("data/indexes/bm25/bm25s", dest)]
    rows = [json.loads(x) for x in (dest / "data/synthesis/judge_candidates.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows[:2]] == ["q0#t1_0", "q1#t2_0"]          # synthesis' own, unchanged, first
    extra = rows[2:]
    assert [r["question_id"] for r in extra] == ["q2", "q3", "q4"]       # not the ones synthesis used
    assert all(r["source"] == "extra/single_retrieval" for r in extra)
    assert extra[0]["pool"]["queries"] == ["Where was person2 born?"]    # one retrieval, the question as the query
    assert "city2" in extra[0]["pool"]["docs"][0][0]["contents"]
    # every other input is a link to the source, not a copy
    for rel in ("data/prepared", "data/indexes", "models/llm", "data/synthesis/t1_answer.jsonl"):
        assert (dest / rel).is_symlink()
    assert not (dest / "data/synthesis/judge_candidates.jsonl").is_symlink()
    assert (src / "data/synthesis/judge_candidates.jsonl").read_text().count("\n") == 2  # source untouched


def test_judge_pools_refuses_more_extra_questions_than_the_pool_has(tmp_path, monkeypatch):
    import ragteam.retrieval

    monkeypatch.setattr(ragteam.retrieval, "open_retriever", lambda path: KeywordRetriever([("a", "b")]))
    with pytest.raises(SystemExit, match=r"--extra 5: label_judge.extra_candidates = 5: only 4 of the 6 questions"):
        judge_pools.build_source(_source(tmp_path), tmp_path / "out", 5, 2, "data/indexes/bm25/bm25s")


def test_lj_intervals_from_per_question_results(tmp_path):
    res = tmp_path / "results"
    _jsonl(res / "decor/a.jsonl", [{"metrics": {"lj": v}} for v in [1.0] * 10])
    _jsonl(res / "decor/b.jsonl", [{"metrics": {"lj": v}} for v in [0.0] * 10])
    out = joint_mirror.lj_intervals(res, "decor", ["a", "b"], resamples=200)
    assert out == {"a": [100.0, 100.0], "b": [0.0, 0.0], "avg": [50.0, 50.0]}  # constant scores: no spread
    _jsonl(res / "decor/c.jsonl", [{"metrics": {"lj": float(i % 2)}} for i in range(40)])
    lo, hi = joint_mirror.lj_intervals(res, "decor", ["c"], resamples=500)["c"]
    assert lo < 50.0 < hi
    _jsonl(res / "mask/a.jsonl", [{"metrics": {"f1": 1.0}}])  # a system without LJ
    assert joint_mirror.lj_intervals(res, "mask", ["a"]) == {}


def test_replicate_runs_only_the_chosen_stages_and_keeps_their_outputs(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for rel in replicate.SHARED:
        (src / rel).mkdir(parents=True)
    ran = []

    def fake_run(cmd, cwd, **kw):  # a stage writes its metrics where the script looks for them
        stage = cmd[-1].split(".")[-1]
        ran.append(stage)
        if stage == "evaluate":
            (Path(cwd) / "metrics").mkdir(exist_ok=True)
            (Path(cwd) / "metrics/eval.json").write_text('{"maps": {}}')
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(replicate.subprocess, "run", fake_run)
    seed, failed, _ = replicate.run_seed(src, tmp_path / "out", 3, [("eval.n_questions", 5)], {},
                                         stages=("train_answer", "evaluate"))
    assert (seed, failed, ran) == (3, None, ["train_answer", "evaluate"])
    assert json.loads((tmp_path / "out/seed3.eval.json").read_text()) == {"maps": {}}
    assert not (tmp_path / "out/seed3.json").exists()              # evaluate_agents did not run
    params = yaml.safe_load((tmp_path / "out/work/seed3/params.yaml").read_text())
    assert params["eval"]["n_questions"] == 5 and params["train_answer"]["stage1"]["seed"] == 3


def test_judge_pools_needs_a_source_except_for_the_control(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "studies/judge_pools/judge_pools.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--source is required (except with --control)" in done.stderr


def test_replicate_rejects_an_unknown_stage():
    script = REPO / "studies/replicate_mirror/replicate_maps_seeds.py"
    done = subprocess.run([sys.executable, str(script), "--out", "/tmp/x", "--stages", "synthesize"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "invalid choice: 'synthesize'" in done.stderr


def test_judge_pools_control_retrains_on_the_same_labels_without_the_extra_rows(tmp_path, monkeypatch):
    out = tmp_path / "study"
    run = out / "work/seed1"
    for d in ("ragteam", "stages", "data/prepared", "data/indexes", "data/synthesis", "models/llm",
              "models/agents/answer"):
        (run / d).mkdir(parents=True)
    (run / "params.yaml").write_text("eval_agents: {agents: [judge]}\n")
    _jsonl(run / "data/judge/t3_judge.jsonl",
           [{"id": "a", "source": "t1/debate"}, {"id": "b", "source": "extra/single_retrieval"},
            {"id": "c", "source": "t2/single_retrieval"}])
    ran = []

    def fake_run(cmd, cwd, **kw):
        ran.append(cmd[-1])
        work = Path(cwd)
        if cmd[-1] == "stages.train_judge":  # what the judge is trained on
            ran.append([json.loads(x)["id"] for x in (work / "data/judge/t3_judge.jsonl").read_text().splitlines()])
        else:
            (work / "metrics").mkdir(exist_ok=True)
            (work / "metrics/eval_agents.json").write_text('{"avg": {}}')
            (work / "results/eval_agents").mkdir(parents=True)
            (work / "results/eval_agents/questions.json").write_text("{}")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(judge_pools.subprocess, "run", fake_run)
    judge_pools.control(out, 1, {})
    assert ran == ["stages.train_judge", ["a", "c"], "stages.evaluate_agents"]
    work = out / "control/work/seed1"
    assert (work / "models/agents/answer").resolve() == (run / "models/agents/answer").resolve()  # same answer agent
    assert (work / "params.yaml").read_text() == (run / "params.yaml").read_text()
    assert (out / "control/seed1.json").read_text() == '{"avg": {}}'
    assert (out / "control/seed1.questions.json").is_file()
    assert [json.loads(x)["id"] for x in (run / "data/judge/t3_judge.jsonl").read_text().splitlines()] == \
        ["a", "b", "c"]  # the study's own labels untouched
    with pytest.raises(SystemExit, match="no data/judge/t3_judge.jsonl"):
        judge_pools.control(out, 2, {})


def test_judge_pools_side_by_side_pairs_the_two_judges_of_each_seed(tmp_path):
    def questions(right, reference, ids=("q1", "q2", "q3", "q4")):
        return {"benchmarks": {"b": {"ids": list(ids), "judge": {"trained": {"right": right, "reference": reference}}}}}

    ref = [1.0, 0.0, 1.0, 0.0]
    (tmp_path / "control").mkdir()
    for seed, (ext, ctl) in {0: ([1, 1, 1, 1], [0, 1, 0, 1]), 1: ([1, 1, 0, 1], [0, 1, 0, 1])}.items():
        (tmp_path / f"seed{seed}.questions.json").write_text(json.dumps(questions([float(x) for x in ext], ref)))
        (tmp_path / "control" / f"seed{seed}.questions.json").write_text(
            json.dumps(questions([float(x) for x in ctl], ref)))
    out = judge_pools.side_by_side(tmp_path, [0, 1], ["b"], resamples=300)
    # seed 0: extra 100 (all right), control 50 (recall 0 on positives, 1 on negatives); seed 1: extra 75
    assert out["per_seed"]["0"]["b"]["extra"][0] == 100.0 and out["per_seed"]["0"]["b"]["control"][0] == 50.0
    assert out["per_seed"]["1"]["b"]["extra"][0] == 75.0 and out["per_seed"]["1"]["b"]["diff"][0] == 25.0
    assert out["pooled"]["b"]["extra"][0] == 87.5 and out["pooled"]["b"]["diff"][0] == 37.5
    assert out["pooled"]["avg"]["diff"][0] == 37.5
    assert json.loads((tmp_path / "side_by_side.json").read_text())["pooled"] == out["pooled"]
    for seed in (0, 1):
        (tmp_path / f"seed{seed}/metrics").mkdir(parents=True)
        (tmp_path / f"seed{seed}/metrics/label_judge.json").write_text(json.dumps(
            {"Sufficient Information": 5, "Insufficient Information": 9,
             "by_source": {"t1/debate": {"Insufficient Information": 4}, "extra/single_retrieval": {
                 "Sufficient Information": 4, "Insufficient Information": 5},
                 "t2/single_retrieval": {"Sufficient Information": 1}}}))
    lines = judge_pools.table(tmp_path).splitlines()
    assert lines[2].startswith("| 0 | 5 / 9 | 1 / 4 | 50.00 [") and "| 50.00 [" in lines[2]  # diff 50 for seed 0
    assert lines[-1].startswith("| pooled, Avg | | | 50.00 [") and lines[-1].endswith("| 37.50 [0.00, 75.00] |")  # 0 inside: not bold
    assert (tmp_path / "side_by_side.md").read_text().splitlines() == lines
    (tmp_path / "seed1.questions.json").write_text(json.dumps(questions([1.0] * 4, ref, ("q1", "q2", "q3", "q9"))))
    (tmp_path / "control/seed1.questions.json").write_text(
        json.dumps(questions([1.0] * 4, ref, ("q1", "q2", "q3", "q9"))))
    with pytest.raises(SystemExit, match="seed 1: scored on other questions than seed 0"):
        judge_pools.side_by_side(tmp_path, [0, 1], ["b"], resamples=10)
    (tmp_path / "seed1.questions.json").write_text(json.dumps(questions([1.0] * 4, ref)))
    (tmp_path / "control/seed1.questions.json").write_text(json.dumps(questions([0.0] * 4, [0.0, 0.0, 1.0, 0.0])))
    with pytest.raises(SystemExit, match="seed 1, b: the two judges were not scored on the same questions"):
        judge_pools.side_by_side(tmp_path, [0, 1], ["b"], resamples=10)


def _episodes(seed_dir: Path, system: str, em: dict[str, list[float]], ids=None) -> None:
    """Episodes as the evaluate stage writes them, then the seed's scores.json as team_mirror keeps it."""
    from ragteam.records import Episode, write_episodes

    results = seed_dir / "work_results"
    for b, xs in em.items():
        write_episodes(results / system / f"{b}.jsonl", [
            Episode(question_id=(ids or {}).get(b, [f"q{i}" for i in range(len(xs))])[i], question="q?",
                    golden_answers=["a"], system=system, final_answer=f"a{i}", metrics={"em": x, "f1": x})
            for i, x in enumerate(xs)])
    team.write_scores(results, seed_dir / "scores.json")


def test_team_summary_pairs_every_seed_with_the_one_untrained_run(tmp_path):
    n = 20
    hp, tw = "hotpotqa", "2wikimultihopqa"
    _episodes(tmp_path / "seed0", "maps_untrained", {hp: [0.0] * n, tw: [0.0] * n})
    _episodes(tmp_path / "seed0", "maps", {hp: [1.0] * 4 + [0.0] * 16, tw: [1.0] * 10 + [0.0] * 10})
    _episodes(tmp_path / "seed1", "maps", {hp: [0.0] * n, tw: [1.0] * 6 + [0.0] * 14})
    r = team.summarize(tmp_path, [0, 1], resamples=500)
    kept = json.loads((tmp_path / "seed0/scores.json").read_text())
    assert sorted(kept) == ["maps", "maps_untrained"]
    assert kept["maps"]["hotpotqa"][0] == {"id": "q0", "answer": "a0", "em": 1.0, "f1": 1.0, "no_answer": 0.0,
                                           "format_error_questions": 0.0, "resampled": 0.0}
    assert r["untrained_from"] == "seed0" and r["n"] == [n, n]
    s0, s1, pooled = r["per_seed"]["0"], r["per_seed"]["1"], r["pooled"]
    assert s0["hotpotqa"]["em"]["diff"][0] == pytest.approx(20.0) and s0["2wikimultihopqa"]["em"]["diff"][0] == 50.0
    assert s0["avg"]["em"]["diff"][0] == pytest.approx(35.0) and s0["avg"]["em"]["diff_excludes_zero"]
    assert s1["hotpotqa"]["em"]["diff"][0] == 0.0 and not s1["hotpotqa"]["em"]["diff_excludes_zero"]
    # pooled = the mean over seeds of each seed's gain; its sd over seeds is reported next to it
    assert pooled["avg"]["f1"]["diff"][0] == pytest.approx((35.0 + 15.0) / 2)
    assert pooled["avg"]["f1"]["diff_per_seed"] == pytest.approx([35.0, 15.0])
    seeds = pooled["2wikimultihopqa"]["em"]["over_seeds"]
    assert (seeds["mean"], seeds["sd"]) == (40.0, pytest.approx(float(np.std([50.0, 30.0], ddof=1)), abs=0.01))
    assert seeds["lo"] < 0 < 40 < seeds["hi"]        # t(1) over two seeds: wide, unlike the pooled bootstrap
    md = (tmp_path / "team.md").read_text()
    assert "| EM | Avg | 0.00 | 25.00 | +35.00, +15.00 | +25.00 ± 14.14 [" in md and "| **+25.00 [" in md
    assert pooled["avg"]["no_answer"]["diff"][0] == 0.0 and "| No answer % | Avg | 0.00 | 0.00 |" in md
    # every answer differs ("a0", "a1", ...): the most common one holds 2 of 40 (a<i> once per benchmark)
    assert r["top_answer"]["maps (seed0)"] == {"answer": "a0", "count": 2, "n": 40, "share": 5.0}
    assert "| maps_untrained (seed0) | 'a0' | 2 of 40 (5.0 %) |" in md


def test_scores_keep_the_questions_answered_by_the_answer_fallback(tmp_path):
    from ragteam.records import AgentCall, Episode, write_episodes

    def ep(i, meta):
        e = Episode(question_id=f"q{i}", question="q?", golden_answers=["a"], system="maps", final_answer="a",
                    metrics={"em": 1.0, "f1": 1.0})
        e.add_call(AgentCall(role="answer_agent", prompt=[], response="a", parsed="a", meta=meta))
        return e

    metas = [{}, {"resampled": {"from": "Answer:", "draw": 2, "of": 4}},
             {"resampled": {"from": "", "draw": 0, "of": 4}}]
    for b in team.BENCHMARKS:
        write_episodes(tmp_path / "res/maps" / f"{b}.jsonl", [ep(i, m) for i, m in enumerate(metas)])
    kept = team.write_scores(tmp_path / "res", tmp_path / "scores.json")
    rows = kept["maps"]["hotpotqa"]
    assert [r["resampled"] for r in rows] == [0.0, 1.0, 0.0]           # a draw answered only the second
    assert [r["format_error_questions"] for r in rows] == [0.0, 1.0, 1.0]   # both went to the fallback


def test_team_summary_shows_a_stub_answer_that_replaced_silence(tmp_path):
    rows = lambda answers: [{"id": f"q{i}", "answer": a, "em": 0.0, "f1": 0.0, "no_answer": float(not a),  # noqa
                             "format_error_questions": 0.0} for i, a in enumerate(answers)]
    for seed, system, answers in ((0, "maps_untrained", ["", "", "x", "y"]),
                                  (0, "maps", ["The answer is 1", "1", "1.", "y"])):
        f = tmp_path / f"seed{seed}" / "scores.json"
        f.parent.mkdir(exist_ok=True)
        kept = json.loads(f.read_text()) if f.is_file() else {}
        kept[system] = {b: rows(answers) for b in team.BENCHMARKS}
        f.write_text(json.dumps(kept))
    r = team.summarize(tmp_path, [0], resamples=100)
    assert r["top_answer"]["maps_untrained (seed0)"]["answer"] == ""
    assert r["top_answer"]["maps (seed0)"] == {"answer": "1", "count": 4, "n": 8, "share": 50.0}
    assert "| maps (seed0) | '1' | 4 of 8 (50.0 %) |" in (tmp_path / "team.md").read_text()


def test_team_summary_reads_silence_from_scores_written_before_it_was_kept(tmp_path):
    """scores.json of the committed 3-seed study has id, answer, EM, F1: no answer is derived from the answer."""
    rows = lambda answers: [{"id": f"q{i}", "answer": a, "em": 0.0, "f1": 0.0} for i, a in enumerate(answers)]  # noqa
    for seed, system, answers in ((0, "maps_untrained", ["x", "y"]), (0, "maps", ["", "y"]), (1, "maps", ["", ""])):
        f = tmp_path / f"seed{seed}" / "scores.json"
        f.parent.mkdir(exist_ok=True)
        kept = json.loads(f.read_text()) if f.is_file() else {}
        kept[system] = {b: rows(answers) for b in team.BENCHMARKS}
        f.write_text(json.dumps(kept))
    r = team.summarize(tmp_path, [0, 1], resamples=200)
    assert r["pooled"]["avg"]["no_answer"]["diff_per_seed"] == [50.0, 100.0]
    assert r["keys"] == ["em", "f1", "no_answer"]          # format errors need the calls an old file did not keep


def test_team_summary_refuses_seeds_scored_on_other_questions(tmp_path):
    hp, tw = "hotpotqa", "2wikimultihopqa"
    _episodes(tmp_path / "seed0", "maps_untrained", {hp: [0.0] * 3, tw: [0.0] * 3})
    _episodes(tmp_path / "seed0", "maps", {hp: [1.0] * 3, tw: [0.0] * 3})
    _episodes(tmp_path / "seed1", "maps", {hp: [1.0] * 3, tw: [0.0] * 3}, ids={hp: ["x", "y", "z"]})
    with pytest.raises(SystemExit, match="seed 1: maps was scored on other questions than seed0's maps_untrained"):
        team.summarize(tmp_path, [0, 1], resamples=100)
    with pytest.raises(SystemExit, match="no seed\\*/scores.json with maps_untrained rows"):
        team.summarize(tmp_path / "seed1", [1], resamples=100)


def test_team_workspace_links_the_seed_agents_and_evaluates_untrained_only_once(tmp_path):
    src = tmp_path / "agents/work/seed1"
    for rel in ("models/agents/answer", "models/agents/judge"):
        (src / rel).mkdir(parents=True)
        (src / rel / "config.json").write_text("{}")
    for rel in team.LINKED:
        (src / rel).mkdir(parents=True)
    (src / "params.yaml").write_text(yaml.safe_dump({"eval": {"benchmarks": "all", "n_questions": 8,
                                                              "systems": {"native": {"workflow": "native"}}}}))
    work = team.workspace(tmp_path / "agents", tmp_path / "w1", 1, 100, first=False, query_from=None)
    p = yaml.safe_load((work / "params.yaml").read_text())["eval"]
    assert p["benchmarks"] == ["hotpotqa", "2wikimultihopqa"] and p["n_questions"] == 100
    assert p["systems"] == {"maps": {"workflow": "maps", "trained_agents": True}} and p["compare"] == []
    assert (work / "models/agents/answer").resolve() == (src / "models/agents/answer").resolve()
    assert (work / "stages/evaluate.py").is_file() and not (work / "models/agents/query").exists()
    work = team.workspace(tmp_path / "agents", tmp_path / "w0", 1, 100, first=True, query_from=None)
    p = yaml.safe_load((work / "params.yaml").read_text())["eval"]
    assert list(p["systems"]) == ["maps_untrained", "maps"] and p["compare"] == [["maps", "maps_untrained"]]
    with pytest.raises(SystemExit, match="seed2/params.yaml: missing"):
        team.workspace(tmp_path / "agents", tmp_path / "w2", 2, 100, first=True, query_from=None)
