"""What evaluation asks the registry instead of naming a system: the roles `eval.agents` may name, the workflow
params sections, the helper roles pinned to their own checkpoints, the LJ judge, the report's settings lines and
the derived comparison pairs (`ragteam.systems`, `System` / `RowKind` fields)."""
from __future__ import annotations

import pytest

from ragteam.eval.evaluate import EvalConfig, SystemSpec, WorkflowConfigs, comparison_pairs
from ragteam.records import Episode
from ragteam.systems.registry import (REGISTRY, agent_roles, config_sections, frozen_role_models, lj_judge,
                                      report_context)


def test_eval_agents_takes_the_registered_trained_roles_and_names_the_known_on_a_typo():
    roles = agent_roles()
    assert {"query_agent", "judge_agent", "answer_agent", "qagent", "decor_planner", "decor_filter",
            "decor_answerer"} == set(roles)
    assert EvalConfig(systems={}, agents={"decor_filter": "models/agents/decor"}).agents
    with pytest.raises(ValueError, match=r"'answr_agent' is not a role with trained checkpoints \(known: .*answer_agent"):
        EvalConfig(systems={}, agents={"answr_agent": "x"})
    with pytest.raises(ValueError, match="is not a role with trained checkpoints"):
        SystemSpec(workflow="maps", trained_agents=True, base_roles=["nobody"])


def test_workflow_configs_have_one_field_per_registered_section():
    sections = config_sections()
    assert {"maps", "mask", "jade", "decor", "qagent"} <= set(sections)
    cfgs = WorkflowConfigs.from_params({"maps": {"max_rounds": 2}, "jade": {"top_k": 7}})
    assert cfgs.maps.max_rounds == 2 and cfgs.jade.top_k == 7
    for section, model in sections.items():
        assert isinstance(getattr(cfgs, section), model)
    with pytest.raises(Exception, match="jade"):
        WorkflowConfigs.from_params({"jade": {"no_such_key": 1}})


def test_helper_roles_on_their_own_checkpoints_come_from_the_systems_that_pin_them():
    cfgs = WorkflowConfigs.from_params({"decor": {"summarizer_model": "models/x", "judge": "llm",
                                                  "judge_model": "models/j"}})
    pinned = frozen_role_models(cfgs)
    assert pinned == cfgs.decor.frozen_roles() and "models/j" in pinned.values()
    assert frozen_role_models(WorkflowConfigs()) == WorkflowConfigs().decor.frozen_roles()


def test_the_lj_judge_scores_every_episode_with_golds():
    eps = [Episode(question_id="a", question="q", golden_answers=["Paris"], final_answer="in Paris"),
           Episode(question_id="b", question="q", golden_answers=["Rome"], final_answer="Lyon"),
           Episode(question_id="c", question="q", golden_answers=[], final_answer="x")]
    lj_judge(WorkflowConfigs(), team=None)(eps)       # decor.judge: rules (a gold contained in the prediction)
    assert [e.metrics.get("lj") for e in eps] == [1.0, 0.0, None]


def test_each_system_reports_its_own_settings_only_where_a_row_uses_them():
    cfgs = WorkflowConfigs()
    base = report_context(cfgs, "base", {"native"}, False)
    assert list(base) == ["MAPS"]                   # the core's line is always there
    jade = report_context(cfgs, "base", {"jade", "maps"}, False)
    assert "JADE" in jade and "DECOR" not in jade and "QAgent" not in jade
    assert {"DECOR", "LJ judge"} <= set(report_context(cfgs, "base", {"native"}, True))
    assert "QAgent" in report_context(cfgs, "base", {"qagent_plugin"}, False)
    llm = report_context(WorkflowConfigs.from_params({"decor": {"judge": "llm"}}), "the-base", {"decor"}, False)
    assert llm["LJ judge"] == "llm (the-base, Appendix B.1)"


def test_derived_pairs_come_from_the_row_kinds():
    systems = {n: SystemSpec(**s) for n, s in {
        "native": {"workflow": "native"}, "standard_rag": {"workflow": "standard_rag"},
        "maps": {"workflow": "maps"}, "maps_trained": {"workflow": "maps", "trained_agents": True},
        "maps_no_judge": {"workflow": "maps", "trained_agents": True, "base_roles": ["judge_agent"]}}.items()}
    assert comparison_pairs(systems) == [("standard_rag", "native"), ("maps_trained", "maps"),
                                         ("maps_trained", "maps_no_judge")]
    # a row named otherwise than its kind is not the kind's comparison
    renamed = {"rag": systems["standard_rag"], "native": systems["native"]}
    assert comparison_pairs(renamed) == []
    assert REGISTRY["standard_rag"].rows["standard_rag"].compared_with == "native"


def test_a_section_reads_the_same_whether_a_field_or_not():
    cfgs = WorkflowConfigs.from_params({"jade": {"top_k": 7}})
    assert cfgs.section("jade").top_k == 7 and cfgs.section("jade") is cfgs.jade
    assert cfgs.section("no_such_system", "default") == "default"
