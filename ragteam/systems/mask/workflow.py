"""M-ASK inference and training rollouts (paper §3.2.3, Algorithm 1), all questions advancing together.

    K_0 <- Planning(q)                         a_0 = K_0.predicted_answer (parametric knowledge only)
    for t = 1 .. max_turns:
        Search(K_{t-1}, history) -> <search>q'</search> | <end>          <end>: stop
        D <- retrieve(q', top_k)                                          one batch_search over every episode
        E <- Summary(q', D)                                               <evidence>E</evidence>
        op <- Update(K_{t-1}, q', E); K_t = K_{t-1} with (q', E) written at t_i (Update) or appended (Add)
        a_t <- Answer(K_t)                                                training mode only (Alg. 1)
    final answer: Answer(K) once at the end (inference, §3.3); in training mode the last a_t (an episode that ended
    before any Answer call gets one Answer call on its K, so every episode ends with an Answer-agent answer).

Every step is one engine call over all episodes waiting at it. Every call records `meta["turn"]` (0 = Planning)
and, for Planning / Answer, `meta["answer"]` (the a_t the turn-level rewards score); Search calls record `query` or
`end`; the episode records `meta.workflow.turns`, `.searches` and `stop_reason` (`end` | `max_turns`), the final K in
`meta["knowledge"]`, and `meta["answered_every_turn"]` (training mode or `answer_every_turn`: the episode has the a_t
of every turn, so its turn-level rewards are defined; the final answer is the same either way, the Answer call on the
last K). Malformed outputs follow the fallbacks documented in `ragteam.systems.mask.roles`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

import ragteam.systems.mask.roles as M
from ragteam.agents.core import finish_episode, llm_step, new_episode, retrieve_step
from ragteam.config import Strict
from ragteam.llm import Team
from ragteam.records import AgentCall, Episode
from ragteam.retrieval.base import Retriever


class MaskConfig(Strict):
    """The `mask` section of params.yaml: M-ASK inference, also used by the joint trainer's rollouts."""

    max_turns: int = Field(5, ge=1)              # T_max (not in the paper; the official code: 5)
    top_k: int = Field(5, ge=1)                  # passages per search (paper case study and Vanilla RAG: 5)
    passage_words: int | None = Field(None, ge=1)  # clip passages in the Summary prompt (None: whole ~100 words)
    format_penalty: float = Field(1.0, ge=0)     # subtracted from a malformed call's reward (official code: 1.0)
    # K_0: "plan" = the Planning agent's sub-questions (paper §3.2); "question" = one step (question, a_0), as the
    # official code resets K_0 after rewarding Planning (and as the Table 6 case study shows)
    initial_trajectory: Literal["plan", "question"] = "plan"
    answer_every_turn: bool = False              # inference: Answer once at the end (§3.3); training forces True


def _answer_of(call: AgentCall) -> str:
    if call.format_error is None:
        return call.parsed
    fb = M.answer_fallback(call.response)
    call.meta["fallback"] = fb
    return fb


def _initial_state(question: str, call: AgentCall, cfg: MaskConfig) -> tuple[M.KnowledgeState, str]:
    if call.format_error is None:
        a0 = call.parsed["predicted_answer"]
        steps = [M.Step(q, a) for q, a in call.parsed["steps"]]
    else:
        a0 = M.answer_fallback(call.response)
        steps = []
        call.meta["fallback"] = {"trajectory": [[question, M.UNKNOWN]], "predicted_answer": a0}
    if cfg.initial_trajectory == "question" or not steps:
        steps = [M.Step(question, a0 or M.UNKNOWN)]
    return M.KnowledgeState(question, steps, a0), a0


