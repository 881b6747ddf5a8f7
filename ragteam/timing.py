"""Where a stage's time goes: engine start-up, generation, training, retrieval, and the rest (I/O, set-up).

The code that does each kind of work marks it (`with phase("generation"): ...`): the engines' constructors and
`generate`, the trainers' loops, `retrieve_step` and the index builds. Time is exclusive: a phase inside another
(a rollout's generation inside a training step, a search inside a rollout) counts for the inner one only, so the
parts add up to the wall time. `split()` is what a stage's record carries (`time_split` in `metrics/<stage>.json`,
written by `ragteam.io.write_metrics`), next to nothing it could change: timings live in run records, never in
models or data. Threads keep their own nesting; a phase run in a second thread while the first is in another
phase is counted too, so on a run that overlaps work the parts can exceed the wall time (the record says so).
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("engine_start", "generation", "training", "retrieval")

_lock = threading.Lock()
_totals: defaultdict[str, float] = defaultdict(float)
_local = threading.local()
_started = time.perf_counter()


def start() -> None:
    """Count from now, with every total at zero (a stage's process calls it once, as it starts)."""
    global _started
    with _lock:
        _totals.clear()
        _started = time.perf_counter()


def _stack() -> list[list]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def _add(name: str, seconds: float) -> None:
    with _lock:
        _totals[name] += seconds


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the block's time, less that of the phases inside it, as `name` (one of PHASES)."""
    if name not in PHASES:
        raise ValueError(f"timing phase {name!r}: one of {', '.join(PHASES)}")
    stack, now = _stack(), time.perf_counter()
    if stack:                       # the outer phase pauses
        _add(stack[-1][0], now - stack[-1][1])
    stack.append([name, now])
    try:
        yield
    finally:
        now = time.perf_counter()
        done = stack.pop()
        _add(done[0], now - done[1])
        if stack:                   # ... and resumes
            stack[-1][1] = now


def split() -> dict[str, float]:
    """Seconds since `start()`: `wall_s`, one `<phase>_s` per phase, and `other_s` (the wall time no phase
    claimed: loading data, writing outputs, tokenising, imports), each rounded to 0.1 s."""
    now = time.perf_counter()
    with _lock:
        totals = dict(_totals)
    stack = _stack()
    if stack:                       # the phase open in this thread counts up to now (the ones below it are paused)
        totals[stack[-1][0]] = totals.get(stack[-1][0], 0.0) + now - stack[-1][1]
    wall = now - _started
    out = {"wall_s": round(wall, 1), **{f"{p}_s": round(totals.get(p, 0.0), 1) for p in PHASES}}
    claimed = sum(totals.get(p, 0.0) for p in PHASES)
    out["other_s"] = round(max(wall - claimed, 0.0), 1)
    if claimed > wall + 0.05:
        out["overlapped_s"] = round(claimed - wall, 1)
    return out


def timed(name: str):
    """`phase(name)` around every call of the decorated function."""
    import functools

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with phase(name):
                return fn(*args, **kwargs)
        return inner
    return wrap
