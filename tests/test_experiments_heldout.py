"""The held-out agent comparison's scoring (experiments/agents_heldout.py) against hand-computed values."""
import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "agents_heldout", Path(__file__).resolve().parents[1] / "experiments" / "agents_heldout.py")
heldout = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(heldout)


def test_judge_scores_balanced_accuracy_and_malformed_count_as_wrong():
    texts = ["Sufficient Information", "Insufficient Information.", "insufficient information", "maybe"]
    reference = [True, True, False, False]  # answer agent right, right, wrong, wrong
    s = heldout.judge_scores(texts, reference)
    # right: yes, no (said Insufficient on a correct answer), yes, no (malformed)
    assert s["accuracy"] == 50.0
    assert s["balanced_accuracy"] == 50.0  # recall 1/2 on each class
    assert s["said_sufficient"] == 25.0 and s["malformed"] == 25.0 and s["reference_sufficient"] == 50.0


def test_judge_scores_always_majority_label_is_half_balanced():
    s = heldout.judge_scores(["Insufficient Information"] * 5, [True, False, False, False, False])
    assert s["accuracy"] == 80.0 and s["balanced_accuracy"] == 50.0


def test_answer_scores():
    s = heldout.answer_scores(["Paris", "the city of Rome", ""], [["Paris"], ["Rome"], ["Oslo"]])
    assert s["em"] == pytest.approx(33.33)
    assert s["acc"] == pytest.approx(66.67)
    # F1: 1, 2*(1/3*1)/(1/3+1) = 0.5 ("the" is dropped by normalisation: city, of, rome), 0
    assert s["f1"] == pytest.approx(50.0)
    assert s["words"] == pytest.approx(5 / 3, abs=0.01)
