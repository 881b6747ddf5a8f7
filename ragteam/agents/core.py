"""What every agent workflow shares: the query pool, batched LLM / retrieval steps, and per-episode cost.

A workflow advances all of its episodes together: each step is one `Team.complete` call over every episode
waiting at that step, and one `Retriever.batch_search` call over every query to run. Wall time of a step is split
evenly over the episodes in it, so `cost.seconds` sums to the workflow's wall time.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ragteam.llm import Completion, Messages, SamplingConfig, Team, call_seed
from ragteam.records import AgentCall, Episode
from ragteam.retrieval.base import Hit, Retriever
from ragteam.timing import timed

COST_KEYS = ("llm_calls", "prompt_tokens", "completion_tokens", "retrieval_calls", "seconds")

# Each system module lists LONGEST_OUTPUTS: per role, the longest valid outputs its workflow can need under the
# default params, each parsed by the role's own parser; tests/test_budgets.py fails naming any role whose
# llm.sampling max_new_tokens cannot hold them plus an EOS (issue 23 §2: a truncated output is a format error no
# training can fix). Their content follows the default data's longest question template (synthetic
# employer_country: film -> director -> employer -> country) and every answer slot holds LONG_ANSWER.
LONG_ANSWER = "Sir Thomas Lawley, 1st Baronet"  # a golden answer at the 95th length percentile of the shared
                                                # benchmarks (10 SmolLM2 tokens; the synthetic answers have <= 6)


@dataclass(frozen=True)
class FormatError:
    """A model output that does not follow its role's format; the workflow applies the role's documented fallback."""

    reason: str


def first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def clip_words(text: str, n: int | None) -> str:
    words = text.split()
    return text if n is None or len(words) <= n else " ".join(words[:n]) + " ..."


@dataclass
class QueryPool:
    """The query pool Q_n with its chunks C_n: queries in order, each with the passages it added.

    The pool is the union of retrieved chunks (MAPS Eq. 8): a passage already in the pool is not added again, and
    at most `max_chunks` passages are kept (the paper caps evidence at 20).
    """

    queries: list[str] = field(default_factory=list)
    hits: list[list[Hit]] = field(default_factory=list)

    @property
    def n_chunks(self) -> int:
        return sum(len(h) for h in self.hits)

    def doc_ids(self) -> set[str]:
        return {h.id for hs in self.hits for h in hs}

    def add(self, query: str, hits: Sequence[Hit], max_chunks: int | None = None) -> list[Hit]:
        """Append `query` with those of `hits` that are new, up to the cap; returns the passages added."""
        seen, new = self.doc_ids(), []
        room = None if max_chunks is None else max(0, max_chunks - self.n_chunks)
        for h in hits:
            if room is not None and len(new) >= room:
                break
            if h.id not in seen:
                seen.add(h.id)
                new.append(h)
        self.queries.append(query)
        self.hits.append(new)
        return new

    def prefix(self, n_queries: int) -> QueryPool:
        return QueryPool(list(self.queries[:n_queries]), [list(h) for h in self.hits[:n_queries]])

    def render(self, passage_words: int | None = None) -> str:
        """The paper's layout: `Query i: ...`, `Retrieved Content:`, `Doc j(Title: "...") : ...` lines."""
        blocks = []
        for i, (q, hits) in enumerate(zip(self.queries, self.hits), start=1):
            lines = [f"Query {i}: {q}", "Retrieved Content:"]
            lines += [f'Doc {j}(Title: "{h.title}"): {clip_words(h.text, passage_words)}'
                      for j, h in enumerate(hits, start=1)]
            if not hits:
                lines.append("(no new documents)")
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def to_dict(self) -> dict:
        return {"queries": list(self.queries),
                "docs": [[{"id": h.id, "contents": h.contents, "score": h.score} for h in hs] for hs in self.hits]}

    @classmethod
    def from_dict(cls, d: dict) -> QueryPool:
        return cls(list(d["queries"]), [[Hit(x["id"], x["contents"], float(x["score"])) for x in hs]
                                        for hs in d["docs"]])


