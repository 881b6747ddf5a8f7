"""M-ASK (Multi-Agent Search and Knowledge, §3): Planning, Search, Summary, Update and Answer on one shared policy,
rolled out by `ragteam.systems.mask.workflow.run_mask` (prompts and parsers: `ragteam.systems.mask.roles`), rewarded
turn by turn (Eq. 2-3, `ragteam.systems.mask.rewards`), trained by joint PPO with GAE within each call, or with
`joint.mask.estimator: group` by each call's reward normalised within its question's rollouts; its oracle player
writes every role's output from the gold hops for the format warm-up.

Credit (DESIGN: a call's return must rise with the quality of its own output): every call carries its own reward
(Eq. 2-3). Summed over the episode (γ = λ = 1) the Answer call of turn t would return F1(a_t) + 3·(F1(a_{t+1}) −
F1(a_t)) + F1(a_{t+1}) + … = 4·F1(a_{t+1}) − 2·F1(a_t) + …, so a better own answer would lower its own return (and
Planning would gain from a wrong a_0): ΔF1 telescopes. The official code makes every call its own verl sample with
the reward on its last token, i.e. GAE within the call (notes m-ask.md §11): `gae_scope="call"`. `joint.mask.estimator:
group` (not the paper's) keeps that per-call credit without the critic: each call's own reward normalised among the
same role's calls at the same turn of its question's `group_size` rollouts (`mask_group_advantages`).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ragteam.agents.grammars import numbered_pairs, text
from ragteam.config import parse_section
from ragteam.llm import Messages
from ragteam.metrics import contains_answer, exact_match
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import TeamReward
from ragteam.systems.mask import roles as M
from ragteam.systems.mask.rewards import annotate_mask, annotate_mask_episode
from ragteam.systems.mask.workflow import MaskConfig, run_mask
from ragteam.systems.spec import RowKind, System
from ragteam.train.joint.params import GroupEstimatorParams
from ragteam.train.joint.system import JointSystem
from ragteam.warmup.gold import Gold
from ragteam.warmup.oracle import OracleSystem, Reply, hop_of_query, prompt_field, query_forms, user_text, visible_fact

# ---- training: the joint trainer's adapter --------------------------------------------------------------------------

def call_group_key(ep: Episode, c) -> tuple:
    """The group an M-ASK call is compared within by `estimator: group`: the same question's rollouts, the same role
    at the same turn (`meta["turn"]`, 0 = Planning), the end-of-episode Answer apart from a turn's Answer."""
    return ep.question_id, c.role, int(c.meta.get("turn", -1)), bool(c.meta.get("final"))


def mask_group_advantages(episodes: Sequence[Episode], eps: float = 1e-4) -> list[list[float | None]]:
    """M-ASK's critic-free estimator (`joint.mask.estimator: group`, not the paper's): each call's own reward (Eq. 2-3
    with the format penalty, as annotated) normalised among the calls of the same role and turn in the G rollouts of
    its question (`call_group_key`), A = (r − μ) / (σ + eps) with the sample σ (`group_normalized`, TRL's GRPO
    convention and the project's ε). It keeps M-ASK's per-call credit (a call's advantage rises with its own reward
    only; summing rewards over the episode would invert it, module docstring) and puts the group's mean where GAE
    within the call puts the critic's value: A = r − V becomes A = (r − μ) / σ. A pool of one call (a turn only one
    rollout reached) or of equal rewards gets A = 0."""
    from ragteam.train.advantages import group_normalized

    flat = [(i, c) for i, ep in enumerate(episodes) for c in ep.calls]
    missing = [(episodes[i].episode_id, c.role) for i, c in flat if c.reward is None]
    if missing:
        raise ValueError(f"mask_group_advantages: call(s) without a reward (annotate first): {missing[:3]}")
    adv = group_normalized([c.reward for _, c in flat], [call_group_key(episodes[i], c) for i, c in flat],
                           std="sample", eps=eps)
    out: list[list[float | None]] = [[] for _ in episodes]
    for (i, _), a in zip(flat, adv):
        out[i].append(a)
    return out



class MaskTrainParams(GroupEstimatorParams):
    """params.yaml `joint.mask`. `estimator: group` gives every call its own reward normalised within its question's
    G rollouts, same role and turn (`mask_group_advantages`); `gae` is the paper's (a critic, GAE within each call)."""


