"""studies/rl_signal/gpu: the device harness's stand-in for DVCLive writes the curve that summarize.py reads, and
summarize.py pairs each RL seed with the warm-up on the same questions and summarises the seeds (issue 25 §3)."""
import importlib.util
import sys
from pathlib import Path

import pytest

from ragteam.records import Episode, write_episodes

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "studies" / "rl_signal" / "gpu"
SPEC = importlib.util.spec_from_file_location("rl_signal_gpu_summarize", GPU / "summarize.py")
summarize = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(summarize)


def _records(path: Path, f1: dict[str, float]) -> None:
    write_episodes(path, [Episode(question_id=q, question=f"question {q}", golden_answers=["a"],
                                  metrics={"f1": v, "em": float(v == 1.0), "no_answer": float(v == 0.0),
                                           "format_error_questions": 0.0}) for q, v in f1.items()])


@pytest.fixture
def stub_live(monkeypatch):
    monkeypatch.syspath_prepend(str(GPU / "stub"))
    sys.modules.pop("dvclive", None)
    import dvclive
    yield dvclive.Live
    sys.modules.pop("dvclive", None)


def test_seeds_are_paired_with_the_warm_up_and_summarised(tmp_path, stub_live):
    warm = {"q1": 0.0, "q2": 0.5, "q3": 1.0, "q4": 0.0}
    _records(tmp_path / "eval-A" / "mask_warmup" / "synthetic.jsonl", warm)
    _records(tmp_path / "eval-A" / "mask_rl_seed0" / "synthetic.jsonl", {**warm, "q1": 1.0})   # +1 on 4 q: +25
    _records(tmp_path / "eval-A" / "mask_rl_seed1" / "synthetic.jsonl", warm)                  # 0
    _records(tmp_path / "eval-A" / "mask_rl_seed2" / "synthetic.jsonl", {"q1": 0.0, "q2": 1.0, "q3": 1.0})
    with stub_live(dir=str(tmp_path / "A-seed0" / "curves")) as live:      # what train_joint logs through it
        for step, (reward, kl) in enumerate([(-0.5, 0.0), (-0.25, 0.01)], start=1):
            live.step = step
            live.log_metric("reward", reward)
            live.log_metric("kl_start", kl)
    s = summarize.summarize(tmp_path)["recipes"]["A"]
    assert s["warmup"]["f1"] == 37.5 and s["n_questions"] == 4
    assert [s["seeds"][k]["f1"]["diff"] for k in "012"] == [25.0, 0.0, 16.67]   # seed 2: q2 +0.5 over 3 q
    assert s["seeds"]["2"]["n"] == 3                                          # only the questions both answered
    assert s["seeds"]["0"]["curve"] == [{"step": 1, "reward": -0.5, "kl_start": 0.0},
                                        {"step": 2, "reward": -0.25, "kl_start": 0.01}]
    over = s["over_seeds"]["f1"]
    assert over["n"] == 3 and over["mean"] == pytest.approx((25 + 0 + 50 / 3) / 3, abs=0.01)
    assert over["lo"] < over["mean"] < over["hi"]
    md = summarize.markdown({"recipes": {"A": s}})
    assert "| 0 | 62.5 | +25.00 [" in md and "-0.500 → -0.250" in md


def test_a_recipe_without_a_scored_warm_up_is_left_out(tmp_path):
    _records(tmp_path / "eval-B" / "mask_rl_seed0" / "synthetic.jsonl", {"q1": 1.0})
    assert summarize.summarize(tmp_path) == {"recipes": {}}


def test_a_record_that_is_not_an_episode_fails_naming_its_file_and_line(tmp_path):
    (tmp_path / "eval-A" / "mask_warmup").mkdir(parents=True)
    (tmp_path / "eval-A" / "mask_warmup" / "synthetic.jsonl").write_text('{"metrics": {}}\n')
    with pytest.raises(Exception, match=r"synthetic.jsonl:1: not a valid Episode"):
        summarize.summarize(tmp_path)