def new_episode(row: dict, system: str) -> Episode:
    ep = Episode(question_id=str(row["id"]), question=row["question"],
                 golden_answers=list(row.get("golden_answers") or []), system=system)
    ep.cost = {k: 0.0 for k in COST_KEYS}
    return ep


LEAD_IN_MIN_TOKENS = 1   # EOS forbidden for this many new tokens of a continuation (studies/answer_silence/notes.md)


def continue_lead_ins(team: Team, role: str, prompts: Sequence[Messages], outs: Sequence[Sequence[Completion]],
                      is_stub: Callable[[str], bool], sampling: SamplingConfig | None = None
                      ) -> list[list[Completion]]:
    """A lead-in is not an answer: every completion for which `is_stub(text)` holds (it announced an answer, e.g.
    "Answer:", and stopped) is continued inside its own assistant turn, with EOS forbidden for the first
    `LEAD_IN_MIN_TOKENS` new tokens, and continued again while its text is still a stub ("Answer:\n", "Answer:
    Answer:"), until the role's token budget (`max_new_tokens`, counted over the whole completion) is spent: a stop
    rule that cannot end on a lead-in while budget is left. A completion that is not a stub is never continued.
    Each round is one batched engine call per distinct budget left (stubs are short: usually one call), with the
    role's sampling (`sampling` overrides it; n = 1 each, since each stub is continued on its own). A continued
    completion keeps its prompt, joins text, token counts and ids (each lead-in's EOS dropped), and records the
    answer-less text it continues (`Completion.lead_in`). A stub that used up its budget stays no answer.

    Why: a trained MAPS answer agent wrote "Answer:" and EOS on a third of the default run's questions; one greedy
    continuation that may not stop at once completed 9 of 13 of them, and the rest stayed stubs after it
    (studies/answer_silence/notes.md)."""
    base = sampling or team.sampling_for(role)
    result = [list(group) for group in outs]

    def pending() -> list[tuple[int, int]]:
        return [(i, j) for i, group in enumerate(result) for j, c in enumerate(group)
                if is_stub(c.text) and (c.lead_in is None or c.completion_tokens < base.max_new_tokens)]

    todo = pending()
    for _ in range(base.max_new_tokens + 1):   # a round adds >= 1 token to each stub it continues: bounded anyway
        if not todo:
            break
        by_room: dict[int, list[tuple[int, int]]] = {}
        for i, j in todo:
            room = max(base.max_new_tokens - result[i][j].completion_tokens, LEAD_IN_MIN_TOKENS)
            by_room.setdefault(room, []).append((i, j))
        for room, items in by_room.items():
            s = base.model_copy(update={"n": 1, "max_new_tokens": room, "min_new_tokens": LEAD_IN_MIN_TOKENS})
            more = team.complete(role, [[*prompts[i], {"role": "assistant", "content": result[i][j].text}]
                                        for i, j in items], s)
            for (i, j), c in zip(items, more):
                result[i][j] = _joined(result[i][j], c)
        todo = pending()
    return result


def _joined(lead: Completion, cont: Completion) -> Completion:
    """`lead` followed by its continuation `cont`: one completion of the lead's prompt."""
    ids = None
    if lead.token_ids is not None and cont.token_ids is not None:
        head = lead.token_ids[:-1] if lead.finish_reason == "stop" and lead.stop_reason is None else lead.token_ids
        ids = tuple(head) + tuple(cont.token_ids)
    return replace(cont, text=lead.text + cont.text, prompt_tokens=lead.prompt_tokens, prompt_ids=lead.prompt_ids,
                   completion_tokens=lead.completion_tokens + cont.completion_tokens, token_ids=ids, logprobs=None,
                   lead_in=lead.text)


