import pytest
import yaml

from ragteam.config import ParamsError, load_params
from ragteam.profiles import apply_profile, load_profile, to_set_flags


def test_paper_profile_only_sets_existing_keys_and_applies(tmp_path):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    params = tmp_path / "params.yaml"
    params.write_text((repo / "params.yaml").read_text())
    changed = apply_profile("paper", params, repo / "profiles")
    merged = load_params(params)
    assert merged["models"]["llm"]["source"].startswith("hf:") and merged["data"]["source"] == "flashrag"
    assert merged["data"]["synthetic"] == load_params(repo / "params.yaml")["data"]["synthetic"]  # untouched
    assert "models.llm.source" in changed


def test_typo_in_profile_is_an_error(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "bad.yaml").write_text(yaml.safe_dump({"data": {"sourc": "x"}}))
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"data": {"source": "synthetic"}}))
    with pytest.raises(ParamsError, match=r"data\.sourc"):
        apply_profile("bad", params, tmp_path / "profiles")
    with pytest.raises(ParamsError, match="not found"):
        load_profile("nope", tmp_path / "profiles")


def test_set_flags_round_trip_values():
    flags = to_set_flags({"a": {"b": [1, 2], "c": "hf:x/y"}})
    assert flags == ["-S 'a.b=[1, 2]'", "-S 'a.c=\"hf:x/y\"'"]
    assert yaml.safe_load(flags[0].split("=", 1)[1].rstrip("'")) == [1, 2]


def _dvc_set(params, flags: list[str]) -> dict:
    """Apply `-S` flags the way `dvc exp run` does (Hydra override grammar) and return the new params."""
    from dvc.utils.hydra import apply_overrides

    overrides = [f.removeprefix("-S '").removesuffix("'") for f in flags]
    apply_overrides(str(params), overrides)
    return load_params(params)


def test_table3_profile_adds_fixed_round_systems_through_dvc_set_flags(tmp_path):
    from pathlib import Path

    from ragteam.config import parse_section
    from ragteam.eval.evaluate import EvalConfig
    from ragteam.profiles import profile_flags

    repo = Path(__file__).resolve().parents[1]
    params = tmp_path / "params.yaml"
    params.write_text((repo / "params.yaml").read_text())
    flags = profile_flags(["table3"], params, repo / "profiles")
    assert "-S '+eval.systems.maps_rounds_1.fixed_rounds=1'" in flags  # `+`: a new key in Hydra's grammar
    ev = parse_section(_dvc_set(params, flags), "eval", EvalConfig)
    fixed = {n: s.fixed_rounds for n, s in ev.systems.items() if n.startswith("maps_rounds_")}
    assert fixed == {f"maps_rounds_{k}": k for k in range(1, 6)}
    assert all(ev.systems[n].trained_agents and ev.systems[n].workflow == "maps" for n in fixed)
    assert "maps" in ev.systems and ev.systems["maps"].fixed_rounds is None  # the judge-decided row stays


def test_profiles_compose_in_order_and_existing_keys_get_plain_overrides(tmp_path):
    from pathlib import Path

    from ragteam.profiles import profile_flags

    repo = Path(__file__).resolve().parents[1]
    params = tmp_path / "params.yaml"
    params.write_text((repo / "params.yaml").read_text())
    flags = profile_flags(["paper", "table3"], params, repo / "profiles")
    assert "-S 'eval.retriever=\"data/indexes/dense\"'" in flags and len(flags) == len(set(flags))
    merged = _dvc_set(params, flags)
    assert merged["eval"]["retriever"] == "data/indexes/dense"
    assert merged["eval"]["systems"]["maps_rounds_5"]["fixed_rounds"] == 5
    assert merged["data"]["source"] == "flashrag"


