"""Bootstrap intervals, paired differences and seed summaries against hand-checkable cases."""
import time

import numpy as np
import pytest

from ragteam.eval import stats


def test_constant_scores_give_a_zero_width_interval():
    iv = stats.mean_ci([1.0] * 8)
    assert (iv.estimate, iv.lo, iv.hi, iv.n) == (100.0, 100.0, 100.0, 8)
    iv = stats.mean_ci([0.5] * 5, resamples=100)
    assert (iv.estimate, iv.lo, iv.hi) == (50.0, 50.0, 50.0)


def test_interval_of_a_mean_covers_the_estimate_and_has_the_binomial_width():
    scores = [1.0] * 50 + [0.0] * 50  # p = 0.5, n = 100: normal approx 50 ± 1.96 · 5 = [40.2, 59.8]
    iv = stats.mean_ci(scores, resamples=20_000, seed=1)
    assert iv.estimate == 50.0 and iv.lo < 50 < iv.hi
    assert iv.lo == pytest.approx(40.2, abs=1.5) and iv.hi == pytest.approx(59.8, abs=1.5)
    # resampled means can only be multiples of 1/n: the bounds are too
    assert (100 * iv.lo) % 100 == 0 and (100 * iv.hi) % 100 == 0


def test_one_right_answer_in_eight_cannot_be_told_from_zero():
    iv = stats.mean_ci([1.0] + [0.0] * 7)
    # P(resample has no correct answer) = (7/8)^8 = 0.34 > 2.5 %: the lower bound is 0
    assert iv.estimate == 12.5 and iv.lo == 0.0 and iv.hi >= 37.5


def test_known_difference_and_its_sign():
    a = [1.0] * 40 + [0.0] * 60
    b = [0.0] * 100                      # a beats b on exactly 40 questions and ties elsewhere
    d = stats.paired_diff(a, b, resamples=5000, seed=3)
    assert d.diff == 40.0 and d.n == 100 and d.significant and d.lo > 25 and d.hi < 55
    r = stats.paired_diff(b, a, resamples=5000, seed=3)
    assert r.diff == -40.0 and r.significant and (r.lo, r.hi) == (-d.hi, -d.lo)   # same resamples, mirrored


def test_pairing_removes_the_shared_question_difficulty():
    rng = np.random.default_rng(0)
    hard = rng.random(200)                               # per-question difficulty shared by both systems
    a, b = np.clip(hard + 0.05, 0, 1), hard               # a is better by 5 points on (almost) every question
    d = stats.paired_diff(a, b)
    ia, ib = stats.mean_ci(a), stats.mean_ci(b)
    assert d.significant and d.lo > 3                     # paired: clearly positive
    assert ia.lo < ib.hi                                  # unpaired intervals overlap


def test_identical_systems_have_a_difference_interval_containing_zero():
    rng = np.random.default_rng(1)
    a = rng.random(30).round(2).tolist()
    d = stats.paired_diff(a, a)
    assert (d.diff, d.lo, d.hi, d.significant) == (0.0, 0.0, 0.0, False)
    noisy = stats.paired_diff([1, 0, 1, 0, 0, 0, 0, 0], [0, 1, 0, 1, 0, 1, 0, 0])  # 2 vs 3 right of 8
    assert noisy.diff == -12.5 and noisy.lo < 0 < noisy.hi and not noisy.significant


def test_determinism_under_seed():
    a = np.linspace(0, 1, 37)
    b = a[::-1]
    assert stats.paired_diff(a, b, seed=7) == stats.paired_diff(a, b, seed=7)
    assert stats.mean_ci(a, seed=7) == stats.mean_ci(a, seed=7)
    draws = [stats.bootstrap_draws(stats.mean_statistic(a), 37, 500, seed=s) for s in (7, 7, 8)]
    assert np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[0], draws[2])


