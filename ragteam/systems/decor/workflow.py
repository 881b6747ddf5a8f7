"""DECOR inference (paper Algorithm 1), all questions advancing together.

    M_0 = {}, t = 1
    while t <= T_max:
        a_t = π_plan(q, M_{t-1}, q_<t)               Planner (A.1); <search>None</search> = STOP -> break
        D_t = Retrieve(a_t, k)                         one batch_search over every searching episode
        e_t = π_filt(a_t, D_t)                         Filter (A.2): one evidence paragraph
        if |M_{t-1}| + |e_t| > L_max:                  memory compression by a frozen model (Alg. 1 line 14)
            M_{t-1} = Summarize(M_{t-1})
        M_t = M_{t-1} + {(a_t, e_t)}
    a_final = π_ans(q, M_T)                            Answerer (A.3)

Every step (planner, retrieval, filter, summarizer, answerer) is one batched call over all episodes at that step;
every model call is an AgentCall of its Episode. The Planner sees only the question and the memory (which carries
every past query), never raw passages; the Answerer sees only the question and M_T.

Format errors: with `truncate_on_format_error` (training rollouts, Sec. 4.3) a malformed Planner / Filter /
Answerer output ends its episode at once (no further calls, no answer); the reward's format gate then gives -1.
Without it (evaluation; the paper does not say what inference does) the role's fallback in `ragteam.systems.decor.roles`
applies and the episode goes on. A summarizer failure never truncates (it is not the policy): the memory is kept.

Unstated in the paper and chosen here: the whole of M_{t-1} is summarised (Alg. 1 line 14; the text says "earliest
entries") into one entry that keeps the condensed queries, so the Planner still sees q_<t; |M| is counted in
whitespace tokens of the rendered memory (`decor.memory_words`), because the Engine interface has no tokenizer.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

import ragteam.systems.decor.roles as decor
from ragteam.agents.core import finish_episode, llm_step, new_episode, retrieve_step
from ragteam.config import Strict
from ragteam.llm import Team
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.train.decor_adv import DynamicSamplingConfig


class DecorRewardConfig(Strict):
    """Reward weights (Sec. 4.3)."""

    lam: float = Field(0.5, ge=0.0, le=1.0)       # λ in Eq. 2: R_team = λ·F1 + (1 − λ)·R_LJ (paper 0.5)
    alpha: float = Field(0.6, ge=0.0, le=1.0)     # α in Eq. 3 (paper 0.6)
    beta: float | None = Field(None, ge=0.0)      # β in Eq. 3; None = 1 − α, as the paper sets it
    format_penalty: float = -1.0                  # R_total of a trajectory failing the format gate (paper −1)

    @property
    def beta_value(self) -> float:
        return 1.0 - self.alpha if self.beta is None else self.beta


class DecorConfig(Strict):
    """The `decor` section of params.yaml: inference (Algorithm 1), the judge, rewards and the estimator's knobs."""

    t_max: int = Field(4, ge=1)                   # T_max, search turns (paper 4)
    top_k: int = Field(5, ge=1)                   # passages per search (paper 5; Table 2: 3 / 5 / 10)
    passage_words: int | None = Field(None, ge=1)  # clip each passage in the Filter prompt (None: whole passage)
    l_max: int = Field(4096, ge=1)                # L_max memory budget, in whitespace tokens (paper 4096 tokens)
    summarizer_model: str | None = None           # frozen memory summarizer; None = llm.model (the base model)
    judge: Literal["rules", "llm"] = "rules"      # R_LJ / R_role / the LJ metric: offline rules or Appendix B prompts
    judge_model: str | None = None                # judge: llm -> this checkpoint; None = llm.model
    reward: DecorRewardConfig = DecorRewardConfig()
    group_size: int = Field(8, ge=1)              # G trajectories per question (paper 8)
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()

    def frozen_roles(self) -> dict[str, str]:
        """role -> checkpoint for the frozen helper roles that do not run on the base model."""
        out = {}
        if self.summarizer_model:
            out[decor.SUMMARIZER] = self.summarizer_model
        if self.judge_model:
            out[JUDGE_ROLE] = self.judge_model
        return out


JUDGE_ROLE = "decor_judge"


