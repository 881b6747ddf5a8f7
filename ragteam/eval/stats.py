"""Uncertainty for evaluation numbers: percentile bootstrap intervals over questions, paired bootstrap differences
between two systems on the same questions, and mean ± sd with a t-interval over training seeds.

Every bootstrap here is one matrix of resampled question indices: row r lists the questions drawn in resample r
(`resample_indices`). A statistic maps that matrix to one value per row, so a mean is one gather and one row mean,
and 10,000 resamples of a few hundred questions take milliseconds. Questions may come in groups (benchmarks): each
group is resampled within itself (a stratified bootstrap), and the statistic is the unweighted mean over groups, the
way the report's "avg" column averages benchmarks. A paired difference resamples the question indices jointly, so both
systems see the same resampled questions.

Scores per question are in [0, 1] (EM, F1, accuracy) or [-1, 1] (a difference, ΔF1); results are in percent.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from ragteam.config import Strict

BLOCK = 4_000_000  # resampled indices built at once: bounds memory for many resamples of many questions

Statistic = Callable[[np.ndarray], np.ndarray]  # indices (B, N) -> value per resample (B,)


class BootstrapConfig(Strict):
    """Params of a percentile bootstrap over questions (eval.bootstrap, eval_agents.bootstrap)."""

    resamples: int = Field(10_000, ge=100)
    seed: int = 0
    level: float = Field(0.95, gt=0, lt=1)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its 95 % (or `level`) interval, in percent."""

    estimate: float
    lo: float
    hi: float
    n: int

    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def to_dict(self) -> dict:
        return {"estimate": self.estimate, "lo": self.lo, "hi": self.hi, "n": self.n}


@dataclass(frozen=True)
class Difference:
    """a - b on the same questions: mean difference, its paired-bootstrap interval, and whether 0 lies outside."""

    diff: float
    lo: float
    hi: float
    n: int
    significant: bool

    def to_dict(self) -> dict:
        return {"diff": self.diff, "lo": self.lo, "hi": self.hi, "n": self.n, "significant": self.significant}


def _sizes(n: int | Sequence[int]) -> list[int]:
    sizes = [n] if isinstance(n, (int, np.integer)) else list(n)
    if not sizes or any(int(s) < 1 for s in sizes):
        raise ValueError(f"bootstrap needs at least one question in every group (sizes {sizes})")
    return [int(s) for s in sizes]


def resample_indices(sizes: Sequence[int], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples, sum(sizes)) question indices: the columns of each group hold draws, with replacement, from that
    group's own index range, as many as the group has questions."""
    return np.hstack([start + rng.integers(0, n, size=(resamples, n), dtype=np.int32)
                      for start, n in zip(np.cumsum([0, *sizes]), sizes)])