def mask_system(params: dict[str, Any], retriever: Retriever) -> JointSystem:
    """M-ASK: the five roles of `ragteam.systems.mask.roles`, the Answer agent after every turn, turn-level rewards
    (Eq. 2-3) minus `mask.format_penalty` per malformed call; GAE within each call (per-call rewards: see above), or
    with `joint.mask.estimator: group` each call's reward normalised over its question's G rollouts, no critic."""
    cfg = parse_section(params, "mask", MaskConfig)
    # joint.mask, when given (the stage always has it; a caller without it trains the paper's way)
    tp = (parse_section(params, "joint.mask", MaskTrainParams) if "mask" in (params.get("joint") or {})
          else MaskTrainParams())
    # module paths in `describe` are historical identifiers (pre-package), kept so that model hashes stay the same
    describe = {"workflow": "ragteam.agents.mask_workflow.run_mask(training=True)", "mask": cfg.model_dump(),
                "reward": "M-ASK Eq. 2-3 (ragteam.rewards.mask.annotate_mask_episode)"}
    annotate = lambda eps: annotate_mask(eps, cfg.format_penalty)  # noqa: E731
    if tp.estimator == "gae":
        return JointSystem(
            name="mask", roles=M.ROLES,
            rollout=lambda rows, team: run_mask(rows, team, retriever, cfg, system="mask", training=True),
            annotate=annotate,
            gae_scope="call",         # Eq. 2-3 reward each call itself; the official code's per-call GAE
            describe=describe,
        )
    return JointSystem(
        name="mask", roles=M.ROLES,
        # G copies of each question, consecutive; Episode.question_id (the row id) is the group
        rollout=lambda rows, team: run_mask([r for r in rows for _ in range(tp.group_size)], team, retriever, cfg,
                                            system="mask", training=True),
        annotate=annotate, advantage=mask_group_advantages,
        requires={"normalize_advantages": False},   # the group normalisation is the only one (GRPO's)
        describe={**describe, "estimator": f"group of {tp.group_size} rollouts per question",
                  "advantage": "ragteam.train.systems.mask_group_advantages (each call's reward normalised within "
                               "its question's rollouts, same role and turn; no critic)"},
    )



REWARD_TEXT = ("M-ASK turn-level rewards (§3.3): Planning F1(a_0, y) (Eq. 2); Answer F1(a_t, y) (Eq. 2); Search, "
             "Summary and Update of turn t F1(a_t, y) - F1(a_{t-1}, y) (Eq. 3); a Search that outputs <end> 0; "
             "minus mask.format_penalty for a malformed call (official code). Every call is a PPO sample with GAE "
             "within the call (the official code's per-call samples): its return is its own reward.")


# ---- evaluation: its rows' team reward (ragteam.rewards.team) -------------------------------------------------------

def mask_team_reward(ep: Episode, penalty: float) -> float:
    """The mean call reward of an M-ASK episode that answered after every turn (Eq. 2-3, −penalty per malformed
    call); the call rewards are filled in place, as JADE's and DECOR's are by evaluation."""
    if not ep.meta.get("answered_every_turn"):
        raise ValueError(f"episode {ep.episode_id} ({ep.question_id}): M-ASK's turn-level rewards (Eq. 2-3) need the "
                         f"Answer agent after every turn; this episode answered once at the end (set the row's "
                         f"answer_every_turn: true, or mask.answer_every_turn)")
    annotate_mask_episode(ep, penalty)
    return float(sum(c.reward for c in ep.calls) / len(ep.calls))


# a row that answers after every turn (ragteam.eval.evaluate.has_team_reward); the penalty: mask.format_penalty
TEAM_REWARDS = {"mask": TeamReward(lambda ep, cfgs: mask_team_reward(ep, cfgs.mask.format_penalty))}


# ---- the guided-decoding grammars of its `mask_grammar` rows (ragteam.agents.grammars) -------------------------------

GRAMMARS: dict[str, str] = {
    # at most 4 pairs where the format allows MAX_PLAN_STEPS (5): 5 pairs of digit-heavy text overran the
    # 192-token budget (tests/worker), and the default data's chains have at most 4 hops
    M.PLANNING: numbered_pairs(4, text(50), text(20))
    + rf"<predicted_answer>{text(30)}</predicted_answer>",
    M.SEARCH: rf"<search>{text(80)}</search>|<end>",
    M.SUMMARY: rf"<evidence>{text(120)}</evidence>",
    # the prompt's own `t(n+1)` for an Add: valid in every state (the parser reads it as the next step), where a
    # number would have to be the trajectory's length, which a regex cannot know
    M.UPDATE: r"<Update>t[1-9]</Update>|<Add>t\(n\+1\)</Add>",
    M.ANSWER: rf"<predicted_answer>{text(40)}</predicted_answer>",
}


