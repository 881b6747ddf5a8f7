"""Retrieval debate (DRAG, Hu et al. 2025) with the MAPS Appendix B prompts: a baseline, and MAPS's data synthesizer.

Each round, over all episodes still debating (one batched call per role):
    proponent argues the pool is sufficient and tries an answer;
    opponent challenges it and ends with `Query Expansion: [New Query]` or `Concede`;
    moderator (only where the opponent asked for an expansion) names the winner.
Opponent wins -> its query is retrieved into the pool and the debate goes on; proponent wins or the opponent
concedes -> the debate ends. At most `max_rounds` rounds. The pool only grows, so the snapshot at the end of round r
is its first `snapshots[r]` queries: `debate_snapshots(episode)` rebuilds every (query pool, chunks) sample.
With `answer=True` (the baseline) the MAPS answer prompt answers from the final pool with the same backbone.
"""
from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from ragteam.agents import maps
from ragteam.agents.core import (QueryPool, add_to_pool, episode_pool, finish_episode, llm_step, new_episode,
                                 retrieve_step)
from ragteam.config import Strict
from ragteam.llm import Team
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever


class DebateConfig(Strict):
    """`maps.debate` in params.yaml."""

    max_rounds: int = Field(3, ge=1)          # paper: at most 3 rounds
    top_k: int = Field(3, ge=1)               # paper: 3 for the first 6000 synthesis questions, 5 for the rest
    max_chunks: int = Field(20, ge=1)
    passage_words: int | None = Field(None, ge=1)


def run_debate(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: DebateConfig, *, answer: bool = True,
               system: str) -> list[Episode]:
    eps = [new_episode(r, system) for r in rows]
    pools = [QueryPool() for _ in eps]
    render = lambda i: pools[i].render(cfg.passage_words)  # noqa: E731
    for i, hits in enumerate(retrieve_step(retriever, eps, [e.question for e in eps], cfg.top_k)):
        add_to_pool(eps[i], pools[i], eps[i].question, hits, cfg.max_chunks)
    snapshots = [[1] for _ in eps]
    stop = {i: "round_budget" for i in range(len(eps))}
    rounds = {i: 0 for i in range(len(eps))}
    active = list(range(len(eps)))
    for rnd in range(1, cfg.max_rounds + 1):
        for i in [i for i in active if pools[i].n_chunks >= cfg.max_chunks]:
            stop[i] = "evidence_cap"
        active = [i for i in active if pools[i].n_chunks < cfg.max_chunks]
        if not active:
            break
        for i in active:
            rounds[i] = rnd
        at = [eps[i] for i in active]
        pro = llm_step(team, "proponent", at, [maps.proponent_messages(eps[i].question, render(i)) for i in active],
                       maps.parse_proponent, round=rnd)
        opp = llm_step(team, "opponent", at, [maps.opponent_messages(eps[i].question, render(i)) for i in active],
                       maps.parse_opponent, round=rnd)
        contested = []
        for i, p, o in zip(active, pro, opp):
            if o.format_error is not None:
                o.meta["fallback"] = "concede"  # fallback: see maps.py
            if o.parsed and o.parsed["action"] == "expand":
                contested.append((i, p, o))
            else:
                stop[i] = "opponent_conceded"
        verdicts = llm_step(team, "moderator", [eps[i] for i, _, _ in contested],
                            [maps.moderator_messages(eps[i].question, render(i), p.response, o.response)
                             for i, p, o in contested], maps.parse_moderator, round=rnd)
        expand = []
        for (i, _, o), v in zip(contested, verdicts):
            winner = v.parsed if v.format_error is None else maps.PROPONENT  # fallback: see maps.py
            if v.format_error is not None:
                v.meta["fallback"] = winner
            if winner == maps.OPPONENT:
                expand.append((i, o))
            else:
                stop[i] = "proponent_won"
        hits = retrieve_step(retriever, [eps[i] for i, _ in expand], [o.parsed["query"] for _, o in expand],
                             cfg.top_k)
        for (i, o), h in zip(expand, hits):
            add_to_pool(eps[i], pools[i], o.parsed["query"], h, cfg.max_chunks, call=o)
            snapshots[i].append(len(pools[i].queries))
        active = [i for i, _ in expand]

    if answer:
        calls = llm_step(team, "answer_agent", eps, [maps.answer_messages(e.question, render(i))
                                                      for i, e in enumerate(eps)], maps.parse_answer,
                         continue_if=maps.is_stub)
        for ep, c in zip(eps, calls):
            ep.final_answer = c.parsed if c.format_error is None else ""
    for i, ep in enumerate(eps):
        ep.meta.update(rounds=rounds[i], stop_reason=stop[i], snapshots=snapshots[i])
        finish_episode(ep, pools[i])
    return eps


def debate_snapshots(ep: Episode) -> list[QueryPool]:
    """The (query pool, chunks) at the end of every debate round of `ep`, first the initial retrieval."""
    pool = episode_pool(ep)
    return [pool.prefix(n) for n in ep.meta["snapshots"]]
