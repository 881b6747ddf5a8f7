"""studies/decor_temperature/decor_temperature.py: what it reports from a rollout (the figures in docs/joint.md), checked on
hand-built DECOR trajectories whose answer is worked out here."""
import importlib.util
from pathlib import Path

from ragteam.records import AgentCall, Episode
from ragteam.systems.decor import roles as D

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("decor_temperature", REPO / "studies" / "decor_temperature" / "decor_temperature.py")
dt = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(dt)


def _call(role, reward, error=None, finish="stop"):
    return AgentCall(role=role, prompt=[], format_error=error, finish_reason=finish, reward=reward)


def _ep(q, calls, team, ok):
    return Episode(question_id=q, question=q, golden_answers=["x"], calls=calls,
                   meta={"reward": {"team": team, "format_ok": ok}})


def test_format_errors_budget_cuts_and_the_groups_dynamic_sampling_keeps():
    eps = [  # q1: one trajectory passes the gate, one is cut in the Planner -> the Planner's return varies: kept
        _ep("q1", [_call(D.PLANNER, 0.5), _call(D.SUMMARIZER, None), _call(D.FILTER, 0.5), _call(D.ANSWERER, 0.5)],
            1.0, True),
        _ep("q1", [_call(D.PLANNER, -1.0, "<think> not closed", "length")], 0.0, False),
        # q2: both trajectories fail the Filter the same way -> every role's return equal: dropped
        _ep("q2", [_call(D.PLANNER, -1.0), _call(D.FILTER, -1.0, "<think> duplicated")], 0.0, False),
        _ep("q2", [_call(D.PLANNER, -1.0), _call(D.FILTER, -1.0, "<think> duplicated")], 0.0, False)]
    m = dt.measure(eps)
    assert (m["groups"], m["groups_kept"], m["groups_kept_share"]) == (2, 1, 0.5)
    assert m["calls"] == 8 and m["format_error_rate"] == round(3 / 8, 4)    # the summarizer is not counted
    assert m["per_role"][D.PLANNER] == {"calls": 4, "format_error_rate": 0.25, "errors_cut_at_budget": 1,
                                        "reasons": {"<think> not closed": 1}}
    assert m["per_role"][D.FILTER]["format_error_rate"] == round(2 / 3, 4)
    assert m["per_role"][D.FILTER]["errors_cut_at_budget"] == 0
    assert m["trajectories_without_format_error"] == 0.25 and m["format_ok_share"] == 0.25
    assert m["mean_team_reward"] == 0.25
