"""Oracle traces as SFT rows (issue 25 §1): build them for a system, validate them, write them as JSONL.

    rows of the training pool --(refuse evaluation questions)--> gold chain (gold) --> one oracle run per
    question (oracle.OracleSystem: the rollouts' workflow and reward) --> complete episodes --> one row per call

A row is one role call: {"system", "role", "question_id", "messages" (the prompt as the workflow sent it),
"response" (the text the role wrote, a kept stop string included, as `AgentCall.response`), "eos" (whether the
response ended with EOS; False when a stop string ended it, and the stop string is the response's end),
"turn", "reward" (the call's reward from the system's own reward function; QAgent's Eq. 7 is one reward per
trajectory, on its last turn, None on the others), "response_tokens" (the project tokenizer's ids the engine
counted, EOS included)}. SFT on a row: the prompt is `messages` under the chat template (`ragteam.llm.chat_text`:
QAgent's later turns continue the assistant message, whose <information> blocks are prompt, not target), the target
is `response`, followed by EOS only where `eos` is true. Every row is re-parsed with its role's own parser when
it is built and when it is read (`validate_row`).

Only complete episodes become rows (`OracleSystem.incomplete`): every call parsed, every reward at its top, the
gold answer given, and no output cut by its role's `max_new_tokens` (a cut that leaves a parsable text would
still teach an output without its EOS). The others are counted by reason in the summary, whose `yield` is the share
of questions with a complete trace.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ragteam.agents.core import FormatError
from ragteam.data.formats import iter_corpus, iter_qa
from ragteam.io import DataError, read_jsonl, write_json, write_jsonl
from ragteam.llm import LLMConfig
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.warmup.oracle import OracleSystem, oracle_team
from ragteam.warmup.gold import GoldError, gold_chain

ROW_KEYS = ("system", "role", "question_id", "messages", "response", "eos", "turn", "reward", "response_tokens")


# ---- training pool only ---------------------------------------------------------------------------------------------

def evaluation_questions(benchmarks: str | Path) -> tuple[set[str], set[str]]:
    """(ids, normalised question texts) of every evaluation benchmark file (`*.jsonl` under `benchmarks`)."""
    files = sorted(Path(benchmarks).rglob("*.jsonl"))
    if not files:
        raise DataError(f"{benchmarks}: no benchmark files (*.jsonl): cannot check that traces avoid them")
    ids, texts = set(), set()
    for f in files:
        for row in iter_qa(f):
            ids.add(row["id"])
            texts.add(" ".join(row["question"].lower().split()))
    return ids, texts


def refuse_evaluation_rows(rows: Sequence[dict], evaluation: tuple[set[str], set[str]]) -> None:
    """DataError naming the rows whose id or question text is an evaluation question's: traces train the policy,
    so they come from the training pool only (issue 25 §1)."""
    ids, texts = evaluation
    bad = [str(r["id"]) for r in rows
           if str(r["id"]) in ids or " ".join(r["question"].lower().split()) in texts]
    if bad:
        raise DataError(f"{len(bad)} of the {len(rows)} rows are evaluation questions (ids or question texts of the "
                        f"benchmarks): {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}; oracle traces come from "
                        f"the training pool only")


# ---- build -------------------------------------------------------------------------------------------------------

def trace_rows(system: OracleSystem, ep: Episode) -> list[dict]:
    return [{"system": system.name, "role": c.role, "question_id": ep.question_id, "messages": c.prompt,
             "response": c.response, "eos": c.finish_reason == "stop" and c.meta.get("finish") != "stop_string",
             "turn": c.meta.get("turn"), "reward": c.reward, "response_tokens": c.completion_tokens}
            for c in ep.calls]


def build_traces(system: OracleSystem, rows: Sequence[dict], retriever: Retriever, passages: Mapping[str, str],
                 tokenizer, params: dict[str, Any], evaluation: tuple[set[str], set[str]]
                 ) -> tuple[list[dict], list[Episode], dict[str, Any]]:
    """(trace rows, every episode run, summary) for `rows` of the training pool (refused if any is an evaluation
    question). `passages`: id -> contents of at least the rows' gold passages; `params`: params.yaml (the
    system's section and `llm.sampling`, whose budgets the oracle's outputs live under, as the policy's do)."""
    refuse_evaluation_rows(rows, evaluation)
    sampling = LLMConfig.model_validate(params["llm"]).sampling
    out, episodes, dropped = [], [], Counter()
    for row in rows:
        try:
            gold = gold_chain(row, passages)
        except GoldError:
            dropped["no gold chain"] += 1
            continue
        eps = system.run([row], oracle_team(system.replies(gold), tokenizer, sampling), retriever)
        system.annotate(eps)
        ep = eps[0]
        ep.meta.update(hops=len(gold.hops), gold_ids=[h.passage_id for h in gold.hops])
        cut = [c.role for c in ep.calls if c.finish_reason == "length"]
        reason = f"cut at max_new_tokens in {cut[0]}" if cut else system.incomplete(ep)
        ep.meta["oracle"] = reason or "complete"
        episodes.append(ep)
        if reason:
            dropped[reason] += 1
            continue
        for r in trace_rows(system, ep):
            validate_row(r, system)
            out.append(r)
    return out, episodes, summarize(system, rows, out, episodes, dropped, sampling)


