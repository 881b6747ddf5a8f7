"""DECOR's estimator: Eq. 6 role-specific group normalisation and the dynamic-sampling filter, against hand values."""
from __future__ import annotations

import math

import pytest

from ragteam.records import AgentCall, Episode
from ragteam.systems.decor.roles import POLICY_ROLES
from ragteam.train.decor_adv import (EPS, decor_advantages, dynamic_sampling, keep_group, role_group_normalize,
                                     role_returns)


def ep(qid: str, calls: list[tuple[str, float | None]], team: float | None = None) -> Episode:
    e = Episode(question_id=qid, question="q", golden_answers=["a"])
    for role, r in calls:
        e.add_call(AgentCall(role=role, prompt=[], reward=r))
    if team is not None:
        e.meta["reward"] = {"team": team}
    return e


def returns(e: Episode) -> dict[str, float]:
    """DECOR's `returns_of` for dynamic sampling: R_total^{u,i} over its policy roles (what its spec passes)."""
    return role_returns(e, POLICY_ROLES)


def test_eq6_by_hand():
    # group g, 3 trajectories. Planner returns 1, 0, −1: μ = 0, sample σ = sqrt((1 + 0 + 1) / 2) = 1
    # Filter returns 0.5, 0.5, 0.5: σ = 0 -> A = 0. Answerer acted in two trajectories: 0.94, 0.14: μ = 0.54,
    # σ = sqrt(2 · 0.4²) = 0.565685...
    rets = [{"decor_planner": 1.0, "decor_filter": 0.5, "decor_answerer": 0.94},
            {"decor_planner": 0.0, "decor_filter": 0.5},
            {"decor_planner": -1.0, "decor_filter": 0.5, "decor_answerer": 0.14},
            {"decor_planner": 7.0}]                        # alone in group h: A = 0
    adv = role_group_normalize(rets, ["g", "g", "g", "h"], eps=0.0)
    assert adv[0]["decor_planner"] == pytest.approx(1.0) and adv[1]["decor_planner"] == 0.0
    assert adv[2]["decor_planner"] == pytest.approx(-1.0)
    assert all(a["decor_filter"] == 0.0 for a in adv[:3])
    s = math.sqrt(2 * 0.4 ** 2)
    assert adv[0]["decor_answerer"] == pytest.approx(0.4 / s) and adv[2]["decor_answerer"] == pytest.approx(-0.4 / s)
    assert "decor_answerer" not in adv[1] and adv[3] == {"decor_planner": 0.0}
    # ε in the denominator
    assert role_group_normalize(rets, ["g"] * 3 + ["h"])[0]["decor_planner"] == pytest.approx(1 / (1 + EPS))
    with pytest.raises(ValueError, match="3 returns but 2 group ids"):
        role_group_normalize(rets[:3], ["g", "g"])


def test_role_returns_average_steps_and_advantages_align_with_calls():
    # trajectory 1: planner steps 0.94, 0.14 -> R = 0.54; trajectory 2: one planner step −0.4
    e1 = ep("q", [("decor_planner", 0.94), ("decor_filter", 0.94), ("decor_planner", 0.14),
                  ("decor_summarizer", None), ("decor_answerer", 0.94)])
    e2 = ep("q", [("decor_planner", -0.4), ("decor_filter", -0.4), ("decor_answerer", 0.0)])
    assert role_returns(e1, POLICY_ROLES) == pytest.approx({"decor_planner": 0.54, "decor_filter": 0.94,
                                                            "decor_answerer": 0.94})
    adv = decor_advantages([e1, e2], POLICY_ROLES, eps=0.0)
    # two values per role: A = ±(x − μ)/σ with σ = |x1 − x2|/√2 -> ±1/√2 whatever the values
    h = 1 / math.sqrt(2)
    assert adv[0] == pytest.approx([h, h, h, None, h]) and adv[1] == pytest.approx([-h, -h, -h])
    assert adv[0][3] is None                               # the frozen summarizer gets no advantage
    with pytest.raises(ValueError, match="has no reward"):
        decor_advantages([ep("q", [("decor_planner", None)])], POLICY_ROLES)