# ---- the warm-up's oracle player ----------------------------------------------------------------------------------
# Output forms: the Planning / Search / Summary / Update / Answer formats of the paper's Appendix C prompts
# (`ragteam.systems.mask.roles`), as accepted by parse_plan, parse_search, parse_summary, parse_update,
# parse_final_answer.


def _mask_history(text: str) -> list[tuple[str, str]]:
    hist = prompt_field(text, "Search history: ", "\n\nOutput only")
    if hist.strip() == M.NO_SEARCHES:
        return []
    out = []
    for line in hist.splitlines():
        m = re.match(r"\d+\. Query: (.*) \| Summary: (.*)$", line)
        if m is None:
            raise ValueError(f"search history line {line!r} is not in render_history's layout")
        out.append((m.group(1), m.group(2)))
    return out


def _mask_steps(trajectory: str) -> list[tuple[str, str]]:
    return [(q, a) for q, a in re.findall(r"^t\d+: Q: (.*?) \| A: (.*)$", trajectory, re.MULTILINE)]


def mask_planning(gold: Gold) -> str:
    """Planning (paper §3.2.1): one `<qi>`/`<ai>` pair per gold hop, the hop's sub-question and sub-answer, and the
    golden answer as a_0, so r_plan = F1(a_0, y) = 1 (Eq. 2, the top of its range)."""
    pairs = "".join(f"<q{i}>{h.question}</q{i}>\n<a{i}>{h.answer}</a{i}>\n"
                    for i, h in enumerate(gold.hops[:M.MAX_PLAN_STEPS], 1))
    return f"{pairs}<predicted_answer>{gold.answer}</predicted_answer>"


def mask_search(gold: Gold, messages: Messages) -> str:
    """Search: the first hop not yet evidenced, by its first untried query form (`query_forms`); a hop whose forms
    all came back without evidence is given up; `<end>` when no hop is left. Reads only the prompt's search
    history (query and summary of every past search)."""
    history = _mask_history(user_text(messages))
    for h in gold.hops:
        tried = {q: s for q, s in history if q in query_forms(h)}
        if any(s != M.NO_USEFUL_INFORMATION for s in tried.values()):
            continue
        untried = [q for q in query_forms(h) if q not in tried]
        if untried:
            return f"<search>{untried[0]}</search>"
    return "<end>"


def mask_summary(gold: Gold, messages: Messages) -> str:
    """Summary: the fact sentence of the searched hop when the (clipped) passages show it whole, else the prompt's
    `No useful information`: evidence the documents in the prompt do not show is never written."""
    text = user_text(messages)
    query = prompt_field(text, "Query: ", "\nCandidate Documents: ")
    docs = re.findall(r"Doc\d+: (.*)", prompt_field(text, "Candidate Documents: ", None))
    i = hop_of_query(gold, query)
    ev = gold.hops[i].fact if visible_fact(gold, i, docs) else M.NO_USEFUL_INFORMATION
    return f"<evidence>{ev}</evidence>"


def mask_update(gold: Gold, messages: Messages) -> str:
    """Update: evidence for a hop whose sub-question is a step of K replaces that step (`<Update>ti</Update>`: K
    keeps the sub-answer, now with its source sentence); anything else is appended (`<Add>t(n+1)</Add>`, numbered),
    and `No useful information` never overwrites a step (the workflow's own fallback rule)."""
    text = user_text(messages)
    steps = _mask_steps(prompt_field(text, "Thinking trajectory: ", "\nNew query: "))
    query = prompt_field(text, "\nNew query: ", "\nEvidence: ")
    evidence = prompt_field(text, "\nEvidence: ", None)
    if evidence != M.NO_USEFUL_INFORMATION:
        sub = gold.hops[hop_of_query(gold, query)].question
        for n, (q, _a) in enumerate(steps, 1):
            if q == sub:
                return f"<Update>t{n}</Update>"
    return f"<Add>t{len(steps) + 1}</Add>"


def mask_answer(gold: Gold, messages: Messages) -> str:
    """Answer: the golden answer (F1 = 1, Eq. 2) when K states it (as a step's answer: K_0 = [(q, a_0)] with
    `mask.initial_trajectory: question`) or states every hop's sub-answer it follows from (a comparison's
    yes / no is written nowhere), else `unkown`."""
    trajectory = prompt_field(user_text(messages), "Thinking trajectory: ", None)
    answers = [a for _q, a in _mask_steps(trajectory)]
    known = (any(exact_match(a, [gold.answer]) for a in answers)
             or all(contains_answer(trajectory, [h.answer]) for h in gold.hops))
    return f"<predicted_answer>{gold.answer if known else M.UNKNOWN}</predicted_answer>"


