"""IRCoT (Trivedi et al., ACL 2023) as FlashRAG runs it for MAPS Table 1.

Source read: RUC-NLPIR/FlashRAG `flashrag/pipeline/active_pipeline.py::IRCOTPipeline` (commit 16074be) and its
reproduction script `examples/methods/run_exp.py::ircot` (`max_iter=5`); the answer extraction is FlashRAG's
`flashrag/utils/pred_parse.py::ircot_pred_parse`. Control flow, per question, all questions advancing together:

1. retrieve top-k passages with the question (one batched search);
2. the reasoner writes the next thought from the passages, the question and the thoughts so far (one engine call
   over every unfinished question);
3. a thought containing `So the answer is:` ends the chain; otherwise the thought is the next query: its top-k
   passages join the reference, where a passage keeps its best score and the reference is sorted by score
   ascending (FlashRAG's order: the best passage sits last, next to the question);
4. at most `max_iterations` thoughts (FlashRAG's script: 5).

The prediction is FlashRAG's: the text after the first `So the answer is:` of the joined thoughts, or every
thought joined when no thought got there.

Where this differs from FlashRAG, and why:
- FlashRAG sends the prompt as plain text (`enable_chat=False`): instruction + demonstration, then the reference,
  question and `Thought:` with the thoughts so far appended. The project's engines take chat messages, so the
  instruction + demonstration is the system turn and the rest the user turn (text otherwise unchanged).
- No retrieval after the last allowed thought: FlashRAG's loop retrieves there too, but nothing reads those
  passages.
- The evidence is capped at `max_chunks` distinct passages (MAPS Sec. 4.1 caps every method at 20 chunks).
- An empty thought (FormatError) ends the chain: there is nothing to retrieve with, and greedy decoding on the
  unchanged prompt would write the same nothing again.
"""
from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from ragteam.agents.core import (LONG_ANSWER, FormatError, QueryPool, add_to_pool, clip_words, finish_episode, llm_step,
                                 new_episode, retrieve_step)
from ragteam.config import Strict
from ragteam.llm import Messages, Team
from ragteam.records import Episode
from ragteam.retrieval.base import Hit, Retriever

ROLE = "reasoner"

# FlashRAG's IRCoT instruction and its one demonstration, verbatim.
IRCOT_INSTRUCTION = (
    "You serve as an intelligent assistant, adept at facilitating users through complex, multi-hop reasoning "
    "across multiple documents. This task is illustrated through demonstrations, each consisting of a document "
    "set paired with a relevant question and its multi-hop reasoning thoughts. Your task is to generate one "
    "thought for current step, DON'T generate the whole thoughts at once! If you reach what you believe to be "
    "the final step, start with \"So the answer is:\".")

IRCOT_EXAMPLE = """Wikipedia Title: Kurram Garhi
Kurram Garhi is a small village located near the city of Bannu, which is the part of Khyber Pakhtunkhwa province of Pakistan. Its population is approximately 35000. Barren hills are near this village. This village is on the border of Kurram Agency. Other nearby villages are Peppal, Surwangi and Amandi Kala.

Wikipedia Title: 2001–02 UEFA Champions League second group stage
Eight winners and eight runners- up from the first group stage were drawn into four groups of four teams, each containing two group winners and two runners- up. Teams from the same country or from the same first round group could not be drawn together. The top two teams in each group advanced to the quarter- finals.

Wikipedia Title: Satellite tournament
A satellite tournament is either a minor tournament or event on a competitive sporting tour or one of a group of such tournaments that form a series played in the same country or region.

Wikipedia Title: Trojkrsti
Trojkrsti is a village in Municipality of Prilep, Republic of Macedonia.

Wikipedia Title: Telephone numbers in Ascension Island
Country Code:+ 247< br> International Call Prefix: 00 Ascension Island does not share the same country code( +290) with the rest of St Helena.

Question: Are both Kurram Garhi and Trojkrsti located in the same country?
Thought: Kurram Garhi is located in the country of Pakistan. Trojkrsti is located in the country of Republic of Macedonia. Thus, they are not in the same country. So the answer is: no.

"""  # noqa: E501

IRCOT_SYSTEM = f"{IRCOT_INSTRUCTION}\n\n{IRCOT_EXAMPLE}"
IRCOT_USER = "{reference}Question: {question}\nThought:"
REFERENCE = "Wikipedia Title: {title}\n{text}\n\n"
ANSWER_PREFIX = "So the answer is:"


class IRCoTConfig(Strict):
    """`eval.baselines.ircot` in params.yaml."""

    top_k: int = Field(5, ge=1)               # passages per retrieval (FlashRAG retrieval_topk 5)
    max_iterations: int = Field(5, ge=1)      # thoughts per question (FlashRAG's run_exp.py: max_iter=5)
    max_chunks: int = Field(20, ge=1)         # distinct passages kept per question (MAPS Sec. 4.1: 20)
    passage_words: int | None = Field(None, ge=1)  # clip passages in the prompt (None: whole passages)