def test_new_keys_only_inside_open_mappings(tmp_path):
    (tmp_path / "profiles").mkdir()
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"eval": {"systems": {"a": {"workflow": "native"}}, "n_questions": 8}}))
    (tmp_path / "profiles" / "ok.yaml").write_text(yaml.safe_dump({"eval": {"systems": {"b": {"workflow": "maps"}}}}))
    (tmp_path / "profiles" / "bad.yaml").write_text(yaml.safe_dump({"eval": {"n_question": 9}}))
    apply_profile("ok", params, tmp_path / "profiles")
    assert load_params(params)["eval"]["systems"] == {"a": {"workflow": "native"}, "b": {"workflow": "maps"}}
    with pytest.raises(ParamsError, match=r"eval\.n_question"):
        apply_profile("bad", params, tmp_path / "profiles")


def test_paper_profile_sets_the_maps_choices_and_every_section_validates(tmp_path):
    from pathlib import Path

    from ragteam.agents.maps_workflow import MapsConfig
    from ragteam.config import parse_section
    from ragteam.eval.evaluate import EvalConfig
    from ragteam.llm import LLMConfig
    from stages.prepare_data import DataParams
    from stages.synthesize import SynthesizeParams
    from stages.train_answer import TrainAnswerParams

    repo = Path(__file__).resolve().parents[1]
    params = tmp_path / "params.yaml"
    params.write_text((repo / "params.yaml").read_text())
    apply_profile("paper", params, repo / "profiles")
    apply_profile("extra_rows", params, repo / "profiles")     # the 8-question rows the default leaves out
    apply_profile("table3", params, repo / "profiles")
    merged = load_params(params)
    ev = parse_section(merged, "eval", EvalConfig)
    assert ev.retriever == "data/indexes/dense" and {"ircot", "sure", "maps_rounds_3"} <= set(ev.systems)
    assert ev.baselines.ircot.max_iterations == 5 and ev.baselines.sure.max_candidates is None
    # every row on every question: the default profile's per-system counts do not leak into the paper's table
    assert {ev.questions_for(n) for n in ev.systems} == {100000}
    default = parse_section(load_params(repo / "params.yaml"), "eval", EvalConfig)
    assert default.questions_for("standard_rag") == default.questions_for("maps") > default.n_questions
    assert not {"ircot", "sure", "mask_grammar"} & set(default.systems)      # 8-question rows: profiles/extra_rows
    sp = parse_section(merged, "synthesize", SynthesizeParams)
    assert (sp.max_q1, sp.max_t2, sp.judge_candidates) == (8148, 10000, ["t2"])
    # MAPS Sec. 3.2: the answer agent's questions are the medium and hard splits; the profile states it itself, so a
    # default changed for the CPU budget (it once kept hard only) cannot change the paper's pool
    assert sp.answer_pool == ["medium", "hard"]
    assert load_profile("paper", repo / "profiles")["synthesize"]["answer_pool"] == ["medium", "hard"]
    assert parse_section(merged, "train_answer", TrainAnswerParams).alpha == 0.5
    llm = parse_section(merged, "llm", LLMConfig)
    assert llm.sampling["opponent"].max_new_tokens >= 256 and llm.sampling["proponent"].max_new_tokens >= 256
    assert llm.sampling["jade_planner"].max_new_tokens == 1024 and llm.sampling["qagent"].max_new_tokens == 512
    parse_section(merged, "maps", MapsConfig)
    assert parse_section(merged, "data", DataParams).flashrag.split["bamboogle"] == "test"


