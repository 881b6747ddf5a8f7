"""experiments/rl_signal/summarize.py: the seeds of one recipe, from one or more runs of run.sh, each paired with the
one warm-up on the same questions, then summarised over seeds (t-interval) and pooled (issue 25 §3). Worked by hand."""
import importlib.util
from pathlib import Path

import pytest

from ragteam.records import Episode, write_episodes

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("rl_signal_summarize", REPO / "experiments" / "rl_signal" / "summarize.py")
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