def run_decor(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: DecorConfig, system: str = "decor",
              truncate_on_format_error: bool = False) -> list[Episode]:
    """Answer every row ({"id","question","golden_answers"[, "metadata"]}) with DECOR; one Episode each.

    Episode.meta: `turns` ([{turn, query, docs, evidence}]), `memory` (M_T), `rounds` (T, searches made),
    `stop_reason` (planner_stop | t_max | format_error), `truncated` ({role, turn} or absent) and, when the row
    has them, `supporting_titles` (for the rule judge).
    """
    eps = [new_episode(r, system) for r in rows]
    for ep, r in zip(eps, rows):
        titles = (r.get("metadata") or {}).get("supporting_titles")
        if titles:
            ep.meta["supporting_titles"] = list(titles)
    memory: list[list[decor.MemoryEntry]] = [[] for _ in eps]
    turns: list[list[dict]] = [[] for _ in eps]
    stop = {i: "t_max" for i in range(len(eps))}
    truncated: dict[int, dict] = {}

    def fail(i: int, role: str, turn: int | None) -> None:
        truncated[i] = {"role": role, "turn": turn}
        stop[i] = "format_error"

    active = list(range(len(eps)))
    for t in range(1, cfg.t_max + 1):
        if not active:
            break
        # Planner: o_t^plan = {q, M_{t-1}, q_<t}
        calls = llm_step(team, decor.PLANNER, [eps[i] for i in active],
                         [decor.planner_messages(eps[i].question, memory[i]) for i in active], decor.parse_planner,
                         turn=t)
        searching, queries = [], []
        for i, c in zip(active, calls):
            c.meta["history"] = decor.render_memory(memory[i])
            if c.format_error is not None:
                if truncate_on_format_error:
                    fail(i, decor.PLANNER, t)
                    continue
                c.meta["fallback"] = decor.fallback_planner(c.response, eps[i].question, t)
            action = c.parsed if c.format_error is None else c.meta["fallback"]
            if action["action"] == "stop":
                stop[i] = "planner_stop"
                continue
            searching.append((i, c))
            queries.append(action["query"])
        # D_t = Retrieve(a_t): one batched search
        hits = retrieve_step(retriever, [eps[i] for i, _ in searching], queries, cfg.top_k)
        docs_text = []
        for (i, c), q, hs in zip(searching, queries, hits):
            ids = [h.id for h in hs]
            eps[i].queries.append(q)
            eps[i].retrieved_ids.append(ids)
            c.retrieved_ids = ids
            turns[i].append({"turn": t, "query": q, "docs": [{"id": h.id, "contents": h.contents} for h in hs],
                             "evidence": None})
            docs_text.append(decor.render_docs(hs, cfg.passage_words))
        # Filter: o_t^filt = {q_search, D_t}
        fcalls = llm_step(team, decor.FILTER, [eps[i] for i, _ in searching],
                          [decor.filter_messages(q, d) for q, d in zip(queries, docs_text)], decor.parse_filter, turn=t)
        kept = []
        for (i, _), q, d, c in zip(searching, queries, docs_text, fcalls):
            c.meta.update(search_query=q, retrieval_result=d)
            if c.format_error is not None:
                if truncate_on_format_error:
                    fail(i, decor.FILTER, t)
                    continue
                c.meta["fallback"] = decor.fallback_filter(c.response)
            kept.append((i, q, c.parsed if c.format_error is None else c.meta["fallback"]))
        # Alg. 1 lines 13-14: compress M_{t-1} when adding e_t would exceed L_max
        over = [(i, q, e) for i, q, e in kept
                if memory[i] and decor.memory_words(memory[i]) + len(e.split()) > cfg.l_max]
        scalls = llm_step(team, decor.SUMMARIZER, [eps[i] for i, _, _ in over],
                          [decor.summarizer_messages(memory[i]) for i, _, _ in over], decor.parse_summary, turn=t)
        for (i, _, _), c in zip(over, scalls):
            c.meta["memory_words"] = decor.memory_words(memory[i])
            if c.format_error is not None:
                c.meta["fallback"] = "memory kept unchanged"
                continue
            memory[i] = [decor.MemoryEntry(tuple(q for m in memory[i] for q in m.queries), c.parsed, summary=True)]
        # Alg. 1 line 16: M_t = M_{t-1} ∪ {(q_search, e_t)}
        for i, q, e in kept:
            memory[i].append(decor.MemoryEntry((q,), e))
            turns[i][-1]["evidence"] = e
        active = [i for i, _, _ in kept]

    # Answerer: o_T^ans = {q, M_T}, for every episode not truncated
    answering = [i for i in range(len(eps)) if i not in truncated]
    acalls = llm_step(team, decor.ANSWERER, [eps[i] for i in answering],
                      [decor.answerer_messages(eps[i].question, memory[i]) for i in answering], decor.parse_answerer)
    for i, c in zip(answering, acalls):
        c.meta["history"] = decor.render_memory(memory[i])
        if c.format_error is not None:
            if truncate_on_format_error:
                fail(i, decor.ANSWERER, None)
                continue
            c.meta["fallback"] = decor.fallback_answerer(c.response)
        eps[i].final_answer = c.parsed if c.format_error is None else c.meta["fallback"]
    for i, ep in enumerate(eps):
        if ep.final_answer is None:
            ep.final_answer = ""
        ep.meta.update(turns=turns[i], memory=[m.to_dict() for m in memory[i]], rounds=len(turns[i]),
                       stop_reason=stop[i])
        if i in truncated:
            ep.meta["truncated"] = truncated[i]
        finish_episode(ep)
    return eps