def test_blocks_and_groups_of_resampled_indices(monkeypatch):
    monkeypatch.setattr(stats, "BLOCK", 10 * 7)            # 10 resamples of 7 questions per block
    d = stats.bootstrap_draws(lambda idx: idx.shape[1] + 0 * idx[:, 0], [3, 4], resamples=25, seed=0)
    assert d.shape == (25,) and set(d) == {7}              # every resample draws 3 + 4 questions
    idx = stats.resample_indices([3, 4], 1000, np.random.default_rng(0))
    assert idx.shape == (1000, 7)
    assert set(idx[:, :3].ravel()) == {0, 1, 2} and set(idx[:, 3:].ravel()) == {3, 4, 5, 6}   # within each group


def test_groups_are_resampled_within_themselves_and_averaged_unweighted():
    # benchmark A: 2 questions, both right; benchmark B: 6 questions, all wrong -> avg (100 + 0) / 2 = 50,
    # and no resample can move either benchmark's mean: a zero-width interval at 50 (pooled resampling would not)
    x = [1.0, 1.0] + [0.0] * 6
    iv = stats.mean_ci(x, sizes=[2, 6])
    assert (iv.estimate, iv.lo, iv.hi, iv.n) == (50.0, 50.0, 50.0, 8)
    pooled = stats.mean_ci(x)
    assert pooled.estimate == 25.0 and pooled.hi > pooled.lo
    with pytest.raises(ValueError, match="do not add up"):
        stats.mean_ci(x, sizes=[2, 5])


def test_balanced_accuracy_statistic():
    right = [1, 0, 1, 0]
    positive = [True, True, False, False]     # recall 1/2 on each class -> 50
    iv = stats.statistic_interval(stats.balanced_accuracy_statistic(right, positive), 4, resamples=200)
    assert iv.estimate == 50.0
    always_no = stats.balanced_accuracy_statistic([0, 1, 1, 1, 1], [True, False, False, False, False])
    assert always_no(np.arange(5)[None, :])[0] == 0.5
    only_neg = stats.balanced_accuracy_statistic([1, 0], [False, False])     # one class present: its recall
    assert only_neg(np.arange(2)[None, :])[0] == 0.5
    d = stats.difference(stats.balanced_accuracy_statistic([1, 1, 1, 1], positive),
                         stats.balanced_accuracy_statistic(right, positive), 4, resamples=500)
    assert d.diff == 50.0


def test_ten_thousand_resamples_take_milliseconds():
    rng = np.random.default_rng(0)
    a, b = rng.random(400), rng.random(400)
    stats.paired_diff(a, b, resamples=100)                 # warm-up
    t = time.perf_counter()
    stats.paired_diff(a, b, sizes=[100] * 4, resamples=10_000)
    # 4 M resampled scores: 0.2 s measured on a 2-core machine at load 8; a per-resample Python loop takes seconds
    assert time.perf_counter() - t < 2.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="same questions: 3 vs 2"):
        stats.paired_diff([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="at least one question"):
        stats.mean_ci([])
    with pytest.raises(ValueError, match="resamples must be"):
        stats.mean_ci([1.0], resamples=0)
    with pytest.raises(ValueError, match="level"):
        stats.mean_ci([1.0], level=95)


def test_seed_summary_mean_sd_and_t_interval():
    s = stats.seed_summary([1.0, 2.0, 3.0])
    # sd = 1, t_{0.975, 2} = 4.3027: 2 ± 4.3027 / √3 = 2 ± 2.484
    assert (s.n, s.mean, s.sd, s.lo, s.hi) == (3, 2.0, 1.0, -0.48, 4.48)
    same = stats.seed_summary([5.0, 5.0, 5.0, 5.0])
    assert (same.sd, same.lo, same.hi) == (0.0, 5.0, 5.0)
    one = stats.seed_summary([4.0])
    assert (one.n, one.mean, one.sd, one.lo, one.hi) == (1, 4.0, None, None, None)
    with pytest.raises(ValueError):
        stats.seed_summary([])
