"""Issue 23 §2, room to write the formats: every role's `llm.sampling.<role>.max_new_tokens` holds the longest valid
output its workflow can need (`LONGEST_OUTPUTS` of each system module, see `ragteam.agents.core`), counted with the
project's SmolLM2 tokenizer plus one EOS, in the default profile and in profiles/paper.yaml. A budget below that
truncates a valid output into a format error that no training can fix. Every other role of `llm.sampling` writes free
text that its parser accepts at any non-empty length (FREE_TEXT): its budget bounds the text by design, and
`test_every_sampled_role_is_either_sized_by_its_longest_output_or_free_text` fails on a role in neither list."""
from __future__ import annotations

from pathlib import Path

import pytest

from ragteam.agents import baselines, ircot, maps, sure
from ragteam.agents.core import LONG_ANSWER, FormatError
from ragteam.config import deep_merge, load_params
from ragteam.llm import LLMConfig, Team
from ragteam.profiles import load_profile
from ragteam.systems.decor import roles as decor
from ragteam.systems.decor.rewards import parse_verdict
from ragteam.systems.jade import roles as jade
from ragteam.systems.mask import roles as mask
from ragteam.systems.qagent import roles as qagent

REPO = Path(__file__).resolve().parents[1]
PARAMS = load_params(REPO / "params.yaml")
PROFILES = {"default": PARAMS, "paper": deep_merge(PARAMS, load_profile("paper", REPO / "profiles"))}
LONGEST = {**maps.LONGEST_OUTPUTS, **mask.LONGEST_OUTPUTS, **jade.LONGEST_OUTPUTS, **decor.LONGEST_OUTPUTS,
           **qagent.LONGEST_OUTPUTS, **baselines.LONGEST_OUTPUTS, **ircot.LONGEST_OUTPUTS, **sure.LONGEST_OUTPUTS}
# the roles whose budgets the issue names, every role of the joint systems and of MAPS inference, the debate's
# formatted roles, DECOR's LLM judge and the baselines' formatted roles
REQUIRED = {"query_agent", "judge_agent", "answer_agent", *mask.ROLES, *jade.ROLES, *decor.POLICY_ROLES, "qagent",
            "opponent", "moderator", "decor_judge", baselines.ROLE, ircot.ROLE, "candidate_generator", "verifier",
            "ranker"}
# Roles whose parser takes any non-empty text, and what bounds their budget instead of a longest output.
FREE_TEXT = {
    "proponent": "a DRAG argument read only by the moderator (maps.parse_proponent); a cut argument still parses",
    "summarizer": "SuRe's supporting passage (sure.parse_summary keeps what precedes [DONE]); FlashRAG's 32 at paper",
    "decor_summarizer": "the frozen DECOR memory summary (decor.parse_summary); the budget keeps it inside L_max",
}


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
        "opponent": maps.parse_opponent, "moderator": maps.parse_moderator, "decor_judge": parse_verdict,
        baselines.ROLE: maps.parse_answer, ircot.ROLE: ircot.parse_thought,
        "candidate_generator": sure.parse_candidates, "verifier": sure.parse_validation, "ranker": sure.parse_ranking,
    }


def test_every_role_lists_longest_outputs_that_its_own_parser_accepts():
    assert REQUIRED <= set(LONGEST), f"no longest outputs for {sorted(REQUIRED - set(LONGEST))}"
    parsers = _parsers(PARAMS)
    bad = [f"{role}: {out.reason} in {text!r}" for role, texts in LONGEST.items() for text in texts
           for out in [parsers[role](text)] if isinstance(out, FormatError)]
    assert not bad, "\n".join(bad)
    # the examples are the complete formats: the opponent's action line carries its query, IRCoT's last step answers
    assert {maps.parse_opponent(t)["action"] for t in LONGEST["opponent"]} == {"expand", "concede"}
    assert ircot.parse_ircot_answer(LONGEST[ircot.ROLE]) == f"{LONG_ANSWER}."
    assert len(sure.parse_candidates(LONGEST["candidate_generator"][0])) == 2


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_sampled_role_is_either_sized_by_its_longest_output_or_free_text(profile):
    """A role added to llm.sampling without longest outputs (or a stated free-text bound) fails here."""
    roles = set(PROFILES[profile]["llm"]["sampling"]) - {"default"}
    assert not set(LONGEST) & set(FREE_TEXT)
    assert roles <= set(LONGEST) | set(FREE_TEXT), \
        f"no LONGEST_OUTPUTS or FREE_TEXT entry for {sorted(roles - set(LONGEST) - set(FREE_TEXT))}"


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
