"""JADE (§3, Algorithms 1-2): a planner and six LLM executors (QR, QDS, QDP, DS, AG, AS) over a retriever, on one
shared policy; rolled out by Algorithm 1 (`ragteam.systems.jade.workflow.run_jade`; prompts and parsers:
`ragteam.systems.jade.roles`), rewarded by Eq. 6-8 (`ragteam.systems.jade.rewards`), trained by joint PPO with GAE
over each episode's flattened calls, or with `joint.jade.estimator: group` by GRPO's outcome advantage; its oracle
player writes every role's output from the gold hops for the format warm-up.

Credit: R_global (Eq. 6) sits on the terminal call alone; only GAE over the flattened calls (Alg. 2) carries it back,
through the critic, to the planner and executors that produced it (`gae_scope="episode"`). `joint.jade.estimator:
group` (not the paper's) replaces the critic by GRPO's outcome advantage over `group_size` rollouts of each question:
the episode's return, normalised within its group, on every call (`JadeTrainParams`).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field, model_validator

from ragteam.agents.grammars import numbered_questions, text
from ragteam.config import parse_section
from ragteam.llm import Messages
from ragteam.metrics import exact_match
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import TeamReward, episode_return
from ragteam.systems.jade import roles as J
from ragteam.systems.jade.rewards import assign_rewards
from ragteam.systems.jade.workflow import JadeConfig, run_jade
from ragteam.systems.spec import RowKind, System
from ragteam.train.decor_adv import DynamicSamplingConfig
from ragteam.train.joint.params import GroupEstimatorParams
from ragteam.train.joint.system import JointSystem
from ragteam.warmup.gold import Gold
from ragteam.warmup.oracle import OracleSystem, Reply, user_text, visible_fact

# ---- training: the joint trainer's adapter --------------------------------------------------------------------------

def _workflow(ep: Episode) -> dict:
    return ep.meta["workflow"]


# JADE's own training figures (Sec. 4 RQ2 / App. D): per episode, averaged over a step's episodes by the trainer
JADE_STATS: dict[str, Callable[[Episode], float]] = {
    "turns": lambda ep: float(_workflow(ep)["rounds"]),             # a JADE round is its turn (Eq. 6's T)
    "searches": lambda ep: float(_workflow(ep)["retrievals"]),      # Eq. 6's N_ret
    "ds_calls": lambda ep: float(_workflow(ep)["ds_calls"]),
    "ds_per_round": lambda ep: _workflow(ep)["ds_calls"] / max(_workflow(ep)["rounds"], 1),  # App. D's DS ratio
    "decomposed": lambda ep: float(_workflow(ep)["decomposed"]),    # the root plan decomposed (QDS / QDP)
    "decompose_share": lambda ep: _workflow(ep)["plans_decompose"] / max(_workflow(ep)["plans"], 1),
    "max_rounds_hit": lambda ep: float(_workflow(ep)["max_rounds_hit"]),
    "r_global": lambda ep: float(_workflow(ep)["r_global"]),
}


class JadeTrainParams(GroupEstimatorParams):
    """params.yaml `joint.jade` (`GroupEstimatorParams`). With `estimator: group` each episode's return (the sum of
    its calls' rewards: R_global and the Eq. 7 format penalties) is normalised within its group
    (`ragteam.train.advantages.outcome_group_advantages`) and given to every call. `dynamic_sampling` (DAPO, off by
    default) trains only the groups whose returns vary and refills the step, as DECOR's and QAgent's do."""

    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=lambda: DynamicSamplingConfig(enabled=False))

    @model_validator(mode="after")
    def _check_sampling(self) -> JadeTrainParams:
        if self.estimator == "gae" and self.dynamic_sampling.enabled:
            raise ValueError("dynamic_sampling applies to estimator group only; estimator gae rolls out each question "
                             "once (set estimator: group, or dynamic_sampling enabled: false)")
        return self


def jade_group_advantages(episodes: Sequence[Episode]) -> list[list[float | None]]:
    """JADE's critic-free estimator (`JadeTrainParams`): every call of episode i gets its group-normalised return."""
    from ragteam.train.advantages import outcome_group_advantages

    return outcome_group_advantages([episode_return(ep) for ep in episodes], [ep.question_id for ep in episodes],
                                    [len(ep.calls) for ep in episodes])


