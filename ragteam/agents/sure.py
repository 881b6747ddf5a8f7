"""SuRe (Kim et al., ICLR 2024: Summarizing Retrievals using answer candidates) as FlashRAG runs it for MAPS Table 1.

Source read: RUC-NLPIR/FlashRAG `flashrag/pipeline/branching_pipeline.py::SuRePipeline` (commit 16074be).
Per question, every step one engine call over all questions (and all their candidates or pairs):

1. retrieve top-k passages with the question;
2. `candidate_generator`: two answer candidates `(a) xx, (b) yy` from the passages;
3. `summarizer`: per candidate, a passage from the retrieved ones that supports it;
4. `verifier`: per candidate, does its summary support it (True -> 1, else 0);
5. `ranker`: per ordered pair (i, j) of candidates, which summary is more informative: `Passage 1` -> 1,
   `Passage 2` -> 0, neither -> 0.5;
6. the answer is the candidate with the highest verifier + ranking score (the first one on a tie).

FlashRAG's ranking score of candidate i is the sum over j of the verdict on the pair with i shown FIRST only (its
`score_matrix[i, j]` row sums); a pair where i is shown second adds nothing to i. The SuRe paper also credits
i for winning as Passage 2; this module keeps FlashRAG's rule, the one MAPS's numbers come from.

Prompts are FlashRAG's, verbatim: its Python string pieces join without a space in several places
("After readingthe passages", "to thequestion"), and so do these. FlashRAG sends each as one user turn with no
system prompt. Where this module differs, and why:
- a summary is cut at `[DONE]` (the prompt asks the model to write it when done; FlashRAG keeps the raw text);
- `max_candidates` bounds the candidates per question (the ranking step costs n(n-1) calls; the prompt asks for
  two; null keeps every parsed candidate, as FlashRAG);
- empty candidates are dropped.
Fallbacks: no candidate parsed -> the empty answer (FlashRAG's); an empty summary -> the empty summary is verified
and ranked; a verdict without True/False -> 0 (FlashRAG: anything without "true" is 0); a ranking without
`Passage 1`/`Passage 2` -> 0.5 (FlashRAG's tie).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import permutations

from pydantic import Field

from ragteam.agents.core import FormatError, clip_words, finish_episode, llm_step, new_episode, retrieve_step
from ragteam.config import Strict
from ragteam.llm import Messages, Team
from ragteam.records import Episode
from ragteam.retrieval.base import Hit, Retriever

ROLES = ("candidate_generator", "summarizer", "verifier", "ranker")

# FlashRAG's four SuRe prompts, verbatim (the run-together words are FlashRAG's).
CANDIDATES_PROMPT = (
    "Below are {N} passages related to the question at the end. After readingthe passages, provide two correct "
    "candidates for the answer to thequestion at the end. Each answer should be in the form: (a) xx, (b)yy, and "
    "should not exceed 3 words for each candidate.\n\n{reference}Question: {question}\nAnswer:")
SUMMARY_PROMPT = (
    "Reference:\n{reference}\nYour job is to act as a professional writer. You need to write agood-quality passage "
    "that can support the given prediction about thequestion only based on the information in the provided "
    "supporting passages.\nNow, let's start. After you write, please write [DONE] to indicate youare done. Do not "
    "write a prefix (e.g., 'Response:') while writing a passage.\nQuestion: {question}\nPrediction: {pred}\n"
    "Passage:")
VALIDATION_PROMPT = ("Question: {question}\nPrediction: {pred}\nPassage: {summary}\nDoes the passage correctly "
                     "support the prediction? Choices: [True,False].\nAnswer:")
RANKING_PROMPT = (
    "Question: Given the following passages, determine which one provides amore informative answer to the "
    "subsequent question.\nPassage 1: {summary1}\nPassage 2: {summary2}\nTarget Question: {question}\nYour Task:\n"
    "Identify which passage (Passage 1 or Passage 2) is more relevant andinformative to answer the question at "
    "hand. Choices: [Passage 1,Passage 2].\nAnswer:")
DONE = "[DONE]"


class SuReConfig(Strict):
    """`eval.baselines.sure` in params.yaml."""

    top_k: int = Field(5, ge=1)                     # passages for the question (FlashRAG retrieval_topk 5)
    max_candidates: int | None = Field(None, ge=1)  # candidates kept per question (None: all parsed, as FlashRAG)
    passage_words: int | None = Field(None, ge=1)   # clip passages in the prompts (None: whole passages)


def reference(hits: Sequence[Hit], passage_words: int | None = None) -> str:
    """FlashRAG's SuRe reference block: `Passage #i Title:` / `Passage #i Text:` lines, a blank line after each."""
    out = []
    for i, h in enumerate(hits, start=1):
        title = h.contents.split("\n", 1)[0]  # the title line, quotes kept (as FlashRAG)
        out.append(f"Passage #{i} Title: {title}\nPassage #{i} Text: {clip_words(h.text, passage_words)}\n\n")
    return "".join(out)


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def candidates_messages(question: str, ref: str, n_passages: int) -> Messages:
    return _user(CANDIDATES_PROMPT.format(N=n_passages, reference=ref, question=question))


def summary_messages(question: str, ref: str, candidate: str) -> Messages:
    return _user(SUMMARY_PROMPT.format(reference=ref, question=question, pred=candidate))


def validation_messages(question: str, candidate: str, summary: str) -> Messages:
    return _user(VALIDATION_PROMPT.format(question=question, pred=candidate, summary=summary))


def ranking_messages(question: str, summary1: str, summary2: str) -> Messages:
    return _user(RANKING_PROMPT.format(summary1=summary1, summary2=summary2, question=question))


