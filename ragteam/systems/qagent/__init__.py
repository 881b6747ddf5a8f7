"""QAgent (Sec. 3): one plan-search-reflect agent (Table 5's loop, `ragteam.systems.qagent.roles`, rolled out by
`ragteam.systems.qagent.workflow.run_qagent`) feeding a frozen generator; trained by multi-turn GRPO in two stages
(`ragteam.systems.qagent.train`: stage 1 Eq. 7, stage 2 Eq. 8-10, `ragteam.systems.qagent.rewards`); its oracle player
writes the agent's turns from the gold hops for the format warm-up.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ragteam.agents.grammars import text
from ragteam.config import parse_section
from ragteam.llm import Messages
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import TeamReward
from ragteam.systems.qagent import roles as Q
from ragteam.systems.qagent.rewards import qagent_reward_stage1, qagent_reward_stage2, qagent_rewards_stage1
from ragteam.systems.qagent.train import QAgentTrainParams, stage_ppo, train_qagent
from ragteam.systems.qagent.workflow import GENERATOR_ROLE, ROLE, QAgentConfig, agent_sampling, knowledge, run_qagent
from ragteam.systems.spec import RowKind, System
from ragteam.train.joint.system import JointSystem
from ragteam.warmup.gold import Gold
from ragteam.warmup.oracle import OracleSystem, hop_of_query, query_forms, visible_fact

# ---- training: the joint trainer's adapter --------------------------------------------------------------------------

def qagent_system(params: dict[str, Any], retriever: Retriever, stage: str = "stage1", generator=None
                  ) -> JointSystem:
    """QAgent: one agent, G trajectories per question, each one sample with <information> / retry tokens masked,
    group-normalised advantages; stage 1 Eq. 7, stage 2 Eq. 8-10 with `generator` (a Team whose answer_agent is the
    frozen G). Two stages: stages.train_joint runs them through `train_qagent` (`System.train_stages`)."""
    from ragteam.systems.qagent.train import qagent_system as build

    cfg = parse_section(params, "qagent", QAgentConfig)
    tp = parse_section(params, "joint.qagent", QAgentTrainParams)
    return build(cfg, tp, retriever, stage, generator)


REWARD_TEXT = ("QAgent, one reward per trajectory, group-normalised over its question's G rollouts: stage 1 "
               "1{r_fmt = 1}·EM_s(A*, Â) (Eq. 7), stage 2 EM(A*, G(q, K)) + hit_weight·Hit(τ, A*) (Eq. 8-10, "
               "frozen generator G over the deduplicated passages K; non-strict EM = G's answer contains a gold "
               "answer as whole tokens, Hit = a passage of K does). A trajectory cut at max_seq_len keeps its "
               "place in its group's statistics but does not train (its loss is masked).")


# ---- evaluation: its rows' team reward (ragteam.rewards.team) -------------------------------------------------------

def generator_answer(ep: Episode) -> str:
    """What stage 2's reward reads as G(q, K) of a plug-in episode: its generator call's answer, or "" where that
    call is malformed or was resampled (the stub it replaced did not parse)."""
    gen = [c for c in ep.calls if c.role == GENERATOR_ROLE]
    if not gen:
        raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): a plug-in QAgent episode without its "
                         f"generator call ({GENERATOR_ROLE})")
    g = gen[-1]
    if g.format_error is not None or "resampled" in g.meta:
        return ""
    return g.parsed or ""


def qagent_team_reward(ep: Episode, plugin: bool, hit_weight: float, passage_words: int | None) -> float:
    """Eq. 7 for an end-to-end QAgent episode, Eq. 8-10 for a plug-in one (G(q, K): `generator_answer`)."""
    if not plugin:
        return float(qagent_reward_stage1(ep))
    return float(qagent_reward_stage2(generator_answer(ep), knowledge(ep), ep.golden_answers, hit_weight,
                                      passage_words))


def hit_weight(cfgs) -> float:
    """Eq. 10's Hit weight, a training param (params.yaml `joint.qagent.hit_weight`, validated by
    QAgentTrainParams; its default where unset), read from the `joint` section evaluation keeps (WorkflowConfigs)."""
    own = (cfgs.joint.get("qagent") or {}).get("hit_weight")
    field = QAgentTrainParams.model_fields["hit_weight"]
    return field.default if own is None else QAgentTrainParams(hit_weight=own).hit_weight


# `qagent` rows: Eq. 7; `qagent_plugin` rows: Eq. 8-10 with hit_weight joint.qagent.hit_weight, whose generator G is
# an answering role the answer fallback serves
TEAM_REWARDS = {
    "qagent": TeamReward(lambda ep, cfgs: qagent_team_reward(ep, False, hit_weight(cfgs), cfgs.qagent.passage_words)),
    "qagent_plugin": TeamReward(lambda ep, cfgs: qagent_team_reward(ep, True, hit_weight(cfgs),
                                                                    cfgs.qagent.passage_words), resampled_ok=True),
}


# ---- the guided-decoding grammars of its `qagent_grammar` rows (ragteam.agents.grammars) ----------------------------

GRAMMARS: dict[str, str] = {
    # one turn: a reflection (the parser wants one after an <information> block; a role's regex cannot see the
    # state, so it is optional), then either the answer or a plan and 1..MAX_QUERIES queries
    ROLE: rf"(<reflection>{text(100)}</reflection>\n)?(<answer>{text(40)}</answer>|<plan>{text(130)}"
          rf"</plan>\n<search>\n<query>{text(50)}</query>\n(<query>{text(50)}</query>\n)"
          rf"{{0,{Q.MAX_QUERIES - 1}}}</search>)",
}


# ---- the warm-up's oracle player ----------------------------------------------------------------------------------
# Output forms: Table 5's loop (`ragteam.systems.qagent.roles.QAGENT_PROMPT`): `<reflection>` after every <information>,
# `<plan>` before every `<search>` of 1..max_queries `<query>` blocks, `<answer>` at the end; accepted by
# `qagent.parse_turn`.

_INFO = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def _qagent_trajectory(messages: Messages) -> str:
    return messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""


def qagent_turn(gold: Gold, messages: Messages, max_queries: int) -> str:
    """One QAgent turn from the trajectory so far (the continued assistant message):
    - a hop is found when an <information> block shows its fact sentence (`_visible_fact`);
    - after an <information> block, a `<reflection>` restating the facts it showed, each as its `Hop.statement`
      (the shortest form that carries it: the per-turn budget also holds the plan and up to 3 queries), and
      naming the sub-questions it did not answer;
    - every hop found: `<answer>golden answer</answer>` (Eq. 7's strict EM = 1);
    - else search the hops not found whose entity is known (named by the question or by a found hop), each by its
      first untried query form, at most `max_queries`, after a `<plan>` listing their sub-questions;
    - nothing left to try: `<answer>unknown</answer>` (the trace is incomplete and the builder drops it)."""
    traj = _qagent_trajectory(messages)
    blocks = _INFO.findall(traj)
    docs = [line for b in blocks for line in b.splitlines()]
    found = {i for i in range(len(gold.hops)) if visible_fact(gold, i, docs)}
    tried = set(re.findall(r"<query>(.*?)</query>", traj))
    head = ""
    if traj.rstrip().endswith("</information>"):
        last = blocks[-1].splitlines()
        facts = [h.statement for i, h in enumerate(gold.hops) if visible_fact(gold, i, last)]
        searched = re.findall(r"<query>(.*?)</query>", traj[traj.rfind("<search>"):])
        missed = [gold.hops[hop_of_query(gold, q)].question for q in searched
                  if hop_of_query(gold, q) not in found]
        said = " ".join(facts + [f"No result answers: {q}" for q in missed])
        head = f"<reflection>{said}</reflection>\n"
    if len(found) == len(gold.hops):
        return f"{head}<answer>{gold.answer}</answer>"
    todo = []
    for i, h in enumerate(gold.hops):
        dep = gold.depends_on(i)
        untried = [q for q in query_forms(h) if q not in tried]
        if i not in found and (dep is None or dep in found) and untried:
            todo.append((h, untried[0]))
    todo = todo[:max_queries]
    if not todo:
        return f"{head}<answer>unknown</answer>"
    plan = " ".join(h.question for h, _ in todo)
    queries = "".join(f"<query>{q}</query>\n" for _, q in todo)
    return f"{head}<plan>{plan}</plan>\n<search>\n{queries}</search>"


def qagent_parser(messages: Messages, max_queries: int) -> Callable[[str], Any]:
    after = _qagent_trajectory(messages).rstrip().endswith("</information>")
    return lambda t: Q.parse_turn(t, after_information=after, max_queries=max_queries)



def qagent_oracle(params: dict[str, Any]) -> OracleSystem:
    cfg = parse_section(params, "qagent", QAgentConfig)

    def incomplete(ep: Episode) -> str | None:
        bad = [c.meta.get("turn") for c in ep.calls if c.format_error is not None]
        if bad:
            return f"format error in turn {bad[0]}"
        if ep.meta.get("stop_reason") != "answer":
            return f"no answer within max_turns {cfg.max_turns}"
        return None if ep.calls[-1].reward == 1.0 else "Eq. 7 reward below 1"

    return OracleSystem(
        name="qagent", roles=(ROLE,),
        replies=lambda gold: {ROLE: lambda m: qagent_turn(gold, m, cfg.max_queries)},
        run=lambda rows, team, retriever: run_qagent(rows, team, retriever, cfg, plugin=False, system="qagent"),
        annotate=qagent_rewards_stage1, incomplete=incomplete,
        parser=lambda role, m: qagent_parser(m, cfg.max_queries), sampling=lambda role, s: agent_sampling(s),
        # module paths in `describe` are historical identifiers (pre-package), kept so that model hashes stay the same
        describe={"workflow": "ragteam.agents.qagent_workflow.run_qagent (end to end)", "reward": "Eq. 7",
                  "qagent": cfg.model_dump()})

# ---- evaluation: its rows -------------------------------------------------------------------------------------------

def _has_checkpoint(name: str, spec, agents) -> str | None:
    """A row with trained agents needs the trained QAgent, unless its role stays on the base model."""
    if spec.trained_agents and ROLE not in spec.base_roles and ROLE not in agents:
        return (f"systems.{name}: trained_agents needs agents.qagent (the trained QAgent, e.g. "
                f"models/agents/qagent from train_joint@qagent), or base_roles: [qagent]")
    return None


def _row(plugin: bool) -> RowKind:
    return RowKind(roles=(ROLE, GENERATOR_ROLE) if plugin else (ROLE,), family="QAgent", check=_has_checkpoint,
                   run=lambda rows, team, retriever, cfgs, spec, name: run_qagent(rows, team, retriever, cfgs.qagent,
                                                                                  plugin=plugin, system=name))


# end to end, and the plug-in mode (the frozen generator answers from what the agent found)
ROWS = {"qagent": _row(False), "qagent_plugin": _row(True)}




def report_context(cfgs, base_model: str, used: set[str], lj_all: bool) -> dict[str, str]:
    """The report's QAgent line, where a row is QAgent's (end to end or plug-in)."""
    if not used & set(ROWS):
        return {}
    q = cfgs.qagent
    return {"QAgent": f"max_turns {q.max_turns}, max_queries {q.max_queries}, top_k {q.top_k} per query, "
                      f"passage_words {q.passage_words}"}


SYSTEM = System(name="qagent", section="qagent", config=QAgentConfig, train_params=QAgentTrainParams,
                joint=qagent_system, reward_text=REWARD_TEXT, oracle=qagent_oracle, stages=("stage1", "stage2"),
                stage_ppo=stage_ppo, train_stages=train_qagent, grammars=GRAMMARS,
                team_rewards=TEAM_REWARDS, rows=ROWS, agent_roles=(ROLE,), report_context=report_context)