def summarize(system: OracleSystem, rows: Sequence[dict], traces: Sequence[dict], episodes: Sequence[Episode],
              dropped: Counter, sampling) -> dict[str, Any]:
    """Yield (share of questions with a complete trace), rows and the longest response per role against its
    budget, the complete share per hop count, and the share of the oracle's searches that retrieved a gold
    passage (QAgent's pool keeps a passage once, so a repeated hit counts as a miss there)."""
    complete = [ep for ep in episodes if ep.meta["oracle"] == "complete"]
    by_hops: dict[int, list[int]] = {}
    for ep in episodes:
        by_hops.setdefault(ep.meta["hops"], []).append(ep.meta["oracle"] == "complete")
    searches = [bool(set(ids) & set(ep.meta["gold_ids"])) for ep in episodes for ids in ep.retrieved_ids]
    roles = sorted({r["role"] for r in traces})
    budget = {r: (sampling.get(r) or sampling.get("default")).max_new_tokens
              if (sampling.get(r) or sampling.get("default")) else None for r in roles}
    return {
        "system": system.name, "questions": len(rows), "complete": len(complete),
        "yield": round(len(complete) / len(rows), 4) if rows else 0.0,
        "dropped": dict(sorted(dropped.items())),
        "yield_by_hops": {str(h): round(sum(v) / len(v), 4) for h, v in sorted(by_hops.items())},
        "searches": len(searches),
        "search_gold_hit": round(sum(searches) / len(searches), 4) if searches else 0.0,
        "rows": len(traces), "rows_per_role": dict(sorted(Counter(r["role"] for r in traces).items())),
        "max_response_tokens": {r: max(t["response_tokens"] for t in traces if t["role"] == r) for r in roles},
        "max_new_tokens": budget, "describe": system.describe,
    }


# ---- validate, write, read ---------------------------------------------------------------------------------------

def validate_row(row: dict, system: OracleSystem, where: str = "trace row") -> None:
    """DataError naming `where` unless the row has the trace keys, belongs to `system`, and its response parses
    with its role's own parser given its prompt."""
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise DataError(f"{where}: missing {missing}")
    if row["system"] != system.name or row["role"] not in system.roles:
        raise DataError(f"{where}: {row['system']}/{row['role']} is not a role of {system.name} {system.roles}")
    msgs = row["messages"]
    if not (isinstance(msgs, list) and msgs and all(isinstance(m, dict) and set(m) == {"role", "content"}
                                                    for m in msgs)):
        raise DataError(f"{where}: messages must be a non-empty list of {{role, content}}")
    parsed = system.parser(row["role"], msgs)(row["response"])
    if isinstance(parsed, FormatError):
        raise DataError(f"{where} ({row['role']}, question {row['question_id']}): the response does not parse: "
                        f"{parsed.reason}")


def write_traces(path: str | Path, rows: Iterable[dict], system: OracleSystem) -> int:
    """Validate every row, then write them atomically (`data/warmup/<system>/traces.jsonl`)."""
    rows = list(rows)
    for n, r in enumerate(rows, 1):
        validate_row(r, system, f"{path}: row {n}")
    return write_jsonl(path, rows)


def read_traces(path: str | Path, system: OracleSystem) -> list[dict]:
    out = []
    for lineno, r in read_jsonl(path):
        validate_row(r, system, f"{path}:{lineno}")
        out.append(r)
    return out


def load_passages(corpus: str | Path, rows: Sequence[dict]) -> dict[str, str]:
    """id -> contents of the corpus rows the training rows' gold names (`supporting_ids`, or `supporting_titles`
    for datasets that name passages by title), in one streamed pass."""
    ids = {p for r in rows for p in (r.get("metadata") or {}).get("supporting_ids") or []}
    titles = {t for r in rows for t in (r.get("metadata") or {}).get("supporting_titles") or []
              if not (r.get("metadata") or {}).get("supporting_ids")}
    return {r["id"]: r["contents"] for r in iter_corpus(corpus) if r["id"] in ids or r["title"] in titles}


def write_system_traces(system: OracleSystem, pool: str | Path, corpus: str | Path, retriever: Retriever,
                        benchmarks: str | Path, tokenizer, params: dict[str, Any], out_dir: str | Path,
                        max_questions: int = 0) -> dict[str, Any]:
    """Build, validate and write `out_dir/traces.jsonl` and `out_dir/summary.json` for one system; returns the
    summary. `max_questions` > 0: the first n rows of the pool. `system`: the system's oracle player
    (`ragteam.systems.oracle_system`)."""
    rows = list(iter_qa(pool))
    if max_questions:
        rows = rows[:max_questions]
    traces, _eps, summary = build_traces(system, rows, retriever, load_passages(corpus, rows), tokenizer, params,
                                         evaluation_questions(benchmarks))
    out = Path(out_dir)
    write_traces(out / "traces.jsonl", traces, system)
    write_json(out / "summary.json", summary)
    return summary