# ---- parsers ------------------------------------------------------------------------------------------------------

_CANDIDATE = re.compile(r"\(\w+\)\s*([^()]+)")  # "(a) xx, (b) yy": the text after each "(label)" up to the next "("


def parse_candidates(text: str) -> list[str] | FormatError:
    """The labelled candidates, in order: each its first line, commas removed (as FlashRAG), empty ones dropped."""
    cands = [m.split("\n")[0].replace(",", "").strip() for m in _CANDIDATE.findall(text.strip())]
    cands = [c for c in cands if c]
    return cands if cands else FormatError(f"no '(a) ...' candidate in {text.strip()[:80]!r}")


def parse_summary(text: str) -> str | FormatError:
    """The passage written before `[DONE]`."""
    summary = text.split(DONE, 1)[0].strip()
    return summary if summary else FormatError("empty summary")


def parse_validation(text: str) -> int | FormatError:
    """1 if the verdict says True, 0 if False (FlashRAG: "true" anywhere in the lower-cased reply wins)."""
    low = text.strip().lower()
    if "true" in low:
        return 1
    if "false" in low:
        return 0
    return FormatError(f"no True/False in {text.strip()[:80]!r}")


def parse_ranking(text: str) -> float | FormatError:
    """1.0 if Passage 1 is preferred, 0.0 if Passage 2 (FlashRAG checks `passage 1` first)."""
    low = text.strip().lower()
    if "passage 1" in low:
        return 1.0
    if "passage 2" in low:
        return 0.0
    return FormatError(f"no 'Passage 1'/'Passage 2' in {text.strip()[:80]!r}")


def pick(valid: Sequence[float], pair_scores: dict[tuple[int, int], float]) -> tuple[int, list[float]]:
    """(index of the best candidate, every candidate's score): verifier score + the sum of the verdicts on the
    pairs where the candidate is shown first; the first maximum wins a tie (numpy's argmax, as FlashRAG)."""
    totals = [valid[i] + sum(s for (a, _), s in pair_scores.items() if a == i) for i in range(len(valid))]
    return max(range(len(totals)), key=lambda i: (totals[i], -i)), totals


def run_sure(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: SuReConfig,
             *, system: str) -> list[Episode]:
    """Answer every row by summarising the passages for each answer candidate and picking the best-supported one."""
    eps = [new_episode(r, system) for r in rows]
    hits = retrieve_step(retriever, eps, [e.question for e in eps], cfg.top_k)
    refs = []
    for ep, h in zip(eps, hits):
        ep.queries.append(ep.question)
        ep.retrieved_ids.append([x.id for x in h])
        refs.append(reference(h, cfg.passage_words))

    calls = llm_step(team, "candidate_generator", eps, [candidates_messages(e.question, r, len(h))
                                                        for e, r, h in zip(eps, refs, hits)], parse_candidates)
    cands = [c.parsed[: cfg.max_candidates] if c.format_error is None else [] for c in calls]

    # one (episode, candidate) item per summary and verdict
    items = [(i, j) for i, cs in enumerate(cands) for j in range(len(cs))]
    sums = llm_step(team, "summarizer", [eps[i] for i, _ in items],
                    [summary_messages(eps[i].question, refs[i], cands[i][j]) for i, j in items], parse_summary)
    summary = {it: (c.parsed if c.format_error is None else "") for it, c in zip(items, sums)}
    verdicts = llm_step(team, "verifier", [eps[i] for i, _ in items],
                        [validation_messages(eps[i].question, cands[i][j], summary[i, j]) for i, j in items],
                        parse_validation)
    valid = {it: (c.parsed if c.format_error is None else 0) for it, c in zip(items, verdicts)}

    pairs = [(i, a, b) for i, cs in enumerate(cands) for a, b in permutations(range(len(cs)), 2)]
    ranks = llm_step(team, "ranker", [eps[i] for i, _, _ in pairs],
                     [ranking_messages(eps[i].question, summary[i, a], summary[i, b]) for i, a, b in pairs],
                     parse_ranking)
    pair_scores: list[dict[tuple[int, int], float]] = [{} for _ in eps]
    for (i, a, b), c in zip(pairs, ranks):
        pair_scores[i][a, b] = c.parsed if c.format_error is None else 0.5

    for i, ep in enumerate(eps):
        cs = cands[i]
        if cs:
            v = [valid[i, j] for j in range(len(cs))]
            best, totals = pick(v, pair_scores[i])
            ep.final_answer = cs[best]
            ep.meta.update(candidates=cs, summaries=[summary[i, j] for j in range(len(cs))], valid=v,
                           scores=totals, chosen=best)
        else:  # fallback: no candidate, the empty answer (FlashRAG's)
            ep.final_answer = ""
            ep.meta.update(candidates=[], no_answer_reason="no candidate parsed: empty answer by construction (FlashRAG "
                                                    "SuRe's fallback)")
        finish_episode(ep)
    return eps

# ---- the longest outputs each role must be able to write (budgets: ragteam.agents.core, tests/test_budgets.py) ----
# Two candidates of at most 3 words each (the prompt's limit), the verdicts and the ranking. The summarizer is not
# listed: it writes a free passage (anything before `[DONE]` parses, a cut one too), its budget bounds it by design.

LONGEST_OUTPUTS: dict[str, tuple[str, ...]] = {
    "candidate_generator": ("(a) Thomas Lawley Baronet, (b) Robert Lawley Baronet",),
    "verifier": ("True", "False"),
    "ranker": ("Passage 1", "Passage 2"),
}
