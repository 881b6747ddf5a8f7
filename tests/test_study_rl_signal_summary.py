"""studies/rl_signal/summarize.py: the seeds of one recipe, from one or more runs of run.sh, each paired with the
one warm-up on the same questions, then summarised over seeds (t-interval) and pooled (issue 25 §3). Worked by hand."""
import importlib.util
from pathlib import Path

import pytest

from ragteam.records import Episode, write_episodes

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("rl_signal_summarize", REPO / "studies" / "rl_signal" / "summarize.py")
summ = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(summ)


def _records(path: Path, f1: dict[str, float]) -> None:
    write_episodes(path, [Episode(question_id=q, question=f"question {q}", golden_answers=["a"],
                                  metrics={"f1": v, "em": float(v == 1.0), "no_answer": float(v == 0.0),
                                           "format_error_questions": 0.0}) for q, v in f1.items()])


def _curve(run: Path, seed: str, rewards: list[float]) -> None:
    d = run / f"seed{seed}" / "curves" / "plots" / "metrics"
    d.mkdir(parents=True)
    (d / "reward.tsv").write_text("step\treward\n" + "".join(f"{i}\t{r}\n" for i, r in enumerate(rewards, 1)))


WARM = {"q1": 0.0, "q2": 0.5, "q3": 1.0, "q4": 0.0}


def _run(run: Path, seeds: dict[str, dict[str, float]], warm=WARM) -> Path:
    _records(run / "records" / "mask_warmup" / "synthetic.jsonl", warm)
    for seed, f1 in seeds.items():
        _records(run / "records" / f"mask_rl_seed{seed}" / "synthetic.jsonl", f1)
    return run


def test_seeds_from_two_runs_are_paired_with_the_one_warm_up_and_pooled(tmp_path):
    a = _run(tmp_path / "tag", {"0": {**WARM, "q1": 1.0}})                              # +1 on q1: +25
    b = _run(tmp_path / "tag-seeds12", {"1": WARM, "2": {**WARM, "q3": 0.0, "q4": 1.0}})  # 0; -1 and +1: 0
    _curve(a, "0", [-0.5, 0.25])
    s = summ.summarize("mask", [a, b])
    assert s["warmup"]["f1"] == 37.5 and s["n_questions"] == 4
    assert [s["seeds"][k]["f1"]["diff"] for k in "012"] == [25.0, 0.0, 0.0]
    assert s["seeds"]["0"]["curve"] == {"reward": [-0.5, 0.25]} and s["seeds"]["1"]["curve"] == {}
    o = s["over_seeds"]
    assert o["f1"]["n"] == 3 and o["f1"]["mean"] == pytest.approx(25 / 3, abs=0.01)
    assert o["f1"]["sd"] == pytest.approx(14.43, abs=0.01)                    # sd of (25, 0, 0), ddof 1
    # pooled: per question, the seeds' mean minus the warm-up: q1 +1/3, q3 -1/3, q4 +1/3, q2 0 -> mean 1/12
    assert o["pooled_f1"]["diff"] == pytest.approx(100 / 12, abs=0.01)
    md = summ.markdown(s)
    assert "| 0 | 62.5 | +25.00 [" in md and "-0.50 0.25" in md and "t-interval" in md


def test_a_warm_up_that_answered_differently_is_an_error_naming_the_question(tmp_path):
    a = _run(tmp_path / "tag", {"0": WARM})
    b = _run(tmp_path / "other", {"1": WARM}, warm={**WARM, "q2": 1.0})
    with pytest.raises(ValueError, match=r"warm-up's record of q2 differs"):
        summ.summarize("mask", [a, b])


def test_a_seed_in_two_runs_is_an_error(tmp_path):
    a = _run(tmp_path / "tag", {"0": WARM})
    b = _run(tmp_path / "again", {"0": WARM})
    with pytest.raises(ValueError, match="RL seed 0 appears in more than one run"):
        summ.summarize("mask", [a, b])


def test_pair_scores_one_row_against_another_on_their_shared_questions(tmp_path):
    _records(tmp_path / "short.jsonl", WARM)
    _records(tmp_path / "long.jsonl", {"q1": 1.0, "q2": 1.0, "q3": 1.0})       # q4 unanswered by this row
    r = summ.pair(tmp_path / "short.jsonl", tmp_path / "long.jsonl")
    assert r["base_scores"]["f1"] == 37.5 and r["n"] == 3 and r["rl"]["f1"] == 100.0
    assert r["f1"]["diff"] == pytest.approx(50.0)                              # (+1 + 0.5 + 0) / 3


def test_roles_count_each_roles_calls_format_errors_and_mean_tokens(tmp_path):
    from ragteam.records import AgentCall

    def call(role, tokens, error=None):
        return AgentCall(role=role, prompt=[], completion_tokens=tokens, format_error=error)

    run = _run(tmp_path / "tag", {"0": WARM})
    # the warm-up: 2 Update calls, one malformed (9 and 11 tokens); 1 Planning call of 80 tokens
    write_episodes(run / "records" / "mask_warmup" / "synthetic.jsonl", [
        Episode(question_id="q1", question="question q1", golden_answers=["a"], metrics={"f1": 0.0, "em": 0.0,
                "no_answer": 1.0, "format_error_questions": 1.0},
                calls=[call("mask_planning", 80), call("mask_update", 9, "bad <Add> step"), call("mask_update", 11)])])
    write_episodes(run / "records" / "mask_rl_seed0" / "synthetic.jsonl", [
        Episode(question_id="q1", question="question q1", golden_answers=["a"], metrics={"f1": 1.0, "em": 1.0,
                "no_answer": 0.0, "format_error_questions": 0.0}, calls=[call("mask_planning", 40)])])
    s = summ.summarize("mask", [run])
    assert s["warmup_roles"] == {"mask_planning": {"calls": 1, "format_errors": 0, "mean_tokens": 80.0},
                                 "mask_update": {"calls": 2, "format_errors": 1, "mean_tokens": 10.0}}
    assert s["seeds"]["0"]["roles"] == {"mask_planning": {"calls": 1, "format_errors": 0, "mean_tokens": 40.0}}
    md = summ.markdown(s)
    assert "| warm-up | 0 / 1, 80.0 | 1 / 2, 10.0 |" in md and "| RL seed 0 | 0 / 1, 40.0 | – |" in md
