"""The one record of agent work: AgentCall and Episode, written as JSONL so any run can be audited call by call.

Workflows produce Episodes; rewards annotate calls (`reward`); trainers consume calls; evaluation aggregates
Episodes.

Token ids (`AgentCall.prompt_ids`, `response_ids`, `logprobs`) are recorded for trainers only (a Team with
`keep_token_ids`: the joint trainer's rollouts) and kept in memory only: trainers read them from the Episodes a
rollout just produced, and the written form (`model_dump`, `write_episodes`, evaluation's JSONL) leaves them out,
since the prompt ids alone would multiply the files' size (the text they encode is there). A call read back from a
file has none; a trainer re-tokenises such a call's text (`ragteam.train.joint.batch.tokenize_call`).
"""
from __future__ import annotations

import uuid
from pathlib import Path
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ragteam.io import DataError, read_jsonl, write_jsonl


class AgentCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str                                  # e.g. query_agent, judge_agent, answer_agent, proponent
    prompt: list[dict[str, str]]               # chat messages sent to the engine
    response: str = ""                         # raw generated text
    parsed: Any = None                         # parser output (None when format_error is set)
    format_error: str | None = None            # why the response could not be parsed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None           # "stop" (EOS / stop string) | "length" (cut at max_new_tokens)
    # token in, token out (ragteam.llm.Completion): what the engine saw and sampled; not written (module docstring)
    prompt_ids: list[int] | None = Field(None, exclude=True)
    response_ids: list[int] | None = Field(None, exclude=True)  # sampled ids, EOS / stop-string tokens included
    logprobs: list[float] | None = Field(None, exclude=True)    # the engine's log-prob per response id (vLLM)
    reward: float | None = None                # turn-level reward, set by a reward function
    episode_id: str = ""
    group_id: str | None = None                # GRPO group (same prompt, several samples)
    retrieved_ids: list[str] = Field(default_factory=list)  # doc ids retrieved as a result of this call
    meta: dict[str, Any] = Field(default_factory=dict)


class Episode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    episode_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    question_id: str
    question: str
    golden_answers: list[str]
    system: str = ""
    calls: list[AgentCall] = Field(default_factory=list)
    queries: list[str] = Field(default_factory=list)       # the query pool, in order
    retrieved_ids: list[list[str]] = Field(default_factory=list)  # doc ids per retrieval call
    final_answer: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    cost: dict[str, float] = Field(default_factory=dict)   # llm_calls, prompt_tokens, completion_tokens, ...
    meta: dict[str, Any] = Field(default_factory=dict)

    def add_call(self, call: AgentCall) -> AgentCall:
        call.episode_id = self.episode_id
        self.calls.append(call)
        return call


# What a run measures about itself (wall time) is not part of the record: it goes to the stage's metrics.
WALL_CLOCK_COST_KEYS = ("seconds",)


def reproducible(episodes: Iterable[Episode]) -> Iterator[dict]:
    """Episodes as written: the same inputs and seeds give the same bytes.

    Wall-clock cost (`cost.seconds`) is dropped (stages report it in metrics/<stage>.json), and the random
    in-memory ids become `<system>/<question_id>` (`#2`, `#3`, ... for repeats of a question in the same file),
    with every call's `episode_id` renamed to match.
    """
    seen: dict[tuple[str, str], int] = {}
    for e in episodes:
        key = (e.system, e.question_id)
        seen[key] = seen.get(key, 0) + 1
        eid = f"{e.system}/{e.question_id}" + (f"#{seen[key]}" if seen[key] > 1 else "")
        d = e.model_dump(mode="json")
        d["episode_id"] = eid
        for c in d["calls"]:
            c["episode_id"] = eid
        d["cost"] = {k: v for k, v in d["cost"].items() if k not in WALL_CLOCK_COST_KEYS}
        yield d


def write_episodes(path: str | Path, episodes: Iterable[Episode]) -> int:
    """Write Episodes as JSONL (atomically) in their reproducible form (`reproducible`)."""
    return write_jsonl(path, reproducible(episodes))


def read_episodes(path: str | Path) -> list[Episode]:
    out = []
    for lineno, obj in read_jsonl(path):
        try:
            out.append(Episode.model_validate(obj))
        except Exception as e:  # pydantic error -> file:line
            raise DataError(f"{path}:{lineno}: not a valid Episode: {e}") from None
    return out