def test_groups_are_questions():
    es = [ep("a", [("decor_answerer", 1.0)]), ep("b", [("decor_answerer", 0.0)]),
          ep("a", [("decor_answerer", 0.0)]), ep("b", [("decor_answerer", 0.0)])]
    adv = decor_advantages(es, POLICY_ROLES, eps=0.0)
    assert adv[0][0] == pytest.approx(1 / math.sqrt(2)) and adv[2][0] == pytest.approx(-1 / math.sqrt(2))
    assert adv[1] == [0.0] and adv[3] == [0.0]


def test_dynamic_sampling_keeps_groups_where_some_role_return_varies():
    P, F, A = "decor_planner", "decor_filter", "decor_answerer"
    assert keep_group([{A: 0.0}, {A: 0.5}]) and not keep_group([{A: 0.3}, {A: 0.3}]) and not keep_group([])
    # only one role varies: the group carries signal for that role
    assert keep_group([{P: 0.14, F: 0.14, A: 0.94}, {P: 0.14, F: 0.54, A: 0.94}])
    # a role present in one trajectory only has nothing to compare; float noise is no variation
    assert not keep_group([{P: 1.0, F: 0.2}, {P: 1.0}]) and not keep_group([{A: 0.3}, {A: 0.1 + 0.2}])
    # issue 23 §3: R_team = 0 for all (no trajectory answered right), but two pass the format gate and two do not:
    # role rewards 0.6·0 + 0.4·(±1) against the gate's −1. The old rule (0 < mean R_team < 1) dropped this group
    gated = [("decor_planner", -1.0)]
    passed = [("decor_planner", 0.4), ("decor_filter", -0.4), ("decor_planner", 0.4), ("decor_answerer", -0.4)]
    es = [ep("fmt", gated, team=0.0), ep("same", [("decor_answerer", 0.6)], team=1.0), ep("fmt", passed, team=0.0),
          ep("same", [("decor_answerer", 0.6)], team=1.0), ep("fmt", passed, team=0.0), ep("fmt", gated, team=0.0)]
    kept = dynamic_sampling(es, returns)
    assert [e.question_id for e in kept] == ["fmt"] * 4 and kept[0] is es[0]
    adv = decor_advantages(kept, POLICY_ROLES)
    assert any(a not in (None, 0.0) for row in adv for a in row)       # the kept group does train
    assert dynamic_sampling([e for e in es if e.question_id == "same"], returns) == []   # all equal: zero gradient
    with pytest.raises(ValueError, match="has no reward"):
        dynamic_sampling([ep("x", [("decor_planner", None)])], returns)


def test_eq6_statistics_of_a_role_use_only_the_trajectories_where_it_acted():
    """Issue 23 §3: trajectory 3 answered directly (Planner STOP at turn 1, no Filter call). Its Planner and
    Answerer advantages count in their roles' group statistics; the Filter's μ, σ come from trajectories 1, 2."""
    P, F, A = "decor_planner", "decor_filter", "decor_answerer"
    t1 = ep("q", [(P, 0.94), (F, 0.94), (P, 0.94), (A, 0.94)])
    t2 = ep("q", [(P, 0.14), (F, -0.4), (P, 0.14), (A, 0.14)])
    t3 = ep("q", [(P, -0.4), (A, 0.54)])                          # STOP at once: no Filter
    adv = decor_advantages([t1, t2, t3], POLICY_ROLES, eps=0.0)
    # Filter over t1, t2 only: returns 0.94, −0.4 -> ±1/√2 (a 0 for t3 would give μ 0.18, other values)
    h = 1 / math.sqrt(2)
    assert adv[0][1] == pytest.approx(h) and adv[1][1] == pytest.approx(-h)
    # Planner over all three: 0.94, 0.14, −0.4 (μ 0.2267, sample σ 0.6741); Answerer 0.94, 0.14, 0.54 (μ 0.54, σ 0.4)
    pl = [0.94, 0.14, -0.4]
    mu = sum(pl) / 3
    sd = math.sqrt(sum((x - mu) ** 2 for x in pl) / 2)
    assert [adv[0][0], adv[1][0], adv[2][0]] == pytest.approx([(x - mu) / sd for x in pl])
    assert [adv[0][3], adv[1][3], adv[2][1]] == pytest.approx([1.0, -1.0, 0.0])
    assert len(adv[2]) == 2                                         # t3 has no Filter call to advantage
    assert keep_group([role_returns(t, POLICY_ROLES) for t in (t1, t2, t3)])