def reference(hits: Sequence[Hit], passage_words: int | None = None) -> str:
    """FlashRAG's IRCoT reference block; the title line keeps its quotes, as FlashRAG's does."""
    return "".join(REFERENCE.format(title=h.contents.split("\n", 1)[0], text=clip_words(h.text, passage_words))
                   for h in hits)


def ircot_messages(question: str, hits: Sequence[Hit], thoughts: Sequence[str],
                   passage_words: int | None = None) -> Messages:
    user = IRCOT_USER.format(reference=reference(hits, passage_words), question=question)
    if thoughts:  # FlashRAG appends the thoughts so far after `Thought:`
        user += " " + " ".join(thoughts)
    return [{"role": "system", "content": IRCOT_SYSTEM}, {"role": "user", "content": user}]


def parse_thought(text: str) -> str | FormatError:
    """One reasoning step, as written (FlashRAG keeps the whole generation); empty -> FormatError."""
    thought = " ".join(text.split())
    return thought if thought else FormatError("empty thought")


def parse_ircot_answer(thoughts: Sequence[str]) -> str | FormatError:
    """FlashRAG's ircot_pred_parse: the text after the first `So the answer is:` of the joined thoughts (up to a
    second one); FormatError when no thought reached it (the workflow then answers with every thought joined)."""
    pred = " ".join(thoughts)
    if ANSWER_PREFIX not in pred:
        return FormatError(f"no {ANSWER_PREFIX!r} in the thoughts")
    return pred.split(ANSWER_PREFIX)[1].strip()


def _ranked(best: dict[str, float], pool: QueryPool) -> list[Hit]:
    """The pool's passages by best score, ascending; ties keep retrieval order."""
    hits = [h for hs in pool.hits for h in hs]
    order = {h.id: i for i, h in enumerate(hits)}
    return sorted(hits, key=lambda h: (best[h.id], order[h.id]))


def _merge(ep: Episode, pool: QueryPool, best: dict[str, float], query: str, hits: Sequence[Hit], max_chunks: int,
           call=None) -> None:
    add_to_pool(ep, pool, query, hits, max_chunks, call)
    kept = pool.doc_ids()  # passages past the cap never enter the reference
    for h in hits:
        if h.id in kept:  # a passage retrieved again keeps its best score
            best[h.id] = max(best.get(h.id, h.score), h.score)


def run_ircot(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: IRCoTConfig,
              *, system: str) -> list[Episode]:
    """Answer every row with interleaved retrieval and chain-of-thought; one Episode each."""
    eps = [new_episode(r, system) for r in rows]
    pools = [QueryPool() for _ in eps]
    best: list[dict[str, float]] = [{} for _ in eps]
    thoughts: list[list[str]] = [[] for _ in eps]
    for i, hits in enumerate(retrieve_step(retriever, eps, [e.question for e in eps], cfg.top_k)):
        _merge(eps[i], pools[i], best[i], eps[i].question, hits, cfg.max_chunks)

    stop = {i: "max_iterations" for i in range(len(eps))}
    active = list(range(len(eps)))
    for it in range(1, cfg.max_iterations + 1):
        if not active:
            break
        calls = llm_step(team, ROLE, [eps[i] for i in active],
                         [ircot_messages(eps[i].question, _ranked(best[i], pools[i]), thoughts[i], cfg.passage_words)
                          for i in active], parse_thought, iteration=it)
        searching = []
        for i, c in zip(active, calls):
            if c.format_error is not None:  # fallback: the chain ends (see the module docstring)
                stop[i] = "empty_thought"
                continue
            thoughts[i].append(c.parsed)
            if ANSWER_PREFIX in c.parsed:
                stop[i] = "answer"
            elif it < cfg.max_iterations:
                searching.append((i, c))
        hits = retrieve_step(retriever, [eps[i] for i, _ in searching], [c.parsed for _, c in searching], cfg.top_k)
        for (i, c), h in zip(searching, hits):
            _merge(eps[i], pools[i], best[i], c.parsed, h, cfg.max_chunks, call=c)
        active = [i for i, _ in searching]

    for i, ep in enumerate(eps):
        answer = parse_ircot_answer(thoughts[i])
        if isinstance(answer, FormatError):  # FlashRAG's fallback: the whole chain is the prediction
            ep.meta["answer_format_error"] = answer.reason
            answer = " ".join(thoughts[i])
        ep.final_answer = answer
        ep.meta.update(thoughts=thoughts[i], iterations=len(thoughts[i]), stop_reason=stop[i])
        finish_episode(ep, pools[i])
    return eps

# ---- the longest outputs each role must be able to write (budgets: ragteam.agents.core, tests/test_budgets.py) ----
# One thought per call, as the instruction asks: a hop of the chain, or the final step that starts with
# ANSWER_PREFIX. A thought cut by the budget still parses; one that would reach the answer later is the next query.

LONGEST_OUTPUTS: dict[str, tuple[str, ...]] = {
    ROLE: ("Hali Quiver, the director of The Lost Borben, works for Anzan Studios.",
           f"{ANSWER_PREFIX} {LONG_ANSWER}."),
}
