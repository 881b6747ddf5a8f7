"""studies/rl_signal/params_edit.py writes params the stages accept: the RL recipe of the trial for one system
(and nothing else of the joint section), and an `evaluate` of the warm-up against each seed's policy."""
import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

from ragteam.config import parse_section
from ragteam.eval.evaluate import EvalConfig, comparison_pairs, rows_without_their_stage
from ragteam.train.joint.params import PPOParams

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("params_edit", REPO / "studies" / "rl_signal" / "params_edit.py")
pe = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(pe)


@pytest.fixture
def params(tmp_path, monkeypatch):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return lambda: yaml.safe_load((tmp_path / "params.yaml").read_text())


def test_train_sets_the_recipe_the_seed_and_the_threads_for_one_system_only(params):
    before = params()
    pe.main(["train", "mask", "2", "1", "actor_lr=1e-3", "kl_coef=0.01"])
    d = params()
    assert d["joint"]["ppo"]["seed"] == 2 and d["llm"]["threads"] == 1
    assert d["joint"]["mask"]["ppo"] == {"temperature": 0.7, "questions_per_step": 8, "steps": 8,
                                         "actor_lr": 1e-3, "kl_coef": 0.01}
    for other in ("jade", "decor", "qagent"):
        assert d["joint"][other] == before["joint"][other]
    merged = {**d["joint"]["ppo"], **d["joint"]["mask"]["ppo"]}
    p = PPOParams.model_validate(merged)                   # the trainer's own validation accepts it
    assert (p.temperature, p.questions_per_step, p.steps, p.actor_lr, p.kl_coef) == (0.7, 8, 8, 1e-3, 0.01)


def test_a_system_s_own_overrides_survive_and_the_recipe_wins_where_they_meet(params):
    pe.main(["train", "decor", "0", "2"])
    ppo = params()["joint"]["decor"]["ppo"]
    assert ppo["ratio_level"] == "sequence" and ppo["clip_eps_high"] == 0.28   # DECOR's estimator kept
    assert (ppo["questions_per_step"], ppo["steps"], ppo["temperature"]) == (8, 8, 0.7)


def test_evaluate_pairs_every_seed_with_the_warm_up_on_40_questions(params):
    pe.main(["evaluate", "mask", "0", "1", "2"])
    d = params()
    ev = parse_section(d, "eval", EvalConfig)
    assert list(ev.systems) == ["mask_warmup", "mask_rl_seed0", "mask_rl_seed1", "mask_rl_seed2"]
    assert {n: ev.questions_for(n) for n in ev.systems} == dict.fromkeys(ev.systems, 40)
    assert ev.systems["mask_rl_seed1"].model == "models/rl_signal/mask_seed1"
    assert comparison_pairs(ev.systems, ev.compare) == [(f"mask_rl_seed{k}", "mask_warmup") for k in range(3)]
    assert rows_without_their_stage(ev, d["joint"]) == {}   # no row is dropped by evaluate


def test_a_system_not_trained_by_the_pipeline_or_an_unknown_phase_stops_with_its_name(params):
    with pytest.raises(SystemExit, match="'nosuch' is not in joint.systems"):
        pe.main(["train", "nosuch", "0", "1"])
    with pytest.raises(SystemExit, match="phase 'fit' is not one of train, evaluate"):
        pe.main(["fit", "mask"])


def test_device_puts_every_stage_on_hf_and_every_row_on_n_questions(params):
    pe.main(["evaluate", "mask", "0", "1"])
    pe.main(["device", "100", "128"])
    d = params()
    assert set(d["llm"]["stages"].values()) == {"hf"} and d["llm"]["batch_size"] == 128
    ev = parse_section(d, "eval", EvalConfig)
    assert {n: ev.questions_for(n) for n in ev.systems} == dict.fromkeys(ev.systems, 100)


def test_only_keeps_one_row_and_no_pair_and_names_an_unknown_row(params):
    pe.main(["evaluate", "mask", "0", "1"])
    pe.main(["only", "mask_rl_seed1"])
    ev = parse_section(params(), "eval", EvalConfig)
    assert list(ev.systems) == ["mask_rl_seed1"] and comparison_pairs(ev.systems, ev.compare) == []
    with pytest.raises(SystemExit, match="'mask_rl_seed7' is not an eval row"):
        pe.main(["only", "mask_rl_seed7"])


def test_dry_shrinks_the_warm_up_and_the_rl_to_a_rehearsal(params):
    pe.main(["train", "mask", "0", "2"])
    pe.main(["dry", "mask"])
    d = params()
    assert d["warmup"]["sft"]["steps"] == 2 and d["warmup"]["probe_from"] == 2 == d["warmup"]["probe_every"]
    p = PPOParams.model_validate({**d["joint"]["ppo"], **d["joint"]["mask"]["ppo"]})
    assert (p.steps, p.questions_per_step, p.temperature) == (1, 2, 0.7)


def test_warmup_trains_one_system_to_its_cap_and_keeps_its_other_overrides(params):
    from ragteam.warmup.sft import WarmupParams

    pe.main(["warmup", "decor", "96", "16"])
    d = params()
    decor = WarmupParams.model_validate(d["warmup"]).for_system("decor")
    assert (decor.sft.steps, decor.probe_every, decor.format_threshold) == (96, 16, 0.0)
    assert decor.stop_when == "every_role"                     # decor's own override survives
    assert not decor.below_threshold({"format_error_rate": 0.0, "format_error/decor_planner": 0.0})
    other = WarmupParams.model_validate(d["warmup"]).for_system("mask")
    assert (other.sft.steps, other.format_threshold) == (32, 0.2)   # no other system changes
