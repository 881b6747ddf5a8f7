"""DECOR prompts (Appendix A, verbatim) and the parsers of every role's output.

Roles (one shared policy, the role set by the prompt): `decor_planner` (A.1), `decor_filter` (A.2), `decor_answerer`
(A.3), plus `decor_summarizer`, the frozen utility model of the memory-compression protocol (Sec. 4.2; its prompt
is not in the paper, `SUMMARIZER_PROMPT` is this project's). The prompts are the paper's text with its PDF artifacts
repaired (`|` -> em dash, stripped braces restored as `{query}` etc.); each is sent as one user message.

Unstated in the paper and chosen here:
- History serialisation (`history_search_information`): `render_memory`, one numbered block per memory entry,
  `Search i: <query>` then `Information: <filtered evidence>`; an empty memory is `EMPTY_HISTORY`.
- Retrieval results for the Filter (`retrieval_result`): `render_docs`, `Doc j(Title: "..."): text` lines (the
  project's passage layout, `QueryPool.render`), each clipped to `passage_words`.

Format validity (the format gate, Sec. 4.3): the response is exactly one `<think>...</think>` block followed by
exactly one `<search>` / `<filter>` / `<answer>` block, nothing but whitespace outside them, tags not duplicated, and
a non-empty final block that is not the prompt's own bracketed placeholder. Anything else is a `FormatError`.

Fallbacks, applied by the workflow only when it does not truncate the episode (evaluation; training truncates,
Sec. 4.3). Each starts from `salvage(text, tag)`: the content of the role's tag when the response opened it (closed
or cut off; reasoning in `<think>` and stray tags dropped), else nothing. Text outside any role tag is not taken as
a query or evidence: a model that ignores the format mostly restates the prompt (measured with SmolLM2-135M).
- Planner: the first salvaged line (<= `MAX_QUERY_WORDS` words) is the query; nothing salvaged, or `None`, stops
  the search, except in turn 1 (empty memory, rule 6) where the question itself is the query.
- Filter: the salvaged text as one paragraph; nothing salvaged: no evidence (the memory still records the query).
- Answerer: the salvaged text, or else the whole response without its reasoning, through MAPS' lenient
  `parse_answer` (first line, "Answer:" label removed), as the other systems read this model's answers; else "".
- Summarizer: the memory is kept as it was (over the budget for this turn; `t_max` bounds it).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ragteam.agents.core import LONG_ANSWER, FormatError, clip_words, first_line
from ragteam.agents.answer import parse_answer as _plain_answer
from ragteam.llm import Messages
from ragteam.retrieval.base import Hit

PLANNER, FILTER, ANSWERER, SUMMARIZER = "decor_planner", "decor_filter", "decor_answerer", "decor_summarizer"
POLICY_ROLES = (PLANNER, FILTER, ANSWERER)  # the roles of the shared trained policy; the summarizer stays frozen

# ---- Appendix A: the three role prompts --------------------------------------------------------------------------

PLANNER_PROMPT = """You are the planner for a question-answering system.
Your task is to formulate the most precise and minimal search query needed to retrieve the missing factual information required to answer the user's question.
You are given:
- The current user query
- History of previous search queries and their results (if any)
Follow these rules strictly:
1. Your ONLY goal is to identify the exact factual gap that prevents answering the query, and express it as a concise, natural-language search string.
2. The search string must include all essential constraints from the user's query (e.g., names, years, categories like "country music duo", relationships like "covered by").
3. Do NOT issue broad or exploratory queries (e.g., "Kelly Willis song covers"). Instead, construct a query that directly targets the missing fact.
4. Never repeat a search that already appears in the history.
5. If the history already contains enough information to answer the query, output <search>None</search>.
6. If history is empty, you MUST output a search query that encodes the full set of constraints from the user's question.
7. Output ONLY in the following format—no extra text:
<think>
[Explain which specific fact is missing and why your search query includes all necessary constraints to retrieve it.]
</think>
<search>
[your precise search query]
</search>
Input:
query: {query}
history search information: {history_search_information}"""

FILTER_PROMPT = """You are a strict information filter. Your job is to process the retrieval results and produce a single, coherent paragraph that preserves all and only the information necessary to support answering the user's query—especially any facts required to derive the golden answer.
Follow these rules precisely:
1. Relevance: Keep every sentence or phrase that is directly or indirectly relevant to the search query. If a piece of information could help justify or support the golden answer, keep it—even if it seems minor.
2. No Irrelevant Content: Remove any content that has no connection to the query or golden answer. Do not comment on removals.
3. Deduplication: If the same fact appears multiple times, keep only one clear, complete version.
4. Coherence: Combine all kept information into one smooth, flowing paragraph (no bullet points, no line breaks, no numbered lists).
5. Factual Fidelity: Do NOT change, paraphrase, summarize, or omit specific factual details such as:
- Names (e.g., "The Kendalls")
- Dates (e.g., "1977")
- Numbers (e.g., "#1 hit", "#63")
- Titles (e.g., "Heaven's Just a Sin Away")
- Descriptive qualifiers (e.g., "country music duo", "electronic dance-pop style")
Preserve them exactly as they appear, unless they are duplicated.
6. No Commentary: Do not add explanations, inferences, or reasoning (e.g., "this implies...", "likely referring to..."). Only present what is stated.
7. Output Format: Your response must strictly follow:
<think>
[Your internal reasoning—explain which parts you kept, which you removed, and why based on the rules above.]
</think>
<filter>
[Your final integrated paragraph—only factual content, one paragraph.]
</filter>
Input:
Search Query: {query}
Retrieval Results: {retrieval_result}"""

ANSWERER_PROMPT = """You are an assistant who answers user queries strictly based on provided search information.
Follow these rules:
1. All your reasoning must appear ONLY between <think> and </think>. Do NOT write any reasoning, analysis, or text outside these tags.
2. Your final answer must appear ONLY between <answer> and </answer>.
The answer should be clear, concise, and directly respond to the query (e.g., a name, date, or short phrase). Do NOT add explanations.
3. Use the historical search information to:
- Identify relevant facts,
- Resolve conflicts if present,
- Derive the answer step by step.
4. Your entire response must have exactly this structure—nothing before, between, or after the tags:
<think>
[Your complete step-by-step reasoning here. Explain how you used the search info to reach the answer.]
</think>
<answer>
[Your final answer only—no extra words.]
</answer>
Current task:
- User's query: {query}
- History search information: {history_search_information}"""


# Memory compression (Sec. 4.2, Alg. 1 line 14): the paper names no model and no prompt; this one is the project's.
SUMMARIZER_PROMPT = """Rewrite the search history below as a short list of atomic facts. Keep names, dates, numbers and titles exactly as written. Do not add reasoning, inferences or facts that are not in the history. Output only the facts, one per line.
Search history:
{history}"""

STOP_QUERY = "None"             # <search>None</search>: the Planner's STOP action (A.1 rule 5)
EMPTY_HISTORY = "(empty)"
NO_RESULTS = "(no results)"
MAX_QUERY_WORDS = 32            # a salvaged (fallback) query is cut to this many words

_PLACEHOLDERS = {  # the templates' own bracketed placeholders, echoed by small models
    "search": "[your precise search query]",
    "filter": "[Your final integrated paragraph—only factual content, one paragraph.]",
    "answer": "[Your final answer only—no extra words.]",
}


@dataclass(frozen=True)
class MemoryEntry:
    """One entry of M: a search query and its filtered evidence; a summary entry holds the queries it condensed."""

    queries: tuple[str, ...]
    evidence: str
    summary: bool = False

    def to_dict(self) -> dict:
        return {"queries": list(self.queries), "evidence": self.evidence, "summary": self.summary}

    @classmethod
    def from_dict(cls, d: dict) -> MemoryEntry:
        return cls(tuple(d["queries"]), d["evidence"], bool(d.get("summary", False)))


def render_memory(memory: Sequence[MemoryEntry]) -> str:
    """The `history_search_information` string: `Search i: q` / `Information: e` blocks, queries numbered in order."""
    if not memory:
        return EMPTY_HISTORY
    blocks, n = [], 0
    for m in memory:
        first, n = n + 1, n + len(m.queries)
        head = (f"Search {first}: {m.queries[0]}" if len(m.queries) == 1
                else f"Searches {first}-{n}: " + "; ".join(m.queries))
        label = "Information (summarised)" if m.summary else "Information"
        blocks.append(f"{head}\n{label}: {m.evidence or '(nothing relevant kept)'}")
    return "\n\n".join(blocks)


def history_evidence(history: str) -> str:
    """The evidence part of a rendered memory (its `Information...:` lines), without the search queries."""
    return "\n".join(m.group(1) for m in re.finditer(r"^Information[^:\n]*: (.*)$", history, flags=re.MULTILINE))


def memory_words(memory: Sequence[MemoryEntry]) -> int:
    """|M| for the L_max test, in whitespace tokens of the rendered memory (the Engine has no tokenizer)."""
    return len(render_memory(memory).split()) if memory else 0


def render_docs(hits: Sequence[Hit], passage_words: int | None = None) -> str:
    if not hits:
        return NO_RESULTS
    return "\n".join(f'Doc {j}(Title: "{h.title}"): {clip_words(h.text, passage_words)}'
                     for j, h in enumerate(hits, start=1))


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def planner_messages(question: str, memory: Sequence[MemoryEntry]) -> Messages:
    return _user(PLANNER_PROMPT.format(query=question, history_search_information=render_memory(memory)))


def filter_messages(search_query: str, retrieval_result: str) -> Messages:
    return _user(FILTER_PROMPT.format(query=search_query, retrieval_result=retrieval_result))


def answerer_messages(question: str, memory: Sequence[MemoryEntry]) -> Messages:
    return _user(ANSWERER_PROMPT.format(query=question, history_search_information=render_memory(memory)))


def summarizer_messages(memory: Sequence[MemoryEntry]) -> Messages:
    return _user(SUMMARIZER_PROMPT.format(history=render_memory(memory)))


# ---- parsers ------------------------------------------------------------------------------------------------------

_TAG = re.compile(r"</?([A-Za-z_]+)>")


def parse_blocks(text: str, tag: str) -> str | FormatError:
    """The content of `<tag>` in a well-formed `<think>...</think><tag>...</tag>` response (see the module doc)."""
    if not text.strip():
        return FormatError("empty response")
    for t in ("think", tag):
        n_open, n_close = text.count(f"<{t}>"), text.count(f"</{t}>")
        if n_open == 0:
            return FormatError(f"no <{t}> block")
        if n_close == 0:
            return FormatError(f"<{t}> not closed")
        if n_open > 1 or n_close > 1:
            return FormatError(f"<{t}> duplicated")
    m = re.fullmatch(rf"\s*<think>(.*?)</think>\s*<{tag}>(.*?)</{tag}>\s*", text, flags=re.DOTALL)
    if m is None:
        return FormatError(f"text outside the <think> and <{tag}> blocks, or blocks out of order")
    content = m.group(2).strip()
    if _TAG.search(content) or _TAG.search(m.group(1)):
        return FormatError("tags nested inside a block")
    if not content:
        return FormatError(f"empty <{tag}> block")
    if content == _PLACEHOLDERS[tag]:
        return FormatError(f"<{tag}> holds the prompt's placeholder")
    return content


def _one_paragraph(text: str) -> str:
    return " ".join(text.split())


def parse_planner(text: str) -> dict | FormatError:
    """`{"action": "search", "query": q}`, or `{"action": "stop"}` for `<search>None</search>` (A.1 rule 5)."""
    content = parse_blocks(text, "search")
    if isinstance(content, FormatError):
        return content
    query = _one_paragraph(content)
    if query.strip("\"'`.[]").lower() == STOP_QUERY.lower():
        return {"action": "stop"}
    return {"action": "search", "query": query}


def parse_filter(text: str) -> str | FormatError:
    """The evidence paragraph e_t (line breaks collapsed into one paragraph, as rule 4 asks)."""
    content = parse_blocks(text, "filter")
    return content if isinstance(content, FormatError) else _one_paragraph(content)


def parse_answerer(text: str) -> str | FormatError:
    """The final answer a_final inside `<answer>`, whitespace collapsed."""
    content = parse_blocks(text, "answer")
    return content if isinstance(content, FormatError) else _one_paragraph(content)


def parse_summary(text: str) -> str | FormatError:
    """The summarizer's facts as one paragraph (list markers dropped); only an empty output is malformed."""
    facts = [re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", ln).strip() for ln in text.splitlines()]
    facts = [f for f in facts if f]
    return " ".join(facts) if facts else FormatError("empty summary")


# ---- fallbacks (see the module docstring) -------------------------------------------------------------------------

def _without_think(text: str) -> str:
    return re.sub(r"<think>.*?(?:</think>|\Z)", "\n", text, flags=re.DOTALL)


def salvage(text: str, tag: str) -> str | None:
    """The content of `<tag>` in a malformed response (closed or cut off, `<think>` and stray tags dropped);
    None when the response never opened `<tag>` outside its reasoning."""
    m = re.search(rf"<{tag}>(.*?)(?:</{tag}>|\Z)", _without_think(text), flags=re.DOTALL)
    return _TAG.sub(" ", m.group(1)).strip() if m else None


def fallback_planner(text: str, question: str, turn: int) -> dict:
    query = " ".join(first_line(salvage(text, "search") or "").split()[:MAX_QUERY_WORDS])
    if query and query.strip("\"'`.[]").lower() != STOP_QUERY.lower():
        return {"action": "search", "query": query}
    return {"action": "search", "query": question} if turn == 1 else {"action": "stop"}


def fallback_filter(text: str) -> str:
    return _one_paragraph(salvage(text, "filter") or "")


def fallback_answerer(text: str) -> str:
    got = salvage(text, "answer")
    ans = _plain_answer(got if got is not None else _TAG.sub(" ", _without_think(text)))
    return "" if isinstance(ans, FormatError) else ans


# ---- the longest outputs each role must be able to write (budgets: ragteam.agents.core, tests/test_budgets.py) ----
# In the templates' layout (tags on their own lines), with one realistic sentence of reasoning in <think>; the LLM
# judge (`decor.judge: llm`, role workflow.JUDGE_ROLE) answers YES / NO (Appendix B, parsed by
# ragteam.systems.decor.rewards.parse_verdict). The frozen summarizer is not listed: it has no format to complete (any
# non-empty paragraph parses), its budget bounds a summary by design.

LONGEST_OUTPUTS: dict[str, tuple[str, ...]] = {
    PLANNER: ("<think>\nThe history is empty, so the film's director, his employer and its headquarters country are "
              "all missing.\n</think>\n<search>\ncountry where the company employing the director of The Lost Borben "
              "is headquartered\n</search>",),
    # one evidence sentence of realistic length
    FILTER: ("<think>\nDoc 1 names the director of The Lost Borben and his employer; the other documents are "
             "unrelated.\n</think>\n<filter>\nHali Quiver, the director of The Lost Borben, works for Anzan Studios, "
             "which is headquartered in Benel, Rucaia.\n</filter>",),
    ANSWERER: ("<think>\nThe history says Hali Quiver directed The Lost Borben and works for Anzan Studios, "
               f"headquartered in Benel, Rucaia.\n</think>\n<answer>\n{LONG_ANSWER}\n</answer>",),
    "decor_judge": ("YES", "NO"),
}