def test_a_repeated_key_is_an_error_not_a_silently_dropped_section(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("llm:\n  sampling: {a: {max_new_tokens: 1}}\neval: {n_questions: 2}\nllm:\n  sampling: {b: {}}\n")
    with pytest.raises(ParamsError, match=r"(?s)duplicate key 'llm'.*line 4"):
        load_params(p)
    p.write_text("a: {x: 1, y: 2}\nb: {x: 1}\n")  # the same key in different mappings is fine
    assert load_params(p) == {"a": {"x": 1, "y": 2}, "b": {"x": 1}}


def test_a_profile_sets_a_rows_own_field_and_a_typo_in_a_row_is_still_an_error(tmp_path):
    """A row of eval.systems may get a field it leaves at its default (its own n_questions); `+` adds it under DVC's
    Hydra grammar, and DVC's own override writer turns the flags into the params a run evaluates with."""
    from pathlib import Path

    from dvc.utils.hydra import apply_overrides

    from ragteam.profiles import profile_flags

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "more.yaml").write_text(yaml.safe_dump(
        {"eval": {"systems": {"maps_untrained": {"fixed_rounds": 2}, "decor_trained": {"n_questions": 64}}}}))
    flags = profile_flags(["more"], repo / "params.yaml", tmp_path / "profiles")
    assert "-S '+eval.systems.maps_untrained.fixed_rounds=2'" in flags         # a new key: added
    assert "-S 'eval.systems.decor_trained.n_questions=64'" in flags and len(flags) == 2   # an existing one: set
    params = tmp_path / "params.yaml"
    params.write_text((repo / "params.yaml").read_text())
    apply_overrides(str(params), [f.split(" ", 1)[1].strip("'") for f in flags])
    rows = load_params(params)["eval"]["systems"]
    assert rows["maps_untrained"] == {"workflow": "maps", "n_questions": 40, "fixed_rounds": 2}
    assert rows["decor_trained"] == {"workflow": "decor", "model": "models/agents/decor", "n_questions": 64}
    assert rows["maps"]["n_questions"] == 40 and "fixed_rounds" not in rows["maps"]   # the other rows as they were
    (tmp_path / "profiles" / "bad.yaml").write_text(yaml.safe_dump({"eval": {"systems": {"mask": {"n_question": 4}}}}))
    with pytest.raises(ParamsError, match=r"eval\.systems\.mask\.n_question' does not exist"):
        profile_flags(["bad"], repo / "params.yaml", tmp_path / "profiles")


def test_a_null_row_takes_it_out_through_dvc_deletion_and_a_null_typo_is_an_error(tmp_path):
    from ragteam.profiles import profile_flags

    (tmp_path / "profiles").mkdir()
    params = tmp_path / "params.yaml"
    base = {"eval": {"systems": {"a": {"workflow": "native"}, "b": {"workflow": "maps"}}, "compare": None},
            "joint": {"systems": ["x", "y"]}}
    params.write_text(yaml.safe_dump(base))
    (tmp_path / "profiles" / "only_b.yaml").write_text(yaml.safe_dump(
        {"eval": {"systems": {"a": None}, "compare": None}, "joint": {"systems": ["y"]}}))
    flags = profile_flags(["only_b"], params, tmp_path / "profiles")
    assert "-S '~eval.systems.a'" in flags
    assert "-S 'eval.compare=null'" in flags          # a null outside a removable mapping is a value, not a removal
    via_dvc = _dvc_set(params, flags)
    assert via_dvc["eval"]["systems"] == {"b": {"workflow": "maps"}} and via_dvc["joint"]["systems"] == ["y"]
    params.write_text(yaml.safe_dump(base))
    changed = apply_profile("only_b", params, tmp_path / "profiles")
    assert load_params(params) == via_dvc              # `profile apply` and `dvc exp run -S` agree
    assert "eval.systems.a.workflow" in changed
    (tmp_path / "profiles" / "typo.yaml").write_text(yaml.safe_dump({"eval": {"systems": {"c": None}}}))
    with pytest.raises(ParamsError, match=r"eval\.systems\.c.*no such entry"):
        profile_flags(["typo"], params, tmp_path / "profiles")


