"""benchmarks/concurrent_stages.py: each unit of work runs on a 2-layer model with the threads it is given, and the
comparison gives the sequential process twice the units, each concurrent process half the threads, and the ratio
sequential seconds over the slower concurrent process's (the timed run on the real backbone, with its processes,
is benchmarks/results/concurrent_stages.md)."""
import json

import pytest

from benchmarks import concurrent_stages as cs


@pytest.mark.parametrize("workload", cs.WORKLOADS)
def test_a_unit_of_work_runs_with_the_threads_it_is_given(tiny_llama, workload):
    import torch

    before = torch.get_num_threads()
    try:
        got = cs.work(str(tiny_llama), workload, units=1, threads=1)
    finally:
        torch.set_num_threads(before)
    assert (got["workload"], got["units"], got["threads"]) == (workload, 1, 1) and got["seconds"] > 0


def test_the_comparison_splits_units_and_threads_and_divides_by_the_slower_process(tmp_path, monkeypatch):
    started = []

    class Proc:
        def __init__(self, workload, units, threads):
            self.args = (workload, units, threads)
            self.returncode = 0

        def communicate(self):
            w, units, threads = self.args
            secs = {2: 10.0, 1: 6.0 + len(started) % 2}[threads]      # the two concurrent ones: 6 s and 7 s
            return json.dumps({"workload": w, "units": units, "threads": threads, "seconds": secs}), None

    def child(model, workload, units, threads):
        started.append((workload, units, threads))
        return Proc(workload, units, threads)

    monkeypatch.setattr(cs, "_child", child)
    (tmp_path / "config.json").write_text("{}")
    out = tmp_path / "bench"
    cs.main(["--model", str(tmp_path), "--units", "3", "--workload", "train", "--out", str(out)])
    assert started == [("train", 6, 2), ("train", 3, 1), ("train", 3, 1)]
    [row] = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert row["sequential_seconds"] == 10.0 and row["concurrent_seconds"] == 7.0
    assert row["ratio"] == pytest.approx(10 / 7, abs=1e-3)
    assert "| train | 6 | 10.0 | 7.0 | **1.429×** |" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit, match="no config.json"):
        cs.main(["--model", str(tmp_path / "none"), "--out", str(out)])
