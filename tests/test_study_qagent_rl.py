"""studies/qagent_rl: params_edit.py writes params the stages accept (the RL seed and joint.qagent keys, dotted
for nested ones, nothing else of the joint section; an `evaluate` of the warm-up against each given policy), and
summarize.py pairs each row with the warm-up and gives each variant's mean ± sd and t-interval over seeds, checked
against a hand computation."""
import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from ragteam.config import parse_section
from ragteam.eval.evaluate import EvalConfig, comparison_pairs, rows_without_their_stage
from ragteam.systems.qagent.train import QAgentTrainParams

REPO = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"qagent_rl_{name}", REPO / "studies" / "qagent_rl" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pe, summ = _load("params_edit"), _load("summarize")


@pytest.fixture
def params(tmp_path, monkeypatch):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return lambda: yaml.safe_load((tmp_path / "params.yaml").read_text())


def test_train_sets_the_seed_threads_and_qagent_keys_only(params):
    before = params()
    pe.main(["train", "2", "1", "dynamic_sampling.enabled=true", "dynamic_sampling.max_rounds=3",
             "ppo.temperature=0.7"])
    d = params()
    assert d["joint"]["ppo"]["seed"] == 2 and d["llm"]["threads"] == 1
    tp = QAgentTrainParams(**d["joint"]["qagent"])                 # the trainer's own validation accepts it
    assert tp.dynamic_sampling.enabled and tp.dynamic_sampling.max_rounds == 3
    assert tp.ppo["temperature"] == 0.7 and tp.ppo["kl_coef"] == before["joint"]["qagent"]["ppo"]["kl_coef"]
    for other in ("mask", "jade", "decor"):
        assert d["joint"][other] == before["joint"][other]
    with pytest.raises(SystemExit, match="not train or evaluate"):
        pe.main(["nosuch"])


def test_evaluate_pairs_every_policy_with_the_warm_up_on_40_questions(params):
    pe.main(["evaluate", "qagent_ds3_seed0=models/qagent_rl/ds3_seed0", "qagent_ds3_seed1=models/qagent_rl/ds3_seed1"])
    d = params()
    ev = parse_section(d, "eval", EvalConfig)
    assert list(ev.systems) == ["qagent_warmup", "qagent_ds3_seed0", "qagent_ds3_seed1"]
    assert {n: ev.questions_for(n) for n in ev.systems} == dict.fromkeys(ev.systems, 40)
    assert ev.systems["qagent_ds3_seed1"].model == "models/qagent_rl/ds3_seed1"
    assert comparison_pairs(ev.systems, ev.compare) == [(f"qagent_ds3_seed{k}", "qagent_warmup") for k in range(2)]
    assert rows_without_their_stage(ev, d["joint"]) == {}


def _scores(em, f1):
    return {"avg": {"em": em, "f1": f1, "no_answer": 10.0, "format_error_questions": 50.0}}


def _diff(d):
    return {"diff": d, "lo": d - 5, "hi": d + 5, "n": 40, "significant": False}


def test_summary_over_seeds_by_hand(tmp_path):
    folders = []
    for tag, f1s in (("a", [1.0, 3.0, 5.0]), ("b", [-2.0, -2.0])):
        folder = tmp_path / tag
        folder.mkdir()
        scores = {"qagent_warmup": _scores(20.0, 20.0)}
        compare = {}
        for k, d in enumerate(f1s):
            name = f"qagent_{tag}_seed{k}"
            scores[name] = _scores(20.0 + d, 20.0 + d)
            compare[f"{name} vs qagent_warmup"] = {"a": name, "b": "qagent_warmup", "avg": {
                m: _diff(d if m in ("em", "f1") else 0.0) for m in summ.METRICS}}
        (folder / "eval.json").write_text(json.dumps(scores))
        (folder / "eval_compare.json").write_text(json.dumps(compare))
        folders.append(str(folder))
    summ.main([str(tmp_path / "out"), *folders])
    out = json.loads((tmp_path / "out.json").read_text())
    a = out["over_seeds"]["a"]["f1"]
    half = 4.302652729911275 * 2.0 / math.sqrt(3)          # t_{0.975, 2} · sd / √n, sd of 1, 3, 5 is 2
    assert (a["n"], a["mean"], a["sd"]) == (3, 3.0, 2.0)
    assert a["lo"] == pytest.approx(3.0 - half, abs=0.01) and a["hi"] == pytest.approx(3.0 + half, abs=0.01)
    assert out["over_seeds"]["b"]["f1"] == {"n": 2, "mean": -2.0, "sd": 0.0, "lo": -2.0, "hi": -2.0}
    assert out["rows"]["qagent_a_seed2"]["f1"] == 25.0 and out["warmup"]["a"]["f1"] == 20.0
    assert out["rows"]["qagent_b_seed0"]["folder"] == "b"
    assert "| a | 3 |" in (tmp_path / "out.md").read_text()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "eval.json").write_text(json.dumps({"qagent_warmup": _scores(1, 1), "odd": _scores(1, 1)}))
    (tmp_path / "c" / "eval_compare.json").write_text(json.dumps({"x": {"a": "odd", "b": "qagent_warmup", "avg": {
        m: _diff(0.0) for m in summ.METRICS}}}))
    with pytest.raises(SystemExit, match="'odd' is not qagent_<variant>_seed<k>"):
        summ.main([str(tmp_path / "out2"), str(tmp_path / "c")])
