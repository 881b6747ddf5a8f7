"""QAgent prompt (Table 5, verbatim), the text the environment injects, and the parser of one agent turn.

QAgent (Jiang et al.) is one agent that loops plan -> search (<= 3 queries) -> information -> reflection over a
fixed retriever and ends with an answer (Sec. 3.2, Algorithm 1). Its trajectory is one growing assistant message:
the model writes until `</search>`, `</answer>` or EOS; the environment appends an `<information>` block after a
search, or a retry text after a turn with neither tag.

The template is Table 5 as extracted from the paper, with two readings of the extraction (both noted in
shared/papers/qagent.md): the placeholder `{questionquestion}` is `{question}`, and the `\\n` escapes in the two
inline examples are newlines (the table prints a Python string literal). Everything else is kept as extracted,
including `<search >`, `planing`, the `<reflect>` / `<reflection>` mismatch and the missing spaces around tags.
The prompt is the user message; the chat template's default system prompt is kept (the paper does not state one).

Not in the paper, designed here (see `fallback_turn`, `PROMPT_RETHINK`, `information_block`):
- `prompt_rethink`, the retry text of Algorithm 1: PROMPT_RETHINK, written in the agent's first person because it
  is appended inside the agent's own turn (the framing of Search-R1's invalid-action message, on which QAgent's
  framework is based), restating QAgent's tag protocol. It names the tags but writes no closing tag: a model that
  parrots it must not hit the `</search>` / `</answer>` stop strings (measured with an earlier wording that did:
  the base SmolLM2 copied it and "searched" for the word "and").
- The `<information>` layout: Search-R1's (`\\n\\n<information>Doc i(Title: t) text\\n...</information>`), passages
  of all queries of the turn numbered in order (Eq. 5: the results of the sub-queries concatenated), closed by one
  newline where Search-R1 has two: a trailing `\\n\\n` tokenises as one token at the end of a prompt but as two
  before the agent's next `<reflection>`, a single `\\n` the same both ways (byte-level BPE pre-tokenisation), so
  the ids the engine sees and the ids training uses agree (`workflow.trajectory_tokens`).
- Fallbacks when a turn does not follow the format (the turn keeps its `format_error`, so the stage-1 format gate
  fails, and the workflow still acts as Algorithm 1 would):
  - neither a `<search>…</search>` nor an `<answer>…</answer>` block: the retry text (Algorithm 1's else branch);
  - a search block without `<query>` children: its inner text is the one query (Search-R1's single-query format);
    an empty block: the retry text;
  - more than `max_queries` queries: the first `max_queries` are run (the prompt says "no more than 3");
  - a search without a preceding `<plan>`, a turn after `<information>` without a `<reflection>` (or `<reflect>`),
    or `<information>` written by the agent itself: the action is carried out as written;
  - an empty `<answer></answer>`: the episode ends with the empty answer (Algorithm 1 stops on answer tags).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from ragteam.agents.core import LONG_ANSWER, FormatError, clip_words
from ragteam.llm import Messages
from ragteam.retrieval.base import Hit

# ---- Table 5: the instruction prompt (verbatim as extracted; see the module docstring) ----------------------------

QAGENT_PROMPT = """Search for information to answer the given question. You can search as many times as needed if you find you lack some knowledge. You will go through a loop of:
“<plan>xxx</plan>
<search >xxx</search>
<information>xxx</information>
<reflection>xxx </reflection>
<plan>xxx</plan>(if not complete)
<reflection>xxx </reflection>
<answer>xxx</answer>”.
You must conduct planning inside <plan>and </plan>first every time you call a search engine.
After planing, you can call a search engine to search multiple queries (no more than 3) by
<search>
<query>query1</query>
<query>query2</query>
<query>queryk</query>
</search>,
and it will return the searched results between <information>and </information>.
After getting information, you must conduct a reflection on the information and place your reflection between the <reflection>and </reflection>tags.
Note that you must plan within <plan>and </plan>before searching, and reflect within <reflect>and </reflect>after receiving information.
Note that each query must be enclosed between <query>and </query>, and all queries must be placed between <search>and </search>, such as <search>
 <query>query1</query>
 <query>query2</query>

 <query>queryk</query>
 </search>.
If the task is not yet complete, begin a new <plan>.
If you find no further external knowledge needed, you can directly provide the answer inside <answer>and </answer>without detailed illustrations.
For example, <answer>
 xxx
 </answer>.
The answer, “xxx”, should be a few short words.
Question: {question}."""

# Algorithm 1: generation stops at these strings (or EOS); the stop string is kept in the recorded turn.
SEARCH_END, ANSWER_END = "</search>", "</answer>"
STOP_STRINGS = (SEARCH_END, ANSWER_END)
MAX_QUERIES = 3  # "search multiple queries (no more than 3)"

# Algorithm 1's `prompt_rethink` (text not stated in the paper; designed here, see the module docstring).
PROMPT_RETHINK = ("\nMy previous action is invalid. If I need more information, I should first write a plan in a "
                  "<plan> block, then search with at most 3 queries, each in its own <query> block, all inside one "
                  "<search> block. If I have enough information, I should give the final answer in an <answer> "
                  "block. Let me try again.\n")

NO_RESULTS = "No documents found."


def agent_messages(question: str) -> Messages:
    """The first prompt of a trajectory: Table 5 as the user message."""
    return [{"role": "user", "content": QAGENT_PROMPT.format(question=question)}]


def continue_messages(question: str, trajectory: str) -> Messages:
    """A later turn's prompt: the trajectory so far as a partial assistant message that generation continues."""
    msgs = agent_messages(question)
    if trajectory:
        msgs.append({"role": "assistant", "content": trajectory})
    return msgs