def resample_no_answers(team: Team, role: str, prompts: Sequence[Messages], outs: Sequence[Completion],
                        parsers: Sequence[Callable[[str], Any]], sampling: SamplingConfig | None = None,
                        keep_stop: bool = False) -> tuple[list[Completion], dict[int, dict]]:
    """The answer fallback (`llm.answer_fallback`, `ragteam.llm.AnswerFallback`): every output whose parse
    (`parsers[i]`) is a FormatError (no answer: a stub its continuation did not complete, an empty output, a copied
    passage header) gets `samples` fresh completions of its prompt at the fallback's temperature and top-p, all in
    one engine call (n = samples, the role's token budget, seeded by `call_seed(fallback.seed, role, call number)`, so
    a rerun draws the same ones); the first draw that parses replaces it. The replacement counts every token
    generated for it (the stub's and all the draws') and keeps the stub's text in its record
    (`{index: {"from": stub, "draw": d, "of": samples}}`, 1-based d; d = 0 when no draw parsed and the stub stays).

    Off (outputs unchanged) for a Team without a fallback or with `samples` 0, and for a Team that keeps token ids
    (a trainer's rollouts score what the policy drew: a resample would hide the stub from its reward). `keep_stop`:
    each text is parsed with the stop string that ended it, as `llm_step` then reads it."""
    def fails(parse: Callable[[str], Any], c: Completion) -> bool:
        return isinstance(parse(c.text + (c.stop_reason or "") if keep_stop else c.text), FormatError)

    fb = team.fallback
    result = list(outs)
    if fb is None or fb.samples == 0 or team.keep_token_ids:
        return result, {}
    todo = [i for i, (o, parse) in enumerate(zip(outs, parsers)) if fails(parse, o)]
    if not todo:
        return result, {}
    base = sampling or team.sampling_for(role)
    s = base.model_copy(update={"n": fb.samples, "temperature": fb.temperature, "top_p": fb.top_p,
                                "min_new_tokens": 0, "seed": call_seed(fb.seed, role, team.n_calls)})
    draws = team.generate(role, [list(prompts[i]) for i in todo], s)
    info: dict[int, dict] = {}
    for i, group in zip(todo, draws):
        spent = outs[i].completion_tokens + sum(c.completion_tokens for c in group)
        pick = next((d for d, c in enumerate(group, start=1) if not fails(parsers[i], c)), 0)
        info[i] = {"from": outs[i].text, "draw": pick, "of": fb.samples}
        chosen = group[pick - 1] if pick else outs[i]
        result[i] = replace(chosen, completion_tokens=spent, logprobs=None)
    return result, info


