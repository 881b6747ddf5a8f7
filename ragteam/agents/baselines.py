"""Baselines of MAPS Table 1, as FlashRAG runs them: native generation, standard RAG, Iter-RetGen.

Prompts are FlashRAG's default templates (`flashrag/prompt/base_prompt.py`): the reference block is
`Doc i(Title: <title line>) <text>`. Iter-RetGen follows FlashRAG's `ITERRETGENPipeline` (Shao et al. 2023):
iteration 0 retrieves with the question, iteration t > 0 with `question + " " + previous generation`, and each
iteration answers from its own retrieval; the last generation is the prediction. One role, `generator`.
(DRAG is `ragteam.agents.debate.run_debate`; "MAPS with an agent replaced" is `run_maps` with a Team whose role
points at the base model.)
"""
from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from ragteam.agents.core import LONG_ANSWER, clip_words, finish_episode, llm_step, new_episode, retrieve_step
from ragteam.agents.ircot import IRCoTConfig
from ragteam.agents.sure import SuReConfig
from ragteam.agents.answer import is_stub, parse_answer
from ragteam.config import Strict
from ragteam.llm import Messages, Team
from ragteam.records import Episode
from ragteam.retrieval.base import Hit, Retriever

NATIVE_SYSTEM = ("Answer the question based on your own knowledge. Only give me the answer and do not output any "
                 "other words.")
RAG_SYSTEM = ("Answer the question based on the given document. Only give me the answer and do not output any other "
              "words.\nThe following are given documents.\n\n{reference}")
USER = "Question: {question}"
ROLE = "generator"


class BaselineConfig(Strict):
    """`eval.baselines` in params.yaml."""

    top_k: int = Field(3, ge=1)               # passages for standard RAG and each Iter-RetGen iteration
    iterations: int = Field(3, ge=1)          # Iter-RetGen iterations (FlashRAG default 3)
    passage_words: int | None = Field(None, ge=1)
    ircot: IRCoTConfig = IRCoTConfig()        # IRCoT (ragteam.agents.ircot)
    sure: SuReConfig = SuReConfig()           # SuRe (ragteam.agents.sure)


def reference(hits: Sequence[Hit], passage_words: int | None = None) -> str:
    lines = []
    for i, h in enumerate(hits, start=1):
        title_line = h.contents.split("\n", 1)[0]  # FlashRAG keeps the title's quotes
        lines.append(f"Doc {i}(Title: {title_line}) {clip_words(h.text, passage_words)}\n")
    return "".join(lines)


def native_messages(question: str) -> Messages:
    return [{"role": "system", "content": NATIVE_SYSTEM}, {"role": "user", "content": USER.format(question=question)}]


def rag_messages(question: str, hits: Sequence[Hit], passage_words: int | None = None) -> Messages:
    return [{"role": "system", "content": RAG_SYSTEM.format(reference=reference(hits, passage_words))},
            {"role": "user", "content": USER.format(question=question)}]


def _finish(eps: list[Episode], calls) -> list[Episode]:
    for ep, c in zip(eps, calls):
        ep.final_answer = c.parsed if c.format_error is None else ""
        finish_episode(ep)
    return eps


def run_native(rows: Sequence[dict], team: Team, *, system: str) -> list[Episode]:
    eps = [new_episode(r, system) for r in rows]
    return _finish(eps, llm_step(team, ROLE, eps, [native_messages(e.question) for e in eps], parse_answer,
                                 continue_if=is_stub))


def run_standard_rag(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: BaselineConfig,
                     *, system: str) -> list[Episode]:
    eps = [new_episode(r, system) for r in rows]
    hits = retrieve_step(retriever, eps, [e.question for e in eps], cfg.top_k)
    for ep, h in zip(eps, hits):
        ep.queries.append(ep.question)
        ep.retrieved_ids.append([x.id for x in h])
    calls = llm_step(team, ROLE, eps, [rag_messages(e.question, h, cfg.passage_words) for e, h in zip(eps, hits)],
                     parse_answer, continue_if=is_stub)
    return _finish(eps, calls)


def run_iter_retgen(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: BaselineConfig,
                    *, system: str) -> list[Episode]:
    eps = [new_episode(r, system) for r in rows]
    prev: list[str] = []
    calls = []
    for it in range(cfg.iterations):
        queries = [e.question if it == 0 else f"{e.question} {p}".strip() for e, p in zip(eps, prev or [""] * len(eps))]
        hits = retrieve_step(retriever, eps, queries, cfg.top_k)
        for ep, q, h in zip(eps, queries, hits):
            ep.queries.append(q)
            ep.retrieved_ids.append([x.id for x in h])
        calls = llm_step(team, ROLE, eps, [rag_messages(e.question, h, cfg.passage_words) for e, h in zip(eps, hits)],
                         parse_answer, continue_if=is_stub, iteration=it)
        # FlashRAG feeds the raw generation into the next query
        prev = [c.response.strip() for c in calls]
        for c, h in zip(calls, hits):
            c.retrieved_ids = [x.id for x in h]
    return _finish(eps, calls)

# ---- the longest outputs each role must be able to write (budgets: ragteam.agents.core, tests/test_budgets.py) ----
# The answer alone, as the prompts ask.

LONGEST_OUTPUTS: dict[str, tuple[str, ...]] = {ROLE: (LONG_ANSWER,)}
