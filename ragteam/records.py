"""The one record of agent work: AgentCall and Episode, written as JSONL so any run can be audited call by call.

Workflows produce Episodes; rewards annotate calls (`reward`); trainers consume calls; evaluation aggregates
Episodes.
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterable

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


def write_episodes(path: str | Path, episodes: Iterable[Episode]) -> int:
    return write_jsonl(path, (e.model_dump(mode="json") for e in episodes))


def read_episodes(path: str | Path) -> list[Episode]:
    out = []
    for lineno, obj in read_jsonl(path):
        try:
            out.append(Episode.model_validate(obj))
        except Exception as e:  # pydantic error -> file:line
            raise DataError(f"{path}:{lineno}: not a valid Episode: {e}") from None
    return out