def mask_replies(gold: Gold) -> dict[str, Reply]:
    return {M.PLANNING: lambda m: mask_planning(gold), M.SEARCH: lambda m: mask_search(gold, m),
            M.SUMMARY: lambda m: mask_summary(gold, m), M.UPDATE: lambda m: mask_update(gold, m),
            M.ANSWER: lambda m: mask_answer(gold, m)}


def mask_top_reward(ep: Episode) -> list[float]:
    """Per call, the highest reward any output of its role could get in the state it acted in (Eq. 2-3): Planning
    and Answer 1; Search / Summary / Update of turn t 1 - F1(a_{t-1}) (F1(a_t) is at most 1); a Search that ends 0.
    With a_0 correct (the oracle's plan) the turn-level ones are 0: no search can raise a correct answer."""
    from ragteam.metrics import f1_score

    answers = {int(c.meta["turn"]): c.meta["answer"] for c in ep.calls
               if c.role in (M.PLANNING, M.ANSWER) and not c.meta.get("final")}
    out = []
    for c in ep.calls:
        if c.role in (M.PLANNING, M.ANSWER):
            out.append(1.0)
        elif c.role == M.SEARCH and c.meta.get("end"):
            out.append(0.0)
        else:
            out.append(1.0 - f1_score(answers[int(c.meta["turn"]) - 1], ep.golden_answers))
    return out


def mask_parser(role: str, messages: Messages) -> Callable[[str], Any]:
    if role == M.UPDATE:
        n = len(_mask_steps(prompt_field(user_text(messages), "Thinking trajectory: ", "\nNew query: ")))
        return lambda t: M.parse_update(t, n)
    return {M.PLANNING: M.parse_plan, M.SEARCH: M.parse_search, M.SUMMARY: M.parse_summary,
            M.ANSWER: M.parse_final_answer}[role]



def mask_oracle(params: dict[str, Any]) -> OracleSystem:
    cfg = parse_section(params, "mask", MaskConfig)

    def incomplete(ep: Episode) -> str | None:
        bad = [c.role for c in ep.calls if c.format_error is not None]
        if bad:
            return f"format error in {bad[0]}"
        if exact_match(ep.final_answer or "", ep.golden_answers) < 1:
            return "final answer not the gold"
        low = [c.role for c, top in zip(ep.calls, mask_top_reward(ep)) if abs(c.reward - top) > 1e-9]
        return f"reward below its top in {low[0]}" if low else None

    return OracleSystem(
        name="mask", roles=M.ROLES, replies=mask_replies,
        run=lambda rows, team, retriever: run_mask(rows, team, retriever, cfg, system="mask", training=True),
        annotate=lambda eps: annotate_mask(eps, cfg.format_penalty), incomplete=incomplete, parser=mask_parser,
        # module paths in `describe` are historical identifiers (pre-package), kept so that model hashes stay the same
        describe={"workflow": "ragteam.agents.mask_workflow.run_mask(training=True)", "mask": cfg.model_dump()})


# ---- evaluation: its rows -------------------------------------------------------------------------------------------

def row_config(spec, cfgs) -> MaskConfig:
    """The `mask` section with the row's `answer_every_turn`, where it sets one."""
    if spec.answer_every_turn is None:
        return cfgs.mask
    return cfgs.mask.model_copy(update={"answer_every_turn": spec.answer_every_turn})


# a row answers after every turn (SystemSpec.answer_every_turn) to get M-ASK's own training reward as its team reward
ROWS = {"mask": RowKind(
    roles=M.ROLES, family="M-ASK", settings=("answer_every_turn",),
    run=lambda rows, team, retriever, cfgs, spec, name: run_mask(rows, team, retriever, row_config(spec, cfgs),
                                                                 system=name),
    has_team_reward=lambda spec, cfgs: row_config(spec, cfgs).answer_every_turn)}


SYSTEM = System(name="mask", section="mask", config=MaskConfig, train_params=MaskTrainParams, joint=mask_system,
                reward_text=REWARD_TEXT, oracle=mask_oracle, grammars=GRAMMARS, team_rewards=TEAM_REWARDS,
                probe_row={"answer_every_turn": True}, rows=ROWS)
