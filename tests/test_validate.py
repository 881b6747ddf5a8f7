import json
import subprocess
import sys

import pytest

from ragteam.data.validate import Limits, validate_file
from ragteam.io import DataError

GOOD_C = {"id": "1", "contents": '"Title"\nSome passage text that is long enough.'}
GOOD_Q = {"id": "q1", "question": "Who?", "golden_answers": ["Ann"], "metadata": {}}


def _write(tmp_path, rows, name="f.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def _failed(rep):
    return {r.rule: r for r in rep.rules if not r.success}


@pytest.mark.parametrize("bad,rule", [
    ({"id": "1", "contents": '"T"\nanother passage text here'}, "id is unique"),
    ({"id": 7, "contents": '"T"\nanother passage text here'}, "id is a non-empty string"),
    ({"contents": '"T"\nanother passage text here'}, "id is present"),
    ({"id": "2"}, "contents is present"),
    ({"id": "2", "contents": "no title line at all, just text"}, "contents has a title line and non-empty text"),
    ({"id": "2", "contents": '"Only a title"\n   '}, "contents has a title line and non-empty text"),
    ({"id": "2", "contents": '"T"\n' + "x" * 500}, "contents length within [20, 300] chars"),
])
def test_corpus_rules_each_fail_on_their_fixture(tmp_path, bad, rule):
    p = _write(tmp_path, [GOOD_C, GOOD_C | {"id": "0"}, bad])
    rep = validate_file(p, "corpus", Limits((1, 10), (20, 300)))
    failed = _failed(rep)
    assert rule in failed, rep.summary()
    assert failed[rule].examples[-1]["line"] == 3  # line number of the bad row
    assert f"{p}:3" in rep.summary()


@pytest.mark.parametrize("bad,rule", [
    (GOOD_Q, "id is unique"),
    (GOOD_Q | {"id": "q2", "question": "   "}, "question is non-empty"),
    ({"id": "q2", "golden_answers": ["a"]}, "question is present"),
    (GOOD_Q | {"id": "q2", "golden_answers": []}, "golden_answers is a non-empty list of non-empty strings"),
    (GOOD_Q | {"id": "q2", "golden_answers": "Ann"}, "golden_answers is a non-empty list of non-empty strings"),
    (GOOD_Q | {"id": "q2", "golden_answers": [3]}, "golden_answers is a non-empty list of non-empty strings"),
    (GOOD_Q | {"id": "q2", "golden_answers": [""]}, "golden_answers is a non-empty list of non-empty strings"),
])
def test_benchmark_rules_each_fail_on_their_fixture(tmp_path, bad, rule):
    p = _write(tmp_path, [GOOD_Q, bad])
    rep = validate_file(p, "benchmark", Limits((1, 10)))
    assert rule in _failed(rep), rep.summary()
    assert _failed(rep)[rule].examples[-1]["line"] == 2


def test_row_count_bounds(tmp_path):
    p = _write(tmp_path, [GOOD_Q])
    rep = validate_file(p, "benchmark", Limits((2, 10)))
    assert _failed(rep)["row count within [2, 10]"].observed == 1
    assert validate_file(p, "benchmark", Limits((1, 10))).success


def test_malformed_json_named_by_file_and_line_before_gx(tmp_path):
    p = _write(tmp_path, [GOOD_C, '{"id": "2", "contents": "broken'])
    with pytest.raises(DataError, match=rf"{p}:2: malformed JSON"):
        validate_file(p, "corpus", Limits((1, 10)))


def test_cross_chunk_duplicates_and_counts(tmp_path):
    rows = [GOOD_C | {"id": str(i)} for i in range(5)] + [GOOD_C | {"id": "1"}]
    p = _write(tmp_path, rows)
    rep = validate_file(p, "corpus", Limits((1, 5), chunk_rows=2))  # 3 chunks: dup spans chunks
    failed = _failed(rep)
    assert [e["line"] for e in failed["id is unique"].examples] == [2, 6]
    assert failed["row count within [1, 5]"].observed == 6
    good = validate_file(_write(tmp_path, rows[:5], "g.jsonl"), "corpus", Limits((1, 5), chunk_rows=2))
    assert good.success and good.rows == 5


def test_real_mirror_files_pass(shared_data):
    assert validate_file(shared_data / "benchmarks/hotpotqa/dev.jsonl", "benchmark", Limits((1, 1000))).success


@pytest.mark.slow
def test_cli_exit_codes(tmp_path):
    ok = _write(tmp_path, [GOOD_Q], "ok.jsonl")
    bad = _write(tmp_path, [GOOD_Q, GOOD_Q], "bad.jsonl")
    run = lambda f: subprocess.run([sys.executable, "-m", "ragteam.cli", "data", "validate", "--kind", "benchmark",
                                    str(f), "--report", str(tmp_path / "r.json")], capture_output=True, text=True)
    assert run(ok).returncode == 0
    r = run(bad)
    assert r.returncode == 1 and "id is unique" in r.stderr and f"{bad}:2" in r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["success"] is False
