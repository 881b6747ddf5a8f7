"""Oracle traces for the format warm-up (issue 25 §1): an oracle team plays every role of a joint system from a
training question's gold chain (`ragteam.warmup.gold`), through the workflow code the rollouts use.

Mechanism. `OracleEngine` is an `Engine`: each prompt's reply is `reply(messages)`, a pure function of the prompt
and the question's `Gold`, turned into a `Completion` as a real engine would: the text is cut before the earliest
stop string (`find_stop`, reported as `stop_reason`), token counts and ids come from the project tokenizer
(prompt ids under the chat template, `chat_text`; sampled ids through the stop string's tokens, or the text's ids
and EOS), and a reply longer than the role's `max_new_tokens` is cut there with finish_reason "length", exactly
what the policy's budget would do to it. The workflow (`run_mask(training=True)`, `run_qagent`), the prompts and
the rewards are the rollouts' own, so the traces' prompts are byte for byte what the policy sees.

One question per workflow run: M-ASK's Summary prompt holds the search query and the passages but not the
question, so in a batch the gold of a Summary prompt could not be told from the prompt alone; run one at a time,
every prompt of the run belongs to the one gold chain the engine holds. (The prompts do not depend on the batch.)

Each system's module (`ragteam.systems.<system>`) builds its own `OracleSystem`: its role replies, its workflow,
its reward and what makes an episode a complete trace; the stages look it up in `ragteam.systems.registry.REGISTRY` and pass
it to `ragteam.warmup.traces` and `ragteam.warmup.sft`, which never name a system.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragteam.llm import Completion, Messages, SamplingConfig, Team, chat_text, find_stop
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.warmup.gold import Gold, Hop

Reply = Callable[[Messages], str]


# ---- the engine ---------------------------------------------------------------------------------------------------

class OracleEngine:
    """An Engine whose completion of a prompt is `reply(prompt)` (module docstring); `tokenizer` is the policy's."""

    model_path = "oracle"

    def __init__(self, reply: Reply, tokenizer):
        if tokenizer.eos_token_id is None:
            raise ValueError("OracleEngine: the tokenizer has no eos_token_id to end a completion with")
        self.reply, self.tok = reply, tokenizer

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids if text else []

    def complete(self, messages: Messages, sampling: SamplingConfig) -> Completion:
        text, stop = find_stop(self.reply(messages), sampling.stop)
        ids = self._ids(text + stop) if stop else self._ids(text) + [self.tok.eos_token_id]
        finish = "stop"
        if len(ids) > sampling.max_new_tokens:   # the budget cuts it, as it would cut the policy
            ids = ids[:sampling.max_new_tokens]
            text, stop = find_stop(self.tok.decode(ids, skip_special_tokens=True), sampling.stop)
            finish = "stop" if stop else "length"
        prompt_ids = self._ids(chat_text(self.tok, messages))
        return Completion(text, len(prompt_ids), len(ids), finish, stop, tuple(prompt_ids), tuple(ids))

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        return [[self.complete(m, sampling)] * sampling.n for m in prompts]


def oracle_team(replies: Mapping[str, Reply], tokenizer, sampling: Mapping[str, SamplingConfig]) -> Team:
    """A Team whose every role is an OracleEngine with that role's reply, under the rollouts' sampling settings."""
    engines = {role: OracleEngine(r, tokenizer) for role, r in replies.items()}

    def engine(role: str) -> OracleEngine:
        if role not in engines:
            raise ValueError(f"the oracle team has no reply for role {role!r} (it plays {sorted(engines)})")
        return engines[role]

    return Team(engine, sampling, keep_token_ids=True)


def query_forms(hop: Hop) -> tuple[str, str]:
    """The queries an oracle tries for a hop, in order: its sub-question, then its entity with the words of the
    relation's sentence (`Hop.keyword_query`), searched when the first did not bring the fact into view (e.g. a
    city's name is also a family name, and BM25 ranks the family's people above the city)."""
    return hop.question, hop.keyword_query


def hop_of_query(gold: Gold, query: str) -> int:
    for i, h in enumerate(gold.hops):
        if query in query_forms(h):
            return i
    raise ValueError(f"question {gold.question_id}: query {query!r} is none of the oracle's hop queries")


def visible_fact(gold: Gold, i: int, docs: Sequence[str]) -> bool:
    """Hop i's fact sentence is shown whole in one of the rendered passages (as clipped for the prompt)."""
    return any(gold.hops[i].fact in d for d in docs)


# ---- reading a prompt ---------------------------------------------------------------------------------------------

def user_text(messages: Messages) -> str:
    return messages[-1]["content"]


def prompt_field(text: str, start: str, end: str | None) -> str:
    m = re.search(re.escape(start) + (r"(.*?)" + re.escape(end) if end else r"(.*)\Z"), text, re.DOTALL)
    if m is None:
        raise ValueError(f"prompt has no {start.strip()!r} field: {text[:120]!r}")
    return m.group(1)


# ---- what a system hands the builder ------------------------------------------------------------------------------

@dataclass(frozen=True)
class OracleSystem:
    """What the builder needs of one joint system (module docstring); a system's module builds it."""

    name: str
    roles: tuple[str, ...]
    replies: Callable[[Gold], dict[str, Reply]]
    run: Callable[[list[dict], Team, Retriever], list[Episode]]      # the rollouts' workflow, training mode
    annotate: Callable[[list[Episode]], None]                         # the rollouts' reward
    incomplete: Callable[[Episode], str | None]                       # why an episode is no trace (None: it is)
    parser: Callable[[str, Messages], Callable[[str], Any]]           # (role, prompt) -> the role's own parser
    describe: dict[str, Any] = field(default_factory=dict)
    # (role, the role's llm.sampling) -> what the workflow generates with (QAgent adds Algorithm 1's stop strings)
    sampling: Callable[[str, SamplingConfig], SamplingConfig] = lambda role, s: s