def run_mask(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: MaskConfig, system: str = "mask",
             training: bool = False) -> list[Episode]:
    """Answer every row ({"id","question","golden_answers"}) with the five M-ASK agents; one Episode each.

    `training=True` runs the Answer agent after every turn (Algorithm 1), which the turn-level rewards need.
    """
    every_turn = training or cfg.answer_every_turn
    eps = [new_episode(r, system) for r in rows]
    n = len(eps)
    history: list[list[M.SearchRecord]] = [[] for _ in range(n)]
    answered = [False] * n          # has the Answer agent spoken on the current K?
    turns, stop = [0] * n, ["max_turns"] * n

    plans = llm_step(team, M.PLANNING, eps, [M.planning_messages(e.question) for e in eps], M.parse_plan, turn=0)
    states = []
    for e, c in zip(eps, plans):
        k, a0 = _initial_state(e.question, c, cfg)
        c.meta["answer"] = a0
        states.append(k)

    active = list(range(n))
    for t in range(1, cfg.max_turns + 1):
        if not active:
            break
        acts = llm_step(team, M.SEARCH, [eps[i] for i in active],
                        [M.search_messages(states[i], history[i]) for i in active], M.parse_search, turn=t)
        searching, queries = [], []
        for i, c in zip(active, acts):
            if c.format_error is None and c.parsed["action"] == "end":
                c.meta["end"] = True
                stop[i] = "end"
                continue
            q = c.parsed["query"] if c.format_error is None else M.search_fallback(c.response, eps[i].question)
            if c.format_error is not None:
                c.meta["fallback"] = q
            c.meta["query"] = q
            searching.append((i, c))
            queries.append(q)
        active = [i for i, _ in searching]
        if not active:
            break
        hits = retrieve_step(retriever, [eps[i] for i in active], queries, cfg.top_k)
        for (i, c), q, h in zip(searching, queries, hits):
            ids = [x.id for x in h]
            c.retrieved_ids = ids
            eps[i].queries.append(q)
            eps[i].retrieved_ids.append(ids)
            turns[i] = t

        sums = llm_step(team, M.SUMMARY, [eps[i] for i in active],
                        [M.summary_messages(q, h, cfg.passage_words) for q, h in zip(queries, hits)],
                        M.parse_summary, turn=t)
        evidence = []
        for c in sums:
            ev = c.parsed if c.format_error is None else M.NO_USEFUL_INFORMATION
            if c.format_error is not None:
                c.meta["fallback"] = ev
            evidence.append(ev)

        ups = llm_step(team, M.UPDATE, [eps[i] for i in active],
                       [M.update_messages(states[i], q, ev) for i, q, ev in zip(active, queries, evidence)],
                       lambda text: text, turn=t)
        for i, c, q, ev in zip(active, ups, queries, evidence):
            n_steps = len(states[i].thinking_trajectory)
            op = M.parse_update(c.response, n_steps)
            if isinstance(op, M.FormatError):
                c.parsed, c.format_error = None, op.reason
                op = M.UpdateOp("add", n_steps + 1)
                c.meta["fallback"] = op.to_dict()
            else:
                c.parsed = op.to_dict()
            states[i].apply(op, q, ev)
            history[i].append(M.SearchRecord(q, ev))
            answered[i] = False

        if every_turn:
            ans = llm_step(team, M.ANSWER, [eps[i] for i in active],
                           [M.answer_messages(states[i]) for i in active], M.parse_final_answer, turn=t)
            for i, c in zip(active, ans):
                a = _answer_of(c)
                c.meta["answer"] = a
                states[i].predicted_answer = a
                answered[i] = True

    # the final answer: one Answer call on the latest K wherever the Answer agent has not spoken on it yet
    todo = [i for i in range(n) if not answered[i]]
    final = llm_step(team, M.ANSWER, [eps[i] for i in todo], [M.answer_messages(states[i]) for i in todo],
                     M.parse_final_answer, final=True)
    for i, c in zip(todo, final):
        a = _answer_of(c)
        c.meta.update(answer=a, turn=turns[i], final=True)
        states[i].predicted_answer = a
    for i, ep in enumerate(eps):
        ep.final_answer = states[i].predicted_answer
        # per-question figures the evaluation averages (meta["workflow"], as JADE's): M-ASK's efficiency measures
        ep.meta.update(workflow={"turns": turns[i], "searches": len(ep.queries)}, stop_reason=stop[i],
                       knowledge=states[i].to_dict(), history=[[h.query, h.summary] for h in history[i]],
                       answered_every_turn=every_turn)   # the turn-level rewards (Eq. 2-3) are defined on it
        finish_episode(ep)
    return eps
