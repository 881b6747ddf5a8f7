"""Retrieval quality: recall@k of supporting titles (HotpotQA, 2Wiki, MuSiQue carry them in metadata) and
answer-string recall@k (FlashRAG's `retrieval_recall`: a normalised gold answer occurs in a retrieved passage)."""
from __future__ import annotations

from collections.abc import Sequence

from ragteam.metrics import normalize_answer
from ragteam.retrieval.base import Hit, Retriever
from ragteam.timing import timed

KS = (1, 3, 5, 10, 20)


def _title_key(title: str) -> str:
    return " ".join(title.split())  # the mirror corpus collapsed whitespace in titles; benchmarks may not have


def question_recall(hits: Sequence[Hit], golden_answers: Sequence[str], supporting_titles: Sequence[str] | None,
                    ks: Sequence[int] = KS) -> dict[str, float]:
    """Per-question recall@k: share of supporting titles among the top-k titles; 1 if an answer is in the top-k."""
    golds = [g for g in (normalize_answer(a) for a in golden_answers) if g]
    texts = [normalize_answer(h.contents) for h in hits]
    first_answer = next((i for i, t in enumerate(texts) if any(g in t for g in golds)), None)
    out = {f"answer_recall@{k}": float(first_answer is not None and first_answer < k) for k in ks}
    if supporting_titles:
        sup = {_title_key(t) for t in supporting_titles}
        titles = [_title_key(h.title) for h in hits]
        for k in ks:
            out[f"support_recall@{k}"] = len(sup & set(titles[:k])) / len(sup)
    return out


@timed("retrieval")
def retrieval_quality(retriever: Retriever, rows: Sequence[dict], *, ks: Sequence[int] = KS, batch_size: int = 64,
                      show_progress: bool = False) -> dict[str, float]:
    """Mean recall@k over QA rows (FlashRAG format); support recall averages the rows that carry titles."""
    from tqdm import tqdm

    if not rows:
        raise ValueError("no questions to evaluate")
    sums: dict[str, float] = {}
    n_support = 0
    for lo in tqdm(range(0, len(rows), batch_size), desc="retrieval quality", unit="batch",
                   disable=not show_progress):
        batch = rows[lo:lo + batch_size]
        for row, hits in zip(batch, retriever.batch_search([r["question"] for r in batch], max(ks))):
            titles = (row.get("metadata") or {}).get("supporting_titles")
            n_support += bool(titles)
            for key, v in question_recall(hits, row["golden_answers"], titles, ks).items():
                sums[key] = sums.get(key, 0.0) + v
    out: dict[str, float] = {"n": len(rows), "n_with_support": n_support}
    for key in sorted(sums, key=lambda s: (s.split("@")[0], int(s.split("@")[1]))):
        denom = n_support if key.startswith("support") else len(rows)
        out[key] = round(sums[key] / denom, 4)
    return out