def bootstrap_draws(statistic: Statistic, sizes: int | Sequence[int], resamples: int = 10_000,
                    seed: int = 0) -> np.ndarray:
    """`statistic` on `resamples` bootstrap resamples (deterministic in `seed`), built in memory-bounded blocks."""
    sizes = _sizes(sizes)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1 (got {resamples})")
    rng = np.random.default_rng(seed)
    block = max(1, BLOCK // sum(sizes))
    out = [statistic(resample_indices(sizes, min(block, resamples - start), rng))
           for start in range(0, resamples, block)]
    return np.concatenate(out)


def _bounds(sizes: Sequence[int]) -> list[slice]:
    ends = np.cumsum([0, *sizes])
    return [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]


def group_means(idx: np.ndarray, x: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """(B, G): the mean of x within each group under each resample."""
    return np.stack([np.take(x, idx[:, s]).mean(axis=1) for s in _bounds(sizes)], axis=1)


def mean_statistic(x: Sequence[float] | np.ndarray, sizes: Sequence[int] | None = None) -> Statistic:
    """The unweighted mean over groups of the per-group mean of x (one group: the plain mean)."""
    x = np.asarray(x, dtype=np.float64)
    sizes = _sizes(len(x) if sizes is None else sizes)
    if sum(sizes) != len(x):
        raise ValueError(f"group sizes {sizes} do not add up to {len(x)} scores")
    if len(sizes) == 1:
        return lambda idx: np.take(x, idx).mean(axis=1)
    return lambda idx: group_means(idx, x, sizes).mean(axis=1)


def balanced_accuracy_statistic(right: Sequence[float], positive: Sequence[bool],
                                sizes: Sequence[int] | None = None) -> Statistic:
    """Mean over groups of (recall on positives + recall on negatives) / 2; a class absent from a resampled group
    counts with the other class's recall alone (as a balanced accuracy over the classes present)."""
    right = np.asarray(right, dtype=np.float64)
    pos = np.asarray(positive, dtype=np.float64)
    sizes = _sizes(len(right) if sizes is None else sizes)

    def stat(idx: np.ndarray) -> np.ndarray:
        per_group = []
        for s in _bounds(sizes):
            r, p = right[idx[:, s]], pos[idx[:, s]]
            n_pos = p.sum(axis=1)
            n_neg = p.shape[1] - n_pos
            r_pos = np.divide((r * p).sum(axis=1), n_pos, out=np.zeros_like(n_pos), where=n_pos > 0)
            r_neg = np.divide((r * (1 - p)).sum(axis=1), n_neg, out=np.zeros_like(n_neg), where=n_neg > 0)
            per_group.append((r_pos + r_neg) / np.maximum((n_pos > 0).astype(float) + (n_neg > 0), 1))
        return np.stack(per_group, axis=1).mean(axis=1)

    return stat


def percentile_interval(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1) (got {level})")
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _pct(x: float, digits: int = 2) -> float:
    return round(100 * float(x), digits) + 0.0  # + 0.0: no "-0.0" in reports


def statistic_interval(statistic: Statistic, sizes: int | Sequence[int], resamples: int = 10_000, seed: int = 0,
                       level: float = 0.95) -> Interval:
    """Point estimate (the statistic on the data as drawn) and its percentile bootstrap interval, in percent."""
    sizes = _sizes(sizes)
    estimate = statistic(np.arange(sum(sizes))[None, :])[0]  # every question once: the data as drawn
    lo, hi = percentile_interval(bootstrap_draws(statistic, sizes, resamples, seed), level)
    return Interval(_pct(estimate), _pct(lo), _pct(hi), sum(sizes))


def mean_ci(scores: Sequence[float], sizes: Sequence[int] | None = None, resamples: int = 10_000, seed: int = 0,
            level: float = 0.95) -> Interval:
    """Percentile bootstrap interval of the mean score (or of the unweighted mean of group means), in percent."""
    stat = mean_statistic(scores, sizes)
    return statistic_interval(stat, len(scores) if sizes is None else sizes, resamples, seed, level)


def difference(stat_a: Statistic, stat_b: Statistic, sizes: int | Sequence[int], resamples: int = 10_000,
               seed: int = 0, level: float = 0.95) -> Difference:
    """Paired bootstrap of stat_a - stat_b: both statistics see the same resampled questions."""
    iv = statistic_interval(lambda c: stat_a(c) - stat_b(c), sizes, resamples, seed, level)
    return Difference(iv.estimate, iv.lo, iv.hi, iv.n, iv.excludes_zero())


def paired_diff(a: Sequence[float], b: Sequence[float], sizes: Sequence[int] | None = None,
                resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> Difference:
    """Mean of a - b over the same questions (a[i], b[i] score question i), with its paired-bootstrap interval."""
    if len(a) != len(b):
        raise ValueError(f"paired scores need the same questions: {len(a)} vs {len(b)} scores")
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)  # a mean of differences: one gather
    iv = statistic_interval(mean_statistic(d, sizes), len(d) if sizes is None else sizes, resamples, seed, level)
    return Difference(iv.estimate, iv.lo, iv.hi, iv.n, iv.excludes_zero())


@dataclass(frozen=True)
class SeedSummary:
    """Mean ± sd of one quantity over training seeds, with a t-based interval of the mean (None below 2 seeds)."""

    n: int
    mean: float
    sd: float | None
    lo: float | None
    hi: float | None

    def to_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean, "sd": self.sd, "lo": self.lo, "hi": self.hi}


def seed_summary(values: Sequence[float], level: float = 0.95, digits: int = 2) -> SeedSummary:
    """mean, sample sd (ddof 1) and mean ± t_{(1+level)/2, n-1} · sd / √n over seeds (values already in percent)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("seed_summary needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return SeedSummary(1, round(mean, digits), None, None, None)
    from scipy.stats import t

    sd = float(x.std(ddof=1))
    half = float(t.ppf((1 + level) / 2, x.size - 1)) * sd / math.sqrt(x.size)
    r = lambda v: round(v, digits) + 0.0  # noqa: E731
    return SeedSummary(int(x.size), r(mean), r(sd), r(mean - half), r(mean + half))
