"""MAPS Algorithm 1, data side: difficulty labels, debate synthesis (T1), query-agent data (T2), judge candidates
and unanimity labels (T3).

Every sample carries its question, golden answers and the (query pool, chunks) it was built from, as
`QueryPool.to_dict()`, so a trainer can render the exact MAPS prompt and an auditor can see the evidence.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragteam.agents import maps
from ragteam.agents.core import QueryPool, continue_lead_ins
from ragteam.agents.debate import DebateConfig, debate_snapshots, run_debate
from ragteam.metrics import accuracy, exact_match
from ragteam.llm import SamplingConfig, Team
from ragteam.retrieval.base import Retriever

METRICS = {"em": exact_match, "acc": accuracy}
SUFFICIENT, INSUFFICIENT = maps.SUFFICIENT, maps.INSUFFICIENT


@dataclass(frozen=True)
class DifficultyRule:
    """R1-Searcher-style labels from k sampled answers of the base model with standard retrieval.

    correct >= easy_min -> easy; correct <= hard_max -> hard; otherwise medium. "correct" uses `metric`
    (em, or acc = gold contained in the answer: small models wrap answers in sentences, EM would call
    everything hard).
    """

    k: int = 4
    easy_min: int = 4
    hard_max: int = 0
    metric: str = "acc"

    def label(self, n_correct: int) -> str:
        if n_correct >= self.easy_min:
            return "easy"
        if n_correct <= self.hard_max:
            return "hard"
        return "medium"


def single_retrieval_pools(rows: Sequence[dict], retriever: Retriever, top_k: int) -> list[QueryPool]:
    """Q_0, C_0 = R(x, k): the question is the first query (one batched search)."""
    pools = []
    for row, hits in zip(rows, retriever.batch_search([r["question"] for r in rows], top_k)):
        pool = QueryPool()
        pool.add(row["question"], hits)
        pools.append(pool)
    return pools


def sample_answers(team: Team, role: str, rows: Sequence[dict], pools: Sequence[QueryPool], sampling: SamplingConfig,
                   passage_words: int | None = None) -> list[list[str]]:
    """`sampling.n` answers per (question, pool) with the MAPS answer prompt, in ONE batched engine call (and one
    more for the lead-ins to continue, as MAPS inference does: `agents.core.continue_lead_ins`)."""
    prompts = [maps.answer_messages(r["question"], p.render(passage_words)) for r, p in zip(rows, pools)]
    outs = continue_lead_ins(team, role, prompts, team.generate(role, prompts, sampling), maps.is_stub, sampling)
    answers = []
    for samples in outs:
        parsed = [maps.parse_answer(c.text) for c in samples]
        answers.append([a if isinstance(a, str) else "" for a in parsed])
    return answers


def label_difficulty(rows: Sequence[dict], team: Team, retriever: Retriever, rule: DifficultyRule, top_k: int,
                     temperature: float, max_new_tokens: int, passage_words: int | None, seed: int) -> list[dict]:
    """Each row + metadata.difficulty / n_correct, from rule.k sampled answers with standard retrieval."""
    score = METRICS[rule.metric]
    pools = single_retrieval_pools(rows, retriever, top_k)
    s = SamplingConfig(n=rule.k, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    out = []
    for row, answers in zip(rows, sample_answers(team, "answer_agent", rows, pools, s, passage_words)):
        n = int(sum(score(a, row["golden_answers"]) for a in answers))
        out.append({**row, "metadata": {**row.get("metadata", {}), "difficulty": rule.label(n), "n_correct": n,
                                        "k": rule.k}})
    return out


def _sample(row: dict, pool: QueryPool, kind: str, top_k: int, **meta) -> dict:
    return {"id": f"{row['id']}#{kind}{meta.get('round', 0)}", "question_id": row["id"], "question": row["question"],
            "golden_answers": row["golden_answers"], "top_k": top_k, "pool": pool.to_dict(),
            "n_queries": len(pool.queries), "n_chunks": pool.n_chunks, **meta}


def debate_samples(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: DebateConfig, first_n_top3: int,
                   max_samples: int = 4) -> tuple[list[dict], list]:
    """T1: DRAG debates (no answer) on the hard questions; one sample per end-of-round snapshot (1-4 per question).

    The first `first_n_top3` questions retrieve top-3 chunks per round, the rest top-5 (paper: 6000 of 8148).
    """
    samples, episodes = [], []
    groups = [(rows[:first_n_top3], 3), (rows[first_n_top3:], 5)]
    for group, k in groups:
        if not group:
            continue
        eps = run_debate(group, team, retriever, cfg.model_copy(update={"top_k": k}), answer=False,
                         system="debate_synthesis")
        episodes += eps
        for row, ep in zip(group, eps):
            snaps = debate_snapshots(ep)
            for rnd, pool in enumerate(snaps[-max_samples:] if len(snaps) > max_samples else snaps):
                samples.append(_sample(row, pool, "t1_", k, round=rnd, source="debate",
                                       stop_reason=ep.meta["stop_reason"]))
    return samples, episodes


def query_samples(rows: Sequence[dict], retriever: Retriever, top_k: int) -> list[dict]:
    """T2: one retrieval with the question as the query, for each normal-difficulty question."""
    return [_sample(r, p, "t2_", top_k, round=0, source="single_retrieval")
            for r, p in zip(rows, single_retrieval_pools(rows, retriever, top_k))]


def label_judge(candidates: Sequence[dict], team: Team, n_samples: int, temperature: float, max_new_tokens: int,
                passage_words: int | None, seed: int, metric: str = "em", sufficient_min: int | None = None,
                insufficient_max: int = 0) -> tuple[list[dict], dict]:
    """T3 (Algorithm 1 step 6): the trained answer agent answers each candidate `n_samples` times (temperature > 0).

    All correct -> Sufficient Information; all wrong -> Insufficient Information; mixed -> dropped (the paper).
    `sufficient_min` / `insufficient_max` relax the two ends (None = n_samples: unanimity; 0 = none right).
    "Correct" is `metric`: em (the paper's natural reading) or acc (a golden answer contained in the answer).
    Returns (labelled rows, stats).
    """
    sufficient_min = n_samples if sufficient_min is None else sufficient_min
    if not insufficient_max < sufficient_min <= n_samples:
        raise ValueError(f"label thresholds need insufficient_max ({insufficient_max}) < sufficient_min "
                         f"({sufficient_min}) <= n_samples ({n_samples})")
    score = METRICS[metric]
    pools = [QueryPool.from_dict(c["pool"]) for c in candidates]
    s = SamplingConfig(n=n_samples, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    answers = sample_answers(team, "answer_agent", candidates, pools, s, passage_words)
    out, stats = [], {"candidates": len(candidates), SUFFICIENT: 0, INSUFFICIENT: 0, "dropped": 0, "metric": metric}
    for c, pool, ans in zip(candidates, pools, answers):
        n = int(sum(score(a, c["golden_answers"]) for a in ans))
        label = SUFFICIENT if n >= sufficient_min else INSUFFICIENT if n <= insufficient_max else None
        if label is None:
            stats["dropped"] += 1
            continue
        stats[label] += 1
        msgs = maps.judge_messages(c["question"], pool.render(passage_words))
        out.append({**c, "label": label, "n_correct": n, "n_samples": n_samples,
                    "messages": msgs + [{"role": "assistant", "content": label}]})
    stats["drop_rate"] = stats["dropped"] / max(len(candidates), 1)
    stats["sufficient_share"] = stats[SUFFICIENT] / max(len(out), 1)
    return out, stats


def split_questions(labelled: Sequence[dict], answer_pool: Sequence[str], max_q1: int = 0, max_t2: int = 0
                    ) -> tuple[list[dict], list[dict]]:
    """Algorithm 1 step 1: Q1 = rows whose difficulty is in `answer_pool` (debated into T1), Q2 = the rest (T2).

    Each is cut to its first `max_q1` / `max_t2` rows (0 = no cap): the paper debates 8,148 hard questions and
    trains the query agent on 10,000 T2 samples (one per Q2 question).
    """
    q1 = [r for r in labelled if r["metadata"]["difficulty"] in answer_pool]
    q2 = [r for r in labelled if r["metadata"]["difficulty"] not in answer_pool]
    return (q1[:max_q1] if max_q1 else q1), (q2[:max_t2] if max_t2 else q2)