def jade_system(params: dict[str, Any], retriever: Retriever) -> JointSystem:
    """JADE (§3.4, Algorithm 2): the planner and the six LLM executors of `ragteam.systems.jade.roles`, rolled out
    with Algorithm 1 (`run_jade`: JADE's training rollout is its inference procedure), rewarded by Eq. 6-8
    (`ragteam.systems.jade.rewards.assign_rewards`: R_global on the terminal call, −`jade.reward.format_penalty` on
    every malformed call). GAE runs over each episode's flattened call sequence (`gae_scope="episode"`), so the round-1
    planner is credited with the terminal reward through the critic. The Eq. 7 format penalties sit on the malformed
    calls themselves, yet the same episode GAE also charges each one (discounted by γλ) to every earlier call of the
    episode: this follows Algorithm 2's GAE over the flattened calls, not a per-call credit."""
    from ragteam.train.decor_adv import dynamic_sampling

    cfg = parse_section(params, "jade", JadeConfig)
    # joint.jade, when given (the stage always has it; a caller without it trains the paper's way)
    tp = (parse_section(params, "joint.jade", JadeTrainParams) if "jade" in (params.get("joint") or {})
          else JadeTrainParams())

    def annotate(episodes: list[Episode]) -> list[Episode]:
        for ep in episodes:
            assign_rewards(ep, cfg.reward)
        return episodes

    # module paths in `describe` are historical identifiers (pre-package), kept so that model hashes stay the same
    describe = {"workflow": "ragteam.agents.jade_workflow.run_jade", "jade": cfg.model_dump(),
                "reward": "JADE Eq. 6-8 (ragteam.rewards.jade.assign_rewards)"}
    if tp.estimator == "gae":
        return JointSystem(
            name="jade", roles=J.ROLES,
            rollout=lambda rows, team: run_jade(rows, team, retriever, cfg, system="jade"),
            annotate=annotate, stats=JADE_STATS,
            gae_scope="episode",      # R_global on the terminal call only: Alg. 2's GAE over the flattened calls
            describe=describe,
        )
    ds = tp.dynamic_sampling
    return JointSystem(
        name="jade", roles=J.ROLES,
        # G copies of each question, consecutive; Episode.question_id (the row id) is the group
        rollout=lambda rows, team: run_jade([r for r in rows for _ in range(tp.group_size)], team, retriever, cfg,
                                            system="jade"),
        annotate=annotate, stats=JADE_STATS, advantage=jade_group_advantages,
        select=(lambda eps: dynamic_sampling(eps, lambda ep: {"episode": episode_return(ep)})) if ds.enabled else None,
        max_rollout_rounds=ds.max_rounds if ds.enabled else 1,
        requires={"normalize_advantages": False},   # the group normalisation is the only one (GRPO's)
        describe={**describe, "estimator": f"group of {tp.group_size} rollouts per question",
                  "advantage": "ragteam.train.systems.jade_group_advantages (GRPO outcome advantage, no critic)",
                  "dynamic_sampling": ("ragteam.train.decor_adv.dynamic_sampling (the episode return varies in the "
                                       f"group), refilled up to {ds.max_rounds} rollouts per step")
                  if ds.enabled else "off"},
    )



REWARD_TEXT = ("JADE (§3.3, Eq. 6-8): R_global = F1(ŷ, y) - α·min(T, M)/M - β·min(N_ret, M)/M on the episode's "
             "terminal call only (AS, or AG when the root was answered directly), with T the rounds, N_ret the "
             "retrievals, α, β, M = jade.reward.alpha, beta, cost_max; minus jade.reward.format_penalty on every "
             "malformed call (Eq. 7). Every call is a PPO sample; GAE over the episode's flattened calls carries "
             "R_global back to the round-1 planner (Alg. 2).")


# ---- evaluation: its rows' team reward (ragteam.rewards.team): the episode's return ---------------------------------

TEAM_REWARDS = {"jade": TeamReward(lambda ep, cfgs: episode_return(ep))}


# ---- the guided-decoding grammars of its `jade_grammar` rows (ragteam.agents.grammars) -------------------------------

def _jade_plans() -> str:
    """QDS, QDP, or an ordered subsequence of QR, R, DS, AG that ends in AG and has R before DS."""
    solve = ["AG", "R, AG", "R, DS, AG", "QR, AG", "QR, R, AG", "QR, R, DS, AG"]
    return "|".join(["QDS", "QDP", *solve])


GRAMMARS: dict[str, str] = {
    J.PLANNER: rf"<workflow>({_jade_plans()})</workflow>",
    J.QR: rf"<query>{text(90)}</query>",
    J.QDS: numbered_questions(J.MAX_SUBQUESTIONS, text(60)),
    J.QDP: numbered_questions(J.MAX_SUBQUESTIONS, text(60)),
    J.DS: r"<id>((Document ?)?[0-9]{1,2}(, ?(Document ?)?[0-9]{1,2}){0,4})?</id>",
    J.AG: rf"<answer>{text(55)}</answer>",
    J.AS: rf"<answer>{text(55)}</answer>",
}


