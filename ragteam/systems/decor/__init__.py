"""DECOR (Sec. 4): Planner, Filter and Answerer on one shared policy, a frozen summarizer (and optionally an LLM
judge); rolled out by `ragteam.systems.decor.workflow.run_decor` (prompts and parsers: `ragteam.systems.decor.roles`),
rewarded by Eq. 2-3 with the format gate (`ragteam.systems.decor.rewards`), trained by multi-role GRPO: per-role group
advantages (Eq. 6, `ragteam.train.decor_adv`), no critic, dynamic sampling; its oracle player writes every role's
output from the gold hops for the format warm-up (with the rule judge).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial
from typing import Any

from ragteam.agents.grammars import NOT_A_PLACEHOLDER, text
from ragteam.config import ParamsError, parse_section
from ragteam.llm import Messages, Team
from ragteam.metrics import exact_match
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import TeamReward
from ragteam.systems.decor import roles as D
from ragteam.systems.decor.rewards import RuleJudge, decor_rewards, make_judge, score_lj
from ragteam.systems.decor.workflow import JUDGE_ROLE, DecorConfig, run_decor
from ragteam.systems.spec import RowKind, System
from ragteam.train.joint.params import JointSystemParams
from ragteam.train.joint.system import JointSystem
from ragteam.warmup.gold import Gold, bare
from ragteam.warmup.oracle import OracleSystem, Reply, user_text

# ---- training: the joint trainer's adapter --------------------------------------------------------------------------

def decor_system(params: dict[str, Any], retriever: Retriever) -> JointSystem:
    """DECOR (Sec. 4.4): Planner, Filter and Answerer on the shared policy, the summarizer (and an LLM judge) frozen;
    `decor.group_size` training-mode rollouts of each question (a malformed call truncates its trajectory); rewards
    R_total of Eq. 3 per call (format gate, Eq. 2, the `decor.judge` role verdicts); advantages of Eq. 6 per role
    within each question's group, no critic; dynamic sampling keeps a question's group only when some role's return
    varies within it, and the trainer refills the step with further questions up to
    `decor.dynamic_sampling.max_rounds` rollouts. The loss is the shared one with `ratio_level: sequence`
    (Eq. 5; clip-higher through `clip_eps` / `clip_eps_high`)."""
    from ragteam.train.decor_adv import decor_advantages, dynamic_sampling, role_returns

    cfg = parse_section(params, "decor", DecorConfig)
    last_team: dict[str, Team] = {}       # the step's Team: the LLM judge's `decor_judge` role is on it

    def rollout(rows: Sequence[dict], team: Team) -> list[Episode]:
        last_team["team"] = team
        # G copies of each question, consecutive; Episode.question_id (the row id) is the group of Eq. 6
        return run_decor([r for r in rows for _ in range(cfg.group_size)], team, retriever, cfg, system="decor",
                         truncate_on_format_error=True)

    def annotate(eps: list[Episode]) -> list[Episode]:
        decor_rewards(eps, make_judge(cfg, last_team["team"]), cfg.reward)
        return eps

    ds = cfg.dynamic_sampling
    frozen: dict[str, str | None] = {D.SUMMARIZER: cfg.summarizer_model}
    if cfg.judge == "llm":
        frozen[JUDGE_ROLE] = cfg.judge_model
    return JointSystem(
        name="decor", roles=D.POLICY_ROLES, rollout=rollout, annotate=annotate,
        advantage=partial(decor_advantages, roles=D.POLICY_ROLES),
        select=(partial(dynamic_sampling, returns_of=partial(role_returns, roles=D.POLICY_ROLES)) if ds.enabled
                else None), max_rollout_rounds=ds.max_rounds if ds.enabled else 1,
        frozen_roles=frozen, requires={"ratio_level": "sequence", "normalize_advantages": False},
        # module paths in `describe` are historical identifiers (pre-package), kept so that model hashes stay the same
        describe={"workflow": "ragteam.agents.decor_workflow.run_decor(truncate_on_format_error=True)",
                  "decor": cfg.model_dump(), "advantage": "ragteam.train.decor_adv.decor_advantages (Eq. 6)",
                  "dynamic_sampling": ("ragteam.train.decor_adv.dynamic_sampling (some role's return varies in the "
                                       f"group), refilled up to {ds.max_rounds} rollouts per step")
                  if ds.enabled else "off",
                  "reward": "DECOR Eq. 2-3 with the format gate (ragteam.rewards.decor.decor_rewards)"},
    )


REWARD_TEXT = ("DECOR hierarchical rewards (Sec. 4.3): a trajectory with a malformed Planner / Filter / Answerer output is "
              "truncated and every policy call gets -1 (format gate); otherwise each call gets R_total = α·R_team + "
              "β·R_role (Eq. 3), R_team = λ·F1 + (1 − λ)·R_LJ (Eq. 2), R_role = ±1 per step from decor.judge (rules "
              "or the Appendix B prompts); per role the calls' rewards are averaged per trajectory and normalised "
              "within the question's G trajectories where the role acted (Eq. 6); dynamic sampling trains only on "
              "the groups where some role's return varies (some advantage is non-zero), refilling the step with "
              "further questions up to decor.dynamic_sampling.max_rounds rollouts (DAPO).")


# ---- evaluation: its rows' team reward (ragteam.rewards.team) -------------------------------------------------------

def decor_team_reward(ep: Episode) -> float:
    """The mean R_total over the policy calls of a DECOR episode whose rewards `decor.assign_rewards` filled."""
    rewards = [c.reward for c in ep.calls if c.role in D.POLICY_ROLES]
    if not rewards or any(r is None for r in rewards):
        raise ValueError(f"episode {ep.episode_id}: DECOR policy calls without a reward (assign_rewards first)")
    return float(sum(rewards) / len(rewards))


TEAM_REWARDS = {"decor": TeamReward(lambda ep, cfgs: decor_team_reward(ep))}


# ---- the guided-decoding grammars of its `decor_grammar` rows (ragteam.agents.grammars) -----------------------------

def _grammar_block(tag: str, think: int, content: int) -> str:
    """Appendix A's layout: `<think>` one paragraph `</think>` then the role's block, tags on their own lines; the
    block does not open with `[` (the templates' bracketed placeholders, which small models echo)."""
    body = text(content, NOT_A_PLACEHOLDER)
    return rf"<think>\n{text(think)}\n</think>\n<{tag}>\n{body}\n</{tag}>"


GRAMMARS: dict[str, str] = {
    D.PLANNER: _grammar_block("search", 90, 70),
    D.FILTER: _grammar_block("filter", 80, 160),
    D.ANSWERER: _grammar_block("answer", 110, 40),
}


# ---- the warm-up's oracle player ----------------------------------------------------------------------------------
# Output forms: Appendix A's `<think>...</think>` then one `<search>` / `<filter>` / `<answer>` block, the tags on
# their own lines as the templates lay them out (`ragteam.systems.decor.roles.parse_blocks`). Strategy:
# - Planner: the first hop whose fact sentence the memory's evidence does not hold, by its sub-question (an entity
#   found by an earlier hop is in that evidence); `None` once every fact is there;
# - Filter: the fact sentences of the hops that the (clipped) results show, and of every other supporting passage
#   the results hold its first sentence (the rule judge wants each such title mentioned), in one paragraph;
# - Answerer: the golden answer when the memory holds every hop's fact, else "unknown".
# The <think> blocks say in one sentence what the output rests on (the budgets hold one sentence, tests/test_budgets).

def _decor_field(text: str, start: str) -> str:
    i = text.rfind(start)
    if i < 0:
        raise ValueError(f"DECOR prompt has no {start.strip()!r} field: {text[-160:]!r}")
    return text[i + len(start):]


def _decor_block(think: str, tag: str, content: str) -> str:
    return f"<think>\n{think}\n</think>\n<{tag}>\n{content}\n</{tag}>"


def _decor_known(gold: Gold, history: str) -> list[int]:
    evidence = D.history_evidence(history)
    return [i for i, h in enumerate(gold.hops) if h.fact in evidence]


def decor_planner(gold: Gold, messages: Messages) -> str:
    history = _decor_field(user_text(messages), "history search information: ")
    known = _decor_known(gold, history)
    todo = [i for i in range(len(gold.hops)) if i not in known]
    if not todo:
        return _decor_block("The history states every fact the question needs.", "search", "None")
    h = gold.hops[todo[0]]
    return _decor_block(f"The history does not answer: {h.question}", "search", h.question)


def decor_filter(gold: Gold, messages: Messages) -> str:
    text = user_text(messages)
    docs = re.findall(r'^Doc \d+\(Title: "(.*?)"\): (.*)$', _decor_field(text, "Retrieval Results: "), re.MULTILINE)
    kept = []
    for title, body in docs:
        facts = [h.fact for h in gold.hops if h.fact in body]
        if facts:
            kept += [f for f in facts if f not in kept]
        elif any(bare(title) == bare(h.title) for h in gold.hops):
            first = re.split(r"(?<=[.!?])\s", body, maxsplit=1)[0]
            if first not in kept:
                kept.append(first)
    if not kept:
        return _decor_block("No document states a fact the query asks for.", "filter", "No relevant information.")
    return _decor_block("I kept the sentences that state the facts the query asks for.", "filter", " ".join(kept))


def decor_answer(gold: Gold, messages: Messages) -> str:
    history = _decor_field(user_text(messages), "History search information: ")
    if len(_decor_known(gold, history)) == len(gold.hops):
        return _decor_block("The history states every fact the answer follows from.", "answer", gold.answer)
    return _decor_block("The history does not state every fact the answer needs.", "answer", "unknown")


def decor_summary(messages: Messages) -> str:
    return D.history_evidence(_decor_field(user_text(messages), "Search history:\n")) or "-"


def decor_replies(gold: Gold) -> dict[str, Reply]:
    return {D.PLANNER: lambda m: decor_planner(gold, m), D.FILTER: lambda m: decor_filter(gold, m),
            D.ANSWERER: lambda m: decor_answer(gold, m), D.SUMMARIZER: decor_summary}



def decor_oracle(params: dict[str, Any]) -> OracleSystem:
    """DECOR with the offline rule judge (`decor.judge: rules`; an LLM judge would need a model). A complete trace:
    every call well formed, the golden answer, and no role verdict of -1 (each policy call's R_total at least
    α·R_team; the Answerer is judged only when the memory holds a non-yes/no gold answer, Sec. 4.3)."""
    cfg = parse_section(params, "decor", DecorConfig)
    if cfg.judge != "rules":
        raise ParamsError("DECOR oracle traces need decor.judge: rules (the LLM judge needs a model to run)")

    def incomplete(ep: Episode) -> str | None:
        if ep.meta.get("truncated"):
            return f"format error in {ep.meta['truncated']['role']}"
        if exact_match(ep.final_answer or "", ep.golden_answers) < 1:
            return "final answer not the gold"
        low = [c.role for c in ep.calls if c.role in D.POLICY_ROLES and c.reward < cfg.reward.alpha - 1e-9]
        return f"role verdict -1 for {low[0]}" if low else None

    return OracleSystem(
        name="decor", roles=D.POLICY_ROLES, replies=decor_replies,
        run=lambda rows, team, retriever: run_decor(rows, team, retriever, cfg, system="decor",
                                                    truncate_on_format_error=True),
        annotate=lambda eps: decor_rewards(eps, RuleJudge(), cfg.reward), incomplete=incomplete,
        parser=lambda role, m: {D.PLANNER: D.parse_planner, D.FILTER: D.parse_filter, D.ANSWERER: D.parse_answerer,
                                D.SUMMARIZER: D.parse_summary}[role],
        # module paths in `describe` are historical identifiers (pre-package), kept so that model hashes stay the same
        describe={"workflow": "ragteam.agents.decor_workflow.run_decor (training mode, one rollout per question)",
                  "reward": "DECOR Eq. 2-3 with the rule judge", "decor": cfg.model_dump()})


# ---- evaluation: its rows -------------------------------------------------------------------------------------------

def score_rows(scored: Sequence[Episode], team: Team, cfgs) -> None:
    """Eq. 2-3 rewards (`decor.reward`, judge `decor.judge`) and LJ in one judging pass: the role verdicts of the
    rewards and R_LJ, which is also the LJ score."""
    judge = make_judge(cfgs.decor, team)
    if scored:
        for ep, j in zip(scored, decor_rewards(scored, judge, cfgs.decor.reward)):
            ep.metrics["lj"] = j.lj


# the summarizer is a helper that is never trained: a row's `model` leaves it where it was (DecorConfig.frozen_roles)
ROWS = {"decor": RowKind(roles=(*D.POLICY_ROLES, D.SUMMARIZER), family="DECOR", frozen_roles=(D.SUMMARIZER,),
                         post_score=score_rows, judged=True,
                         run=lambda rows, team, retriever, cfgs, spec, name: run_decor(rows, team, retriever,
                                                                                       cfgs.decor, system=name))}




def report_context(cfgs, base_model: str, used: set[str], lj_all: bool) -> dict[str, str]:
    """The report's DECOR and LJ-judge lines, where a row is DECOR's or every row gets LJ."""
    if not (used & set(ROWS) or lj_all):
        return {}
    d = cfgs.decor
    return {"DECOR": f"t_max {d.t_max}, top_k {d.top_k}, l_max {d.l_max}, passage_words {d.passage_words}",
            "LJ judge": (f"llm ({d.judge_model or base_model}, Appendix B.1)" if d.judge == "llm"
                         else "rules (a gold answer contained in the prediction, whole words)")}


SYSTEM = System(name="decor", section="decor", config=DecorConfig, train_params=JointSystemParams,
                joint=decor_system, reward_text=REWARD_TEXT, oracle=decor_oracle, grammars=GRAMMARS,
                team_rewards=TEAM_REWARDS, rows=ROWS, agent_roles=D.POLICY_ROLES,
                frozen_role_models=lambda cfgs: cfgs.decor.frozen_roles(),
                judge=lambda cfgs, team: partial(score_lj, judge=make_judge(cfgs.decor, team)),
                report_context=report_context)
