"""studies/rollout_signal/rollout_signal.py: the answer signal of a batch of rollouts, checked against a hand computation
(the frozen roles' calls and questions rolled out once do not count)."""
import importlib.util
from pathlib import Path

import pytest

from ragteam.records import AgentCall, Episode

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("rollout_signal", REPO / "studies" / "rollout_signal" / "rollout_signal.py")
rs = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(rs)


def _call(role, reward, error=None):
    return AgentCall(role=role, prompt=[], format_error=error, reward=reward)


def _ep(q, answer, gold, calls):
    return Episode(question_id=q, question=q, golden_answers=[gold], final_answer=answer, calls=calls)


def test_answer_signal_shares_rewards_and_the_spread_within_a_question():
    eps = [  # qa twice: a right answer (call rewards 1 and 0: episode reward 0.5) and a malformed empty one (-1)
        _ep("qa", "Paris", "Paris", [_call("policy", 1.0), _call("policy", 0.0), _call("frozen", 9.0)]),
        _ep("qa", "", "Paris", [_call("policy", -1.0, "no <answer>")]),
        # qb once, wrong: no spread to measure (one rollout), its call still counts
        _ep("qb", "London", "Rome", [_call("policy", 0.5)])]
    m = rs.measure(eps, {"policy"})
    assert (m["episodes"], m["questions"]) == (3, 2)
    assert m["answered_share"] == round(2 / 3, 4)
    assert m["f1_positive_share"] == round(1 / 3, 4) and m["episode_f1_mean"] == round(1 / 3, 4)
    assert m["call_reward_mean"] == 0.125                 # (1 + 0 - 1 + 0.5) / 4: the frozen role's 9 left out
    assert m["within_question_reward_sd"] == pytest.approx(0.75)   # population sd of 0.5 and -1
    assert m["questions_with_reward_spread"] == 1
    assert m["format_error_rate"] == 0.25


def test_equal_rewards_within_every_question_show_no_spread():
    eps = [_ep("qa", "x", "y", [_call("policy", -1.0, "bad")]) for _ in range(2)]
    m = rs.measure(eps, {"policy"})
    assert m["within_question_reward_sd"] == 0.0 and m["questions_with_reward_spread"] == 0
    assert m["f1_positive_share"] == 0.0 and m["format_error_rate"] == 1.0