# ---- the warm-up's oracle player ----------------------------------------------------------------------------------
# Output forms: Appendix E's tags (`ragteam.systems.jade.roles`), accepted by parse_plan, parse_rewrite,
# parse_subquestions, parse_doc_ids, parse_answer. The oracle's strategy, per node of Algorithm 1's trace:
# - the root of a one-hop question: the solving plan `R, DS, AG`; of hops where one names another's entity (a chain,
#   or a comparison of two chains): `QDS` into one sub-question per hop, an entity found by an earlier hop written
#   as a reference to that sub-question ("In which city was the answer to q1 born?": at decomposition time the
#   entity is not known); of hops that do not depend on each other: `QDP` into the hops' own sub-questions;
# - a serial sub-question before it is planned: QR resolves the reference with the answers so far (the serial
#   rewrite) into the hop's own question, which is then R's query;
# - every sub-question: `R, DS, AG`; DS keeps the candidates whose (clipped) text shows the hop's fact sentence,
#   AG answers with the hop's sub-answer when the selection shows it, else "I don't know";
# - AS, after a decomposition: the golden answer when every hop's answer was found, else "I don't know".

_JADE_REF = "the answer to q{j}"
_JADE_UNKNOWN = "I don't know"
_JADE_SOLVE = "<workflow>R, DS, AG</workflow>"


def _jade_question(messages: Messages, label: str) -> str:
    """The node's question of a JADE prompt: the user message's `Question:` / `Original Question:` line."""
    for line in user_text(messages).splitlines():
        if line.startswith(label):
            return line[len(label):]
    raise ValueError(f"JADE prompt has no {label!r} line: {user_text(messages)[:120]!r}")


def jade_serial(gold: Gold) -> bool:
    """Some hop's entity is another hop's answer: the sub-questions depend on each other (QDS); else QDP."""
    return any(gold.depends_on(i) is not None for i in range(len(gold.hops)))


def jade_subquestions(gold: Gold) -> list[str]:
    """The decomposer's sub-questions: each hop's own question, an entity found by an earlier hop written as a
    reference to that hop's sub-question."""
    out = []
    for i, h in enumerate(gold.hops):
        dep = gold.depends_on(i)
        out.append(h.question if dep is None else h.question.replace(h.title, _JADE_REF.format(j=dep + 1)))
    return out


def _jade_hop(gold: Gold, question: str) -> int:
    if question == gold.question and len(gold.hops) == 1:     # a one-hop question is solved at the root
        return 0
    for i, h in enumerate(gold.hops):
        if question in (h.question, jade_subquestions(gold)[i]):
            return i
    raise ValueError(f"question {gold.question_id}: {question!r} is none of the oracle's sub-questions")


def jade_planner(gold: Gold, messages: Messages) -> str:
    q = _jade_question(messages, "Question: ")
    if q == gold.question and len(gold.hops) > 1:
        return f"<workflow>{'QDS' if jade_serial(gold) else 'QDP'}</workflow>"
    return _JADE_SOLVE


def jade_decompose(gold: Gold) -> str:
    return "\n".join(f"<q{i}>{q}</q{i}>" for i, q in enumerate(jade_subquestions(gold), 1))


def jade_rewrite(gold: Gold, messages: Messages) -> str:
    """The serial rewrite: the hop's own question once the sub-question it refers to is answered (its answer is in
    the prompt's observations), else the question as it stands."""
    q = _jade_question(messages, "Original Question: ")
    i = _jade_hop(gold, q)
    dep = gold.depends_on(i)
    if (dep is not None and _JADE_REF.format(j=dep + 1) in q
            and f"Answer: {gold.hops[dep].answer}" in user_text(messages)):
        q = gold.hops[i].question
    return f"<query>{q}</query>"


def _jade_docs(messages: Messages) -> list[str]:
    return re.findall(r"^Document\d+ \(Title: .*?\): (.*)$", user_text(messages), re.MULTILINE)


def jade_select(gold: Gold, messages: Messages) -> str:
    i = _jade_hop(gold, _jade_question(messages, "Question: "))
    docs = _jade_docs(messages)
    return f"<id>{', '.join(str(k) for k, d in enumerate(docs) if visible_fact(gold, i, [d]))}</id>"


