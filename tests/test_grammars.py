"""Guided decoding as an engine option (issue 24 §3), what runs without vLLM: the sampling option and its checks, the
`<system>_grammar` rows (each role of the workflow gets its format's regex, the pair X_grammar - X is reported), and
the refusals (the hf engine, a trainer's rollouts, a workflow without grammars, evaluate on hf). vLLM running the
regexes for real is tests/worker/test_vllm_engine.py; the regexes against every oracle output, tests/test_oracle.py;
the Ray engine set's core split is here too (it runs for real in tests/worker/test_ray_engines.py)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ragteam.agents.core import FormatError
from ragteam.config import ParamsError, load_params, parse_section
from ragteam.eval.evaluate import EvalConfig, SystemSpec, comparison_pairs, make_team
from ragteam.llm import EngineConfig, LLMConfig, SamplingConfig
from ragteam.systems.registry import grammar_sampling, grammars
from ragteam.systems.decor import roles as D
from ragteam.systems.jade import roles as J
from ragteam.systems.mask import roles as M

REPO = Path(__file__).resolve().parents[1]


def test_a_regex_must_compile_and_is_carried_by_the_roles_sampling():
    with pytest.raises(ValueError, match="regex '<a>\\(' does not compile"):
        SamplingConfig(regex="<a>(")
    s = grammar_sampling("jade", {"default": SamplingConfig(max_new_tokens=9),
                                  J.PLANNER: SamplingConfig(max_new_tokens=16, temperature=0.5)})
    assert s[J.PLANNER].regex == grammars()["jade"][J.PLANNER]
    assert (s[J.PLANNER].max_new_tokens, s[J.PLANNER].temperature) == (16, 0.5)   # the role's own settings kept
    assert s[J.QR].max_new_tokens == 9 and s[J.QR].regex == grammars()["jade"][J.QR]
    assert s["default"].regex is None                                              # other roles untouched
    with pytest.raises(ValueError, match="no output grammars for workflow 'maps'"):
        grammar_sampling("maps", {})


@pytest.mark.parametrize("text, parse, ok", [
    ("<workflow>QR, R, DS, AG</workflow>", J.parse_plan, True),
    ("<workflow>QDS</workflow>", J.parse_plan, True),
    ("<workflow>DS, R, AG</workflow>", J.parse_plan, False),          # out of order: outside the grammar too
    ("<Add>t(n+1)</Add>", lambda t: M.parse_update(t, 3), True),     # the grammar's Add is valid in every state
    ("<Add>t4</Add>", lambda t: M.parse_update(t, 3), False),        # a numbered Add is not in the grammar
    ("<think>\nThe plan.\n</think>\n<search>\n[your precise search query]\n</search>", D.parse_planner, False),
    ("<think>\nThe plan.\n</think>\n<search>\nWho directed Lost Borben?\n</search>", D.parse_planner, True),
    ("<evidence> </evidence>", M.parse_summary, False),              # a blank tag: no
])
def test_what_a_grammar_admits_its_parser_accepts_and_the_degenerate_outputs_are_outside_it(text, parse, ok):
    """The grammars rule out what a small model writes wrong in any state: plans out of order, the prompt's
    placeholder, a tag with nothing in it; what they admit parses."""
    role_regexes = [g for grammars in grammars().values() for g in grammars.values()]
    assert any(re.fullmatch(g, text) for g in role_regexes) == ok
    if ok:
        assert not isinstance(parse(text), FormatError)


def test_grammar_rows_constrain_every_role_of_their_workflow_and_are_paired_with_the_plain_row():
    calls = []

    class Pool:
        def team(self, role_models, default_model, sampling):
            calls.append((dict(role_models), dict(sampling)))

    plain, guided = SystemSpec(workflow="mask"), SystemSpec(workflow="mask", grammar=True)
    sampling = {"default": SamplingConfig(max_new_tokens=32), M.SEARCH: SamplingConfig(max_new_tokens=32)}
    make_team(Pool(), plain, {}, "models/llm", sampling)
    make_team(Pool(), guided, {}, "models/llm", sampling)
    assert all(s.regex is None for s in calls[0][1].values())
    assert {r: calls[1][1][r].regex for r in M.ROLES} == grammars()["mask"]
    assert calls[1][0] == {}                                    # the base model: every role unconstrained otherwise
    systems = {"mask": plain, "mask_grammar": guided, "mask_warmup": SystemSpec(workflow="mask", model="w")}
    assert ("mask_grammar", "mask") in comparison_pairs(systems)
    with pytest.raises(ValueError, match="grammar: true needs output grammars for workflow 'maps'"):
        SystemSpec(workflow="maps", grammar=True)


def test_the_extra_rows_profile_has_a_grammar_row_per_joint_system_beside_the_defaults_base_row():
    from ragteam.profiles import merged_params

    ev = parse_section(merged_params(["extra_rows"], REPO / "params.yaml", REPO / "profiles"), "eval", EvalConfig)
    for system in grammars():
        spec = ev.systems[f"{system}_grammar"]
        assert spec.grammar and spec.workflow == system and spec.model is None and not spec.trained_agents
        # the pair <system>_grammar vs <system> is scored on the questions both answered (the base row's first n):
        # the grammar row answers a prefix of the base row's questions (8 of the base row's 40)
        assert 0 < ev.questions_for(f"{system}_grammar") <= ev.questions_for(system)


def test_evaluate_refuses_grammar_rows_on_the_hf_engine_before_any_work(tmp_path):
    sys.path.insert(0, str(REPO))
    import stages.evaluate as stage

    ev = EvalConfig(systems={"mask_grammar": SystemSpec(workflow="mask", grammar=True)}, n_questions=1)
    with pytest.raises(ParamsError, match=r"\['mask_grammar'\]: grammar rows decode with vLLM's guided decoding, "
                                          "but evaluate runs on the hf engine"):
        stage.run(LLMConfig(backend="hf"), stage.WorkflowConfigs(), ev, benchmarks=tmp_path / "nothing",
                  results=tmp_path / "r", report=tmp_path / "eval.md")
    assert not (tmp_path / "r").exists() and not (tmp_path / "eval.md").exists()


def test_the_hf_engine_and_a_trainers_rollouts_refuse_a_regex(smollm2_dir):
    from ragteam.llm.hf import HFEngine, HFPolicy
    from ragteam.llm.policy import Rollouts

    guided = SamplingConfig(max_new_tokens=8, regex="<end>")
    eng = HFEngine(str(smollm2_dir), EngineConfig(device="cpu", threads=1))
    with pytest.raises(ValueError, match="guided decoding \\(sampling regex '<end>'\\) needs the vllm engine"):
        eng.generate([[{"role": "user", "content": "hi"}]], guided)
    policy = HFPolicy(eng.model, eng.tokenizer, str(smollm2_dir), EngineConfig(device="cpu", threads=1), None)
    with pytest.raises(ValueError, match="the trained roles mask_search have a guided-decoding regex"):
        Rollouts(policy, {"default": guided}, [M.SEARCH], None, EngineConfig(), temperature=1.0, top_p=1.0, seed=0)


def test_ray_engines_split_the_cores_one_set_per_engine():
    from ragteam.llm.ray_engines import core_sets

    assert core_sets(2, None, [0, 1]) == [[0], [1]]
    assert core_sets(2, 1, [0, 1, 2, 3]) == [[0], [1]]
    assert core_sets(2, None, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert core_sets(3, None, [0, 1]) == [[0], [1], [0]]          # more engines than cores: they wrap around