def information_block(hits_per_query: Sequence[Sequence[Hit]], passage_words: int | None = None) -> str:
    """What the environment appends after a search turn: every query's passages, in query order (Eq. 5)."""
    hits = [h for hs in hits_per_query for h in hs]
    body = "\n".join(f"Doc {i}(Title: {h.title}) {clip_words(h.text, passage_words)}"
                     for i, h in enumerate(hits, start=1)) or NO_RESULTS
    return f"\n\n<information>{body}</information>\n"


# ---- parser of one turn -------------------------------------------------------------------------------------------

_SEARCH_OPEN = re.compile(r"<\s*search\s*>", re.IGNORECASE)
_ANSWER_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_QUERY = re.compile(r"<\s*query\s*>(.*?)<\s*/\s*query\s*>", re.IGNORECASE | re.DOTALL)
_PLAN = re.compile(r"<\s*plan\s*>.*?<\s*/\s*plan\s*>", re.IGNORECASE | re.DOTALL)
_REFLECTION = re.compile(r"<\s*(reflection|reflect)\s*>.*?<\s*/\s*\1\s*>", re.IGNORECASE | re.DOTALL)
_INFORMATION = re.compile(r"<\s*/?\s*information\s*>", re.IGNORECASE)


def _squash(text: str) -> str:
    return " ".join(text.split())


def _split_block(turn: str, opener: re.Pattern, closer: str) -> tuple[str, str] | None:
    """(text before the block, the block's inner text) when `turn` ends with `closer` after an opening tag."""
    body = turn.rstrip()
    if not body.endswith(closer):
        return None
    body = body[: -len(closer)]
    opens = list(opener.finditer(body))
    if not opens:
        return None
    return body[: opens[-1].start()], body[opens[-1].end():]


def parse_turn(turn: str, after_information: bool = False, max_queries: int = MAX_QUERIES) -> dict | FormatError:
    """One generated turn (ending in its stop string, if any) -> {"action": "search", "queries": [...]} or
    {"action": "answer", "answer": "..."}; anything off the paper's format is a FormatError (`fallback_turn` says
    what the workflow then does).

    The format: a search turn holds a `<plan>…</plan>` before `<search>` and 1..max_queries non-empty
    `<query>…</query>` inside it; an answer turn ends with a non-empty `<answer>…</answer>`; a turn that follows an
    `<information>` block holds a `<reflection>…</reflection>` (or the prompt's `<reflect>` spelling) before its
    action; the agent never writes `<information>` itself.
    """
    search = _split_block(turn, _SEARCH_OPEN, SEARCH_END)
    answer = None if search else _split_block(turn, _ANSWER_OPEN, ANSWER_END)
    if search is None and answer is None:
        return FormatError("neither <search>…</search> nor <answer>…</answer>" if turn.strip() else "empty turn")
    before, inner = search or answer
    if _INFORMATION.search(turn):
        return FormatError("the agent wrote an <information> tag itself")
    if after_information and not _REFLECTION.search(before):
        return FormatError("no <reflection> after <information>")
    if answer is not None:
        text = _squash(inner)
        return {"action": "answer", "answer": text} if text else FormatError("empty <answer>")
    if not _PLAN.search(before):
        return FormatError("no <plan> before <search>")
    queries = [q for q in (_squash(m) for m in _QUERY.findall(inner)) if q]
    if not queries:
        return FormatError("<search> without a non-empty <query>")
    if len(queries) > max_queries:
        return FormatError(f"{len(queries)} queries in one <search> (at most {max_queries})")
    return {"action": "search", "queries": queries}


def fallback_turn(turn: str, max_queries: int = MAX_QUERIES) -> dict:
    """What the workflow does with a turn `parse_turn` rejected (module docstring): the action as far as it can be
    read, else {"action": "retry"}."""
    search = _split_block(turn, _SEARCH_OPEN, SEARCH_END)
    if search is not None:
        inner = search[1]
        queries = [q for q in (_squash(m) for m in _QUERY.findall(inner)) if q]
        if not queries and not _QUERY.search(inner) and _squash(inner):
            queries = [_squash(inner)]
        return {"action": "search", "queries": queries[:max_queries]} if queries else {"action": "retry"}
    answer = _split_block(turn, _ANSWER_OPEN, ANSWER_END)
    if answer is not None:
        return {"action": "answer", "answer": _squash(answer[1])}
    return {"action": "retry"}


# ---- the longest outputs each role must be able to write (budgets: ragteam.agents.core, tests/test_budgets.py) ----
# One turn each (the budget is per turn, llm.sampling.qagent): a first search with MAX_QUERIES queries, a turn after
# <information> (reflection, plan, MAX_QUERIES queries), and an answer turn; each ends with its stop string.

LONGEST_OUTPUTS: dict[str, tuple[str, ...]] = {
    "qagent": (
        "<plan>Find the director of The Lost Borben, the company that employs him and its country.</plan>\n<search>\n"
        "<query>The Lost Borben director</query>\n<query>Hali Quiver employer</query>\n"
        "<query>Anzan Studios headquarters</query>\n</search>",
        "<reflection>Hali Quiver directed The Lost Borben; his employer is not known yet.</reflection>\n"
        "<plan>Find the company that employs Hali Quiver and the country of its headquarters.</plan>\n<search>\n"
        "<query>Hali Quiver employer</query>\n<query>Anzan Studios headquarters</query>\n"
        "<query>Benel country</query>\n</search>",
        "<reflection>Anzan Studios is headquartered in Benel, a city of Rucaia.</reflection>\n"
        f"<answer>\n{LONG_ANSWER}\n</answer>",
    ),
}
