"""MAPS inference (paper Section 3.5, Eq. 8-11), all questions advancing together.

    Q_0, C_0 = R(x, k)                                 Eq. 8   the raw question is the first query
    Q_n+1, C_n+1 = Q_n + R(A_q(x, Q_n, C_n))          Eq. 9   one new query per round
    D = A_j(x, Q_n+1, C_n+1)                           Eq. 10  after every round; stop when sufficient
    y = A_g(x, Q*, C*)                                 Eq. 11

Every step (query agent, retrieval, judge, answer) is one batched call over all episodes still at that step.
With `judge_initial` the judge also decides on the initial pool Q_0, C_0, before any round: the paper's case
studies (Tables 4-5: "Retrieval Round 0 ... Judge Agent: Insufficient Information. (Continue to the next retrieval
round)"), and what the judge is trained on (Algorithm 1 step 6 labels single-retrieval pools); without it a round
always runs at least once. With `fixed_rounds` the judge is skipped and exactly that many rounds run (Table 3). An
episode whose evidence reached `max_chunks` stops retrieving (no judge call: nothing more could be added) and goes
to the answer step.
"""
from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from ragteam.agents import maps
from ragteam.agents.core import QueryPool, add_to_pool, finish_episode, llm_step, new_episode, retrieve_step
from ragteam.agents.debate import DebateConfig
from ragteam.config import Strict
from ragteam.llm import Team
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever


class MapsConfig(Strict):
    """The `maps` section of params.yaml (inference; the debate settings are in `maps.debate`)."""

    max_rounds: int = Field(3, ge=1)          # round budget (paper: 3)
    top_k: int = Field(3, ge=1)               # passages retrieved per query
    fixed_rounds: int | None = Field(None, ge=1)  # run exactly this many rounds, no judge (Table 3)
    max_chunks: int = Field(20, ge=1)         # evidence cap per question (paper: 20)
    judge_initial: bool = True                # the judge also decides on the initial retrieval (module docstring)
    passage_words: int | None = Field(None, ge=1)  # clip each passage to this many words in prompts (None: whole)
    debate: DebateConfig = DebateConfig()


def _same_query(q: str, pool: list[str]) -> bool:
    key = maps.keywords(q, 64).lower()
    return any(maps.keywords(p, 64).lower() == key for p in pool)


def run_maps(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: MapsConfig,
             *, system: str) -> list[Episode]:
    """Answer every row ({"id","question","golden_answers"}) with the three MAPS agents; one Episode each."""
    eps = [new_episode(r, system) for r in rows]
    pools = [QueryPool() for _ in eps]
    render = lambda i: pools[i].render(cfg.passage_words)  # noqa: E731

    # Eq. 8: the question is the first query
    for i, hits in enumerate(retrieve_step(retriever, eps, [e.question for e in eps], cfg.top_k)):
        add_to_pool(eps[i], pools[i], eps[i].question, hits, cfg.max_chunks)

    n_rounds = cfg.fixed_rounds or cfg.max_rounds
    stop = {i: ("fixed_rounds" if cfg.fixed_rounds else "round_budget") for i in range(len(eps))}
    rounds = {i: 0 for i in range(len(eps))}

    def judge(active: list[int], rnd: int) -> list[int]:
        """Eq. 10 on the current pools: the episodes the judge sends to another round."""
        verdicts = llm_step(team, "judge_agent", [eps[i] for i in active],
                            [maps.judge_messages(eps[i].question, render(i)) for i in active], maps.parse_judge,
                            round=rnd)
        still = []
        for i, c in zip(active, verdicts):
            decision = c.parsed if c.format_error is None else maps.INSUFFICIENT  # fallback: see maps.py
            if c.format_error is not None:
                c.meta["fallback"] = decision
            if decision == maps.SUFFICIENT:
                stop[i] = "judge_sufficient"
            else:
                still.append(i)
        return still

    active = list(range(len(eps)))
    if cfg.judge_initial and not cfg.fixed_rounds:
        for i in [i for i in active if pools[i].n_chunks >= cfg.max_chunks]:
            stop[i] = "evidence_cap"
        active = judge([i for i in active if pools[i].n_chunks < cfg.max_chunks], 0)
    for rnd in range(1, n_rounds + 1):
        for i in [i for i in active if pools[i].n_chunks >= cfg.max_chunks]:
            stop[i] = "evidence_cap"
        active = [i for i in active if pools[i].n_chunks < cfg.max_chunks]
        if not active:
            break
        # Eq. 9: the query agent proposes one new query per episode, then one batched retrieval
        calls = llm_step(team, "query_agent", [eps[i] for i in active],
                         [maps.query_messages(eps[i].question, render(i)) for i in active], maps.parse_query,
                         round=rnd)
        queries = []
        for i, c in zip(active, calls):
            q = c.parsed if c.format_error is None else maps.keywords(eps[i].question)  # fallback: see maps.py
            if c.format_error is not None:
                c.meta["fallback"] = q
            if _same_query(q, pools[i].queries):  # the prompt asks for a query different from all existing ones
                c.meta["duplicate_query"] = True
            queries.append(q)
        hits = retrieve_step(retriever, [eps[i] for i in active], queries, cfg.top_k)
        for i, c, q, h in zip(active, calls, queries, hits):
            add_to_pool(eps[i], pools[i], q, h, cfg.max_chunks, call=c)
            rounds[i] = rnd
        if cfg.fixed_rounds:
            continue
        # Eq. 10: the judge decides after every round. Skipped where its verdict cannot change anything: at the
        # evidence cap (nothing more can be added) and after the last budgeted round (the answer comes next anyway).
        at_cap = [i for i in active if pools[i].n_chunks >= cfg.max_chunks]
        for i in at_cap:
            stop[i] = "evidence_cap"
        active = [i for i in active if pools[i].n_chunks < cfg.max_chunks]
        if rnd == n_rounds:  # the budget is spent: a verdict could not change anything
            break
        active = judge(active, rnd)

    # Eq. 11: the answer agent answers from the final pool
    # a lead-in ("Answer:") is continued once before it is read (agents.core.continue_lead_ins)
    answers = llm_step(team, "answer_agent", eps, [maps.answer_messages(e.question, render(i))
                                                    for i, e in enumerate(eps)], maps.parse_answer,
                       continue_if=maps.is_stub)
    for i, (ep, c) in enumerate(zip(eps, answers)):
        ep.final_answer = c.parsed if c.format_error is None else ""
        ep.meta.update(rounds=rounds[i], stop_reason=stop[i])
        finish_episode(ep, pools[i])
    return eps