def jade_answer(gold: Gold, messages: Messages) -> str:
    q = _jade_question(messages, "Question: ")
    if q == gold.question and len(gold.hops) > 1:      # not the oracle's plan; answer nothing it cannot see
        return f"<answer>{_JADE_UNKNOWN}</answer>"
    i = _jade_hop(gold, q)
    shown = visible_fact(gold, i, _jade_docs(messages))
    return f"<answer>{gold.hops[i].answer if shown else _JADE_UNKNOWN}</answer>"


def jade_summarise(gold: Gold, messages: Messages) -> str:
    text = user_text(messages)
    found = all(f"Answer: {h.answer}" in text for h in gold.hops)
    return f"<answer>{gold.answer if found else _JADE_UNKNOWN}</answer>"


def jade_replies(gold: Gold) -> dict[str, Reply]:
    return {J.PLANNER: lambda m: jade_planner(gold, m), J.QR: lambda m: jade_rewrite(gold, m),
            J.QDS: lambda m: jade_decompose(gold), J.QDP: lambda m: jade_decompose(gold),
            J.DS: lambda m: jade_select(gold, m), J.AG: lambda m: jade_answer(gold, m),
            J.AS: lambda m: jade_summarise(gold, m)}


def jade_parser(role: str, messages: Messages) -> Callable[[str], Any]:
    if role == J.DS:
        n = len(_jade_docs(messages))
        return lambda t: (lambda ids: ids if isinstance(ids, J.FormatError) else J.check_doc_ids(ids, n))(
            J.parse_doc_ids(t))
    return {J.PLANNER: J.parse_plan, J.QR: J.parse_rewrite, J.QDS: J.parse_subquestions,
            J.QDP: J.parse_subquestions, J.AG: J.parse_answer, J.AS: J.parse_answer}[role]




def jade_oracle(params: dict[str, Any]) -> OracleSystem:
    cfg = parse_section(params, "jade", JadeConfig)

    def annotate(eps: list[Episode]) -> None:
        for ep in eps:
            assign_rewards(ep, cfg.reward)

    def incomplete(ep: Episode) -> str | None:
        bad = [c.role for c in ep.calls if c.format_error is not None]
        if bad:
            return f"format error in {bad[0]}"
        if ep.meta.get("stop_reason") != "answered":
            return f"not answered within max_rounds {cfg.max_rounds}"
        if exact_match(ep.final_answer or "", ep.golden_answers) < 1:
            return "final answer not the gold"
        low = [c.role for c in ep.calls if c.meta.get("selected_ids") == []]
        return f"{low[0]} selected no document" if low else None

    return OracleSystem(
        name="jade", roles=J.ROLES, replies=jade_replies,
        run=lambda rows, team, retriever: run_jade(rows, team, retriever, cfg, system="jade"),
        annotate=annotate, incomplete=incomplete, parser=jade_parser,
        # module paths in `describe` are historical identifiers (pre-package), kept so that model hashes stay the same
        describe={"workflow": "ragteam.agents.jade_workflow.run_jade (Algorithm 1, the rollouts' procedure)",
                  "reward": "JADE Eq. 6-8", "jade": cfg.model_dump()})

# ---- evaluation: its rows -------------------------------------------------------------------------------------------

def score_rows(scored: Sequence[Episode], team, cfgs) -> None:
    """Episodes with golden answers get their rewards (Eq. 6-8, `jade.reward`), so R_global is reported."""
    for ep in scored:
        assign_rewards(ep, cfgs.jade.reward)


ROWS = {"jade": RowKind(roles=J.ROLES, family="JADE", post_score=score_rows,
                        run=lambda rows, team, retriever, cfgs, spec, name: run_jade(rows, team, retriever, cfgs.jade,
                                                                                     system=name))}




def report_context(cfgs, base_model: str, used: set[str], lj_all: bool) -> dict[str, str]:
    """The report's JADE line, where a row is JADE's."""
    if not used & set(ROWS):
        return {}
    cfg = cfgs.jade
    r = cfg.reward
    return {"JADE": f"max_rounds {cfg.max_rounds}, top_k {cfg.top_k}, passage_words {cfg.passage_words}, "
                    f"serial_rewrite {cfg.serial_rewrite}; reward α {r.alpha}, β {r.beta}, cost max {r.cost_max}, "
                    f"format penalty {r.format_penalty}"}


SYSTEM = System(name="jade", section="jade", config=JadeConfig, train_params=JadeTrainParams, joint=jade_system,
                reward_text=REWARD_TEXT, oracle=jade_oracle, grammars=GRAMMARS,
                team_rewards=TEAM_REWARDS, rows=ROWS, report_context=report_context)
