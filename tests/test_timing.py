"""ragteam.timing: a stage's time split into engine start-up, generation, training, retrieval and the rest, each
second counted once (a phase inside another counts for the inner one), worked out on a clock the test moves."""
from __future__ import annotations

import json
import sys

import pytest

from ragteam import timing


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(timing.time, "perf_counter", c)
    timing.start()
    return c


def test_nested_phases_count_their_time_once_and_the_parts_add_up_to_the_wall(clock):
    with timing.phase("training"):          # 10 s of training around 5 s of generation and 1 s of retrieval
        clock.t += 2
        with timing.phase("generation"):
            clock.t += 3
            with timing.phase("retrieval"):
                clock.t += 1
            clock.t += 2
        clock.t += 2
    clock.t += 4                            # outside any phase: data loading, writing outputs
    got = timing.split()
    assert got == {"wall_s": 14.0, "engine_start_s": 0.0, "generation_s": 5.0, "training_s": 4.0,
                   "retrieval_s": 1.0, "other_s": 4.0}


def test_a_decorated_function_and_an_open_phase_count_up_to_now(clock):
    @timing.timed("engine_start")
    def load():
        clock.t += 7
        return "engine"

    assert load() == "engine"
    with timing.phase("generation"):
        clock.t += 3
        mid = timing.split()                # read while the phase is still open
    assert mid["engine_start_s"] == 7.0 and mid["generation_s"] == 3.0 and mid["other_s"] == 0.0
    assert timing.split()["generation_s"] == 3.0   # closed: counted once, not again


def test_an_exception_closes_the_phase_and_an_unknown_phase_is_an_error(clock):
    with pytest.raises(RuntimeError):
        with timing.phase("retrieval"):
            clock.t += 2
            raise RuntimeError("search failed")
    clock.t += 1
    assert timing.split()["retrieval_s"] == 2.0 and timing.split()["other_s"] == 1.0
    with pytest.raises(ValueError, match="timing phase 'decoding': one of engine_start, generation"):
        with timing.phase("decoding"):
            pass


def test_a_stage_record_carries_its_time_split(tmp_path, monkeypatch):
    """index_bm25 as DVC runs it: its record holds `time_split`, the index build counted as retrieval."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "data/prepared").mkdir(parents=True)
    (tmp_path / "data/prepared/corpus.jsonl").write_text(
        (root / "tests/fixtures/retrieval/corpus.jsonl").read_text())
    (tmp_path / "params.yaml").write_text((root / "params.yaml").read_text())
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "stages.index_bm25", "bm25s"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    split = json.loads((tmp_path / "metrics/index_bm25_bm25s.json").read_text())["time_split"]
    assert set(split) >= {"wall_s", "engine_start_s", "generation_s", "training_s", "retrieval_s", "other_s"}
    assert split["retrieval_s"] > 0 and split["generation_s"] == 0 and split["training_s"] == 0
    assert abs(sum(v for k, v in split.items() if k != "wall_s") - split["wall_s"]) <= 0.3