RECIPES = {"mask_rl_recipe": ("mask", {"temperature": 0.7, "questions_per_step": 8, "steps": 8, "actor_lr": 2.0e-3,
                                        "kl_coef": 0.1}, (96, 0.0, 48, 48)),
           "mask_group_recipe": ("mask", {"temperature": 0.7, "questions_per_step": 2, "steps": 8, "actor_lr": 2.0e-3,
                                          "kl_coef": 0.1, "normalize_advantages": False}, (96, 0.0, 48, 48)),
           "jade_rl_recipe": ("jade", {"temperature": 0.7, "questions_per_step": 8, "steps": 8}, None),
           "jade_group_recipe": ("jade", {"temperature": 0.7, "questions_per_step": 2, "steps": 8, "actor_lr": 1.0e-3,
                                          "kl_coef": 0.1, "normalize_advantages": False}, None),
           # the default's RL size with the sampling temperature (and DECOR's step size) changed
           "decor_rl_recipe": ("decor", {"temperature": 0.7, "actor_lr": 1.0e-3}, None),
           "qagent_t07": ("qagent", {"temperature": 0.7}, None)}


@pytest.mark.parametrize("profile", sorted(RECIPES))
def test_rl_recipe_profiles_keep_only_their_systems_rows_and_set_the_recipe(tmp_path, profile):
    from pathlib import Path

    from ragteam.config import parse_section
    from ragteam.eval.evaluate import EvalConfig
    from ragteam.profiles import profile_flags
    from ragteam.warmup.sft import WarmupParams

    repo = Path(__file__).resolve().parents[1]
    params = tmp_path / "params.yaml"
    params.write_text((repo / "params.yaml").read_text())
    default = load_params(repo / "params.yaml")
    system, ppo, warmup = RECIPES[profile]
    merged = _dvc_set(params, profile_flags([profile], params, repo / "profiles"))
    rows = set(parse_section(merged, "eval", EvalConfig).systems)
    assert rows == {system, f"{system}_warmup", f"{system}_trained"}
    assert merged["joint"]["systems"] == [system]
    # the recipe's keys over the system's own overrides in the default (DECOR's and QAgent's: their RL size), no more
    assert merged["joint"][system]["ppo"] == {**(default["joint"][system].get("ppo") or {}), **ppo}
    if profile.endswith("_group_recipe"):                # the critic-free estimator over 4 rollouts a question
        from ragteam.systems.params import load_joint

        _, _, sp = load_joint(merged, system)
        assert (sp.estimator, sp.group_size) == ("group", 4)
        assert getattr(sp, "dynamic_sampling", None) is None or not sp.dynamic_sampling.enabled
    got = parse_section(merged, "warmup", WarmupParams).for_system(system)
    want = parse_section(default, "warmup", WarmupParams).for_system(system)
    if warmup is None:                                   # the default warm-up
        assert got == want
    else:
        assert (got.sft.steps, got.format_threshold, got.probe_from, got.probe_every) == warmup
    assert merged["warmup"]["sft"]["seed"] == default["warmup"]["sft"]["seed"]   # seeds: `replicate flags`
    for row in rows:                                     # the rows kept are the default's, unchanged
        assert merged["eval"]["systems"][row] == default["eval"]["systems"][row]


def test_the_rl_probe_profile_turns_the_probe_on_and_composes_with_a_recipe(tmp_path):
    from pathlib import Path

    from ragteam.profiles import profile_flags
    from ragteam.systems.params import load_joint

    repo = Path(__file__).resolve().parents[1]
    params = tmp_path / "params.yaml"
    params.write_text((repo / "params.yaml").read_text())
    default = load_params(repo / "params.yaml")
    assert load_joint(default, "jade")[1].probe.questions == 0                 # off in the default run
    merged = _dvc_set(params, profile_flags(["jade_rl_recipe", "rl_probe"], params, repo / "profiles"))
    ppo, jp, _ = load_joint(merged, "jade")
    assert (jp.probe.questions, jp.probe.every) == (12, 2)
    assert (ppo.steps, ppo.questions_per_step, ppo.temperature) == (8, 8, 0.7)   # the recipe, untouched
    assert merged["joint"]["systems"] == ["jade"]