def llm_step(team: Team, role: str, episodes: Sequence[Episode], prompts: Sequence[Messages],
             parse: Callable[[str], Any] | Sequence[Callable[[str], Any]], sampling: SamplingConfig | None = None,
             keep_stop: bool = False, continue_if: Callable[[str], bool] | None = None, **meta: Any
             ) -> list[AgentCall]:
    """One batched engine call for `role` over `episodes`; each gets an AgentCall with the parsed output.

    `parse` is one parser for every output, or one per episode (a parser that depends on the episode's state).
    `continue_if` (answering roles: `answer.is_stub`): outputs it flags are continued (`continue_lead_ins`) before they
    are parsed; the call records the lead-in in `meta["lead_in"]`. An answering role's output that then still does
    not parse goes to the Team's answer fallback (`resample_no_answers`), recorded in `meta["resampled"]`.

    `sampling` overrides the role's settings. With `keep_stop` the stop string that ended a completion is kept at
    the end of the response (the model did generate it; multi-turn agents act on it) and `meta["finish"]` records
    how generation ended: "stop_string", "eos" or "length". With `team.keep_token_ids` (trainers) the engine's
    token ids go onto the call (token in, token out); with `keep_stop` its `response_ids` already end with the
    stop string's tokens.
    """
    if not episodes:
        return []
    parsers = [parse] * len(episodes) if callable(parse) else list(parse)
    if len(parsers) != len(episodes):
        raise ValueError(f"llm_step({role}): {len(parsers)} parsers for {len(episodes)} episodes")
    t0 = time.perf_counter()
    outs = team.complete(role, list(prompts), sampling)
    resampled: dict[int, dict] = {}
    if continue_if is not None:   # an answering role: a lead-in is continued, then no answer is resampled
        outs = [g[0] for g in continue_lead_ins(team, role, prompts, [[o] for o in outs], continue_if, sampling)]
        outs, resampled = resample_no_answers(team, role, prompts, outs, parsers, sampling, keep_stop)
    share = (time.perf_counter() - t0) / len(episodes)
    calls = []
    keep = team.keep_token_ids
    for k, (ep, msgs, out, parse_one) in enumerate(zip(episodes, prompts, outs, parsers)):
        text, call_meta = out.text, dict(meta)
        if out.lead_in is not None:
            call_meta["lead_in"] = out.lead_in
        if k in resampled:
            call_meta["resampled"] = resampled[k]
        if keep_stop:
            text += out.stop_reason or ""
            call_meta["finish"] = ("stop_string" if out.stop_reason else
                                   "eos" if out.finish_reason == "stop" else "length")
        parsed = parse_one(text)
        err = parsed.reason if isinstance(parsed, FormatError) else None
        call = AgentCall(role=role, prompt=list(msgs), response=text, parsed=None if err else parsed,
                         format_error=err, prompt_tokens=out.prompt_tokens,
                         completion_tokens=out.completion_tokens, finish_reason=out.finish_reason,
                         prompt_ids=_as_list(out.prompt_ids, keep), response_ids=_as_list(out.token_ids, keep),
                         logprobs=_as_list(out.logprobs, keep), meta=call_meta)
        ep.add_call(call)
        ep.cost["seconds"] += share
        calls.append(call)
    return calls


def _as_list(xs, keep: bool):
    return None if xs is None or not keep else list(xs)


@timed("retrieval")
def retrieve_step(retriever: Retriever, episodes: Sequence[Episode], queries: Sequence[str], k: int
                  ) -> list[list[Hit]]:
    """One batched search over one query per episode; records the query and counts a retrieval call each."""
    if not episodes:
        return []
    t0 = time.perf_counter()
    hits = retriever.batch_search(list(queries), k)
    share = (time.perf_counter() - t0) / len(episodes)
    for ep in episodes:
        ep.cost["retrieval_calls"] += 1
        ep.cost["seconds"] += share
    return hits


def add_to_pool(ep: Episode, pool: QueryPool, query: str, hits: Sequence[Hit], max_chunks: int | None,
                call: AgentCall | None = None) -> list[Hit]:
    """Add a retrieval result to the pool and mirror it in the Episode (`queries`, `retrieved_ids`)."""
    added = pool.add(query, hits, max_chunks)
    ids = [h.id for h in added]
    ep.queries.append(query)
    ep.retrieved_ids.append(ids)
    if call is not None:
        call.retrieved_ids = ids
    return added


def finish_episode(ep: Episode, pool: QueryPool | None = None) -> Episode:
    """Sum the calls into `cost` and keep the final pool (with passage text) for auditing and reuse."""
    ep.cost["llm_calls"] = float(len(ep.calls))
    ep.cost["prompt_tokens"] = float(sum(c.prompt_tokens for c in ep.calls))
    ep.cost["completion_tokens"] = float(sum(c.completion_tokens for c in ep.calls))
    ep.cost["seconds"] = round(ep.cost["seconds"], 4)
    if pool is not None:
        ep.meta["pool"] = pool.to_dict()
    ep.meta["format_errors"] = sum(c.format_error is not None for c in ep.calls)
    return ep


def episode_pool(ep: Episode) -> QueryPool:
    return QueryPool.from_dict(ep.meta["pool"])
