"""Issue 23 §2, room to write the formats: every role's `llm.sampling.<role>.max_new_tokens` holds the longest valid
output its workflow can need (`LONGEST_OUTPUTS` of each system module, see `ragteam.agents.core`), counted with the
project's SmolLM2 tokenizer plus one EOS, in the default profile and in profiles/paper.yaml. A budget below that
truncates a valid output into a format error that no training can fix."""
from __future__ import annotations

from pathlib import Path

import pytest

from ragteam.agents import decor, jade, maps, mask, qagent
from ragteam.agents.core import FormatError
from ragteam.config import deep_merge, load_params
from ragteam.llm import LLMConfig, Team
from ragteam.profiles import load_profile

REPO = Path(__file__).resolve().parents[1]
PARAMS = load_params(REPO / "params.yaml")
PROFILES = {"default": PARAMS, "paper": deep_merge(PARAMS, load_profile("paper", REPO / "profiles"))}
LONGEST = {**maps.LONGEST_OUTPUTS, **mask.LONGEST_OUTPUTS, **jade.LONGEST_OUTPUTS, **decor.LONGEST_OUTPUTS,
           **qagent.LONGEST_OUTPUTS}
# the roles whose budgets the issue names, and every role of the joint systems and of MAPS inference
REQUIRED = {"query_agent", "judge_agent", "answer_agent", *mask.ROLES, *jade.ROLES, *decor.POLICY_ROLES, "qagent"}


def _max_update_steps(params: dict) -> int:
    """Steps in K when Update speaks at the last turn: a full plan, then one Add per earlier turn."""
    return mask.MAX_PLAN_STEPS + params["mask"]["max_turns"] - 1


def _parsers(params: dict) -> dict:
    """Each role's own parser, with the workflow state its longest output assumes under `params`."""
    top_k = params["jade"]["top_k"]

    def ds(text):
        ids = jade.parse_doc_ids(text)
        return ids if isinstance(ids, FormatError) else jade.check_doc_ids(ids, top_k)

    return {
        "query_agent": maps.parse_query, "judge_agent": maps.parse_judge, "answer_agent": maps.parse_answer,
        mask.PLANNING: mask.parse_plan, mask.SEARCH: mask.parse_search, mask.SUMMARY: mask.parse_summary,
        mask.UPDATE: lambda t: mask.parse_update(t, _max_update_steps(params)), mask.ANSWER: mask.parse_final_answer,
        jade.PLANNER: jade.parse_plan, jade.QR: jade.parse_rewrite, jade.QDS: jade.parse_subquestions,
        jade.QDP: jade.parse_subquestions, jade.DS: ds, jade.AG: jade.parse_answer, jade.AS: jade.parse_answer,
        decor.PLANNER: decor.parse_planner, decor.FILTER: decor.parse_filter, decor.ANSWERER: decor.parse_answerer,
        # a turn that opens with a reflection follows an <information> block
        "qagent": lambda t: qagent.parse_turn(t, after_information=t.startswith("<reflection>"),
                                              max_queries=params["qagent"]["max_queries"]),
    }


def test_every_role_lists_longest_outputs_that_its_own_parser_accepts():
    assert REQUIRED <= set(LONGEST), f"no longest outputs for {sorted(REQUIRED - set(LONGEST))}"
    parsers = _parsers(PARAMS)
    bad = [f"{role}: {out.reason} in {text!r}" for role, texts in LONGEST.items() for text in texts
           for out in [parsers[role](text)] if isinstance(out, FormatError)]
    assert not bad, "\n".join(bad)


def test_longest_outputs_reach_the_limits_of_the_default_params():
    """The examples are as long as the default params let the workflow need: stale ones fail here."""
    n = _max_update_steps(PARAMS)
    assert {f"<Update>t{n}</Update>", f"<Add>t{n + 1}</Add>"} <= set(LONGEST[mask.UPDATE])
    assert len(mask.parse_plan(LONGEST[mask.PLANNING][0])["steps"]) == mask.MAX_PLAN_STEPS
    assert max(len(jade.parse_subquestions(t)) for t in LONGEST[jade.QDS] + LONGEST[jade.QDP]) == \
        jade.MAX_SUBQUESTIONS
    assert jade.parse_doc_ids(LONGEST[jade.DS][0]) == list(range(PARAMS["jade"]["top_k"]))
    searches = [qagent.parse_turn(t, t.startswith("<reflection>")) for t in LONGEST["qagent"]]
    assert max(len(s.get("queries", [])) for s in searches) == PARAMS["qagent"]["max_queries"]
    assert len(maps.parse_query(LONGEST["query_agent"][0]).split()) == maps.MAX_KEYWORDS


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_roles_budget_holds_its_longest_output(profile, smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    team = Team(lambda _role: None, LLMConfig.model_validate(PROFILES[profile]["llm"]).sampling)
    short = []
    for role, texts in sorted(LONGEST.items()):
        need = max(len(tok(t, add_special_tokens=False).input_ids) for t in texts) + 1   # + EOS to end the turn
        budget = team.sampling_for(role).max_new_tokens
        if budget < need:
            short.append(f"llm.sampling.{role}.max_new_tokens is {budget}, its longest valid output needs {need}")
    assert not short, f"{profile} profile:\n" + "\n".join(short)
