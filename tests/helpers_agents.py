"""Helpers for the agent / LLM / eval tests: a scripted engine, small in-memory retrievers, a shared SmolLM2 engine.

Imported by the test modules (`from helpers_agents import ...`); pytest puts tests/ on sys.path (rootdir-relative
test modules without __init__.py).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable

from ragteam.agents import baselines, maps
from ragteam.llm import Completion, Messages, SamplingConfig, find_stop
from ragteam.retrieval.base import Hit
from ragteam.systems.decor import rewards as decor_rewards
from ragteam.systems.decor import roles as decor
from ragteam.systems.jade import roles as jade
from ragteam.systems.mask import roles as mask_agents
from ragteam.systems.qagent import roles as qagent

_ROLE_BY_SYSTEM = [
    (maps.QUERY_AGENT_SYSTEM[:40], "query_agent"), (maps.JUDGE_AGENT_SYSTEM[:40], "judge_agent"),
    (maps.ANSWER_AGENT_SYSTEM[:80], "answer_agent"), (maps.PROPONENT_SYSTEM[:40], "proponent"),
    (maps.OPPONENT_SYSTEM[:40], "opponent"), (maps.MODERATOR_SYSTEM[:40], "moderator"),
    (baselines.NATIVE_SYSTEM[:60], "generator"), (baselines.RAG_SYSTEM[:60], "generator"),
    (jade.PLANNER_SYSTEM, jade.PLANNER), (jade.QR_SYSTEM, jade.QR), (jade.QDS_SYSTEM, jade.QDS),
    (jade.QDP_SYSTEM, jade.QDP), (jade.DS_SYSTEM, jade.DS), (jade.AG_SYSTEM, jade.AG), (jade.AS_SYSTEM, jade.AS),
    (qagent.QAGENT_PROMPT[:60], "qagent"),   # QAgent's prompt is the user message (no system prompt)
    (decor.PLANNER_PROMPT[:40], "decor_planner"), (decor.FILTER_PROMPT[:40], "decor_filter"),
    (decor.ANSWERER_PROMPT[:40], "decor_answerer"), (decor.SUMMARIZER_PROMPT[:40], "decor_summarizer"),
    *((p[:60], "decor_judge") for p in (decor_rewards.JUDGE_ANSWER_PROMPT, decor_rewards.JUDGE_PLANNER_PROMPT,
                                         decor_rewards.JUDGE_FILTER_PROMPT, decor_rewards.JUDGE_ANSWERER_PROMPT)),
    *[(system[:40], role) for system, role in zip(
        (mask_agents.PLANNING_SYSTEM, mask_agents.SEARCH_SYSTEM, mask_agents.SUMMARY_SYSTEM,
         mask_agents.UPDATE_SYSTEM, mask_agents.ANSWER_SYSTEM), mask_agents.ROLES)],
]


def role_of(messages: Messages) -> str:
    system = messages[0]["content"]
    for prefix, role in _ROLE_BY_SYSTEM:
        if system.startswith(prefix):
            return role
    raise AssertionError(f"unknown system prompt: {system[:80]!r}")


def question_of(messages: Messages) -> str:
    m = re.search(r"Question: (.*)", messages[-1]["content"])
    assert m, messages[-1]["content"]
    return m.group(1).strip()


def n_queries(messages: Messages) -> int:
    """How many queries the rendered pool in this prompt holds."""
    text = "\n".join(m["content"] for m in messages)
    return len(re.findall(r"^Query \d+: ", text, flags=re.MULTILINE))


class ScriptedEngine:
    """An Engine whose reply is reply(role, messages); logs every generate call as (roles, n_prompts).

    Stop strings act as in the real engines: the reply is cut before the earliest one, which is reported as the
    completion's stop_reason.
    """

    model_path = "scripted"

    def __init__(self, reply: Callable[[str, Messages], str]):
        self.reply = reply
        self.log: list[tuple[str, int]] = []
        self.prompts: list[list[Messages]] = []
        self.samplings: list[SamplingConfig] = []

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        roles = {role_of(m) for m in prompts}
        assert len(roles) == 1, f"one engine call mixed roles {roles}"
        self.log.append((roles.pop(), len(prompts)))
        self.prompts.append(prompts)
        self.samplings.append(sampling)
        out = []
        for m in prompts:
            text, stop = find_stop(self.reply(role_of(m), m), sampling.stop)
            n_prompt = sum(len(x["content"].split()) for x in m)
            out.append([Completion(text, n_prompt, len(text.split()) + 1, "stop", stop)] * sampling.n)
        return out

    def steps(self, role: str) -> list[int]:
        """Batch sizes of the calls made for `role`, in order."""
        return [n for r, n in self.log if r == role]


class DrawingEngine(ScriptedEngine):
    """A ScriptedEngine whose calls of n > 1 (the answer fallback's draws) return draws(messages), one completion a
    text, logged as an "answer_agent" call."""

    def __init__(self, reply: Callable[[str, Messages], str], draws: Callable[[Messages], list[str]]):
        super().__init__(reply)
        self.draws = draws

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        if sampling.n == 1:
            return super().generate(prompts, sampling)
        self.log.append(("answer_agent", len(prompts)))
        self.samplings.append(sampling)
        return [[Completion(t, 5, len(t.split()) + 1, "stop") for t in self.draws(m)] for m in prompts]


class KeywordRetriever:
    """Deterministic Retriever over (title, text) passages: score = shared lower-case words with the query.

    Logs every batch_search call's queries.
    """

    def __init__(self, passages: list[tuple[str, str]]):
        self.docs = [Hit(str(i), f'"{t}"\n{x}', 0.0) for i, (t, x) in enumerate(passages)]
        self.words = [set(re.findall(r"\w+", d.contents.lower())) for d in self.docs]
        self.log: list[list[str]] = []

    def search(self, query: str, k: int) -> list[Hit]:
        q = set(re.findall(r"\w+", query.lower()))
        ranked = sorted(range(len(self.docs)), key=lambda i: (-len(q & self.words[i]), i))[:k]
        return [Hit(self.docs[i].id, self.docs[i].contents, float(len(q & self.words[i])))
                for i in ranked if q & self.words[i]]

    def batch_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.log.append(list(queries))
        return [self.search(q, k) for q in queries]


class Bm25Retriever:
    """A tiny bm25s index over FlashRAG corpus rows, built in memory (for the real-model tests)."""

    def __init__(self, rows: list[dict]):
        import bm25s

        self.rows = rows
        self.bm25s = bm25s
        self.model = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
        self.model.index(bm25s.tokenize([r["contents"] for r in rows], stopwords="en", show_progress=False),
                         show_progress=False)

    def batch_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        toks = self.bm25s.tokenize(queries, stopwords="en", show_progress=False)
        idx, scores = self.model.retrieve(toks, k=min(k, len(self.rows)), show_progress=False, n_threads=1)
        return [[Hit(self.rows[j]["id"], self.rows[j]["contents"], float(s)) for j, s in zip(r, sc) if s > 0]
                for r, sc in zip(idx.tolist(), scores.tolist())]

    def search(self, query: str, k: int) -> list[Hit]:
        return self.batch_search([query], k)[0]


@functools.lru_cache(maxsize=None)
def smollm2_engine(model_dir: str, batch_size: int = 8):
    """One HFEngine on SmolLM2 per test session (pass conftest's `smollm2_dir`); 1 thread: fastest on a busy CPU."""
    from ragteam.llm import EngineConfig
    from ragteam.llm.hf import HFEngine

    return HFEngine(model_dir, EngineConfig(device="cpu", threads=1, batch_size=batch_size))
