"""MAPS prompts (verbatim from the paper, Appendix A.1 inference and B debate) and the parsers of every role's output.

Templates are data: `{question}`, `{query_pool}`, `{proponent}`, `{opponent}` are filled by the `*_messages`
builders; the query pool is rendered by `QueryPool.render` in the paper's layout (`Query i: ...`,
`Retrieved Content:`, `Doc j(Title: "..."): ...`). Parsers are pure functions: text in, value or `FormatError` out.

Fallbacks, applied by the workflows when a parser returns FormatError (documented here, next to the parsers):
- query agent: the question's own keywords (`keywords(question)`) become the new query, so the round still retrieves.
- judge agent: `Insufficient Information`: keep retrieving; the round budget and the 20-chunk cap bound the cost.
- answer agent: the empty answer (scores 0).
- opponent: `Concede` (nothing to retrieve, the debate ends).
- moderator: `Proponent` (the debate ends with the current pool).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# the answer agent's parser is the one every answering role shares (re-exported: `maps.parse_answer`)
from ragteam.agents.answer import (LEAD_IN_ERROR, MAX_ANSWER_WORDS, STOPWORDS, _WORD,  # noqa: F401
                                   is_lead_in, is_stub, parse_answer)
from ragteam.agents.core import LONG_ANSWER, FormatError, first_line
from ragteam.llm import Messages

# ---- Appendix A.1: inference prompts ---------------------------------------------------------------------------

QUERY_AGENT_SYSTEM = """You are a retrieval query generation agent.
Input:
QUESTION: ...
EXISTING QUERIES and RETRIEVED DOCUMENTS: ...
Task:
Generate exactly one NEW QUERY that:
1) Directly helps answer the QUESTION or fill gaps not covered by EXISTING QUERIES and RETRIEVED DOCUMENTS;
2) Is different from all EXISTING QUERIES.
Output rules:
Only keywords; no sentences, stopwords, or connectors (e.g., and, or, of, the, about).
Separate keywords with a single space;
Maximum 8 keywords.
Output: Only the NEW QUERY text. No explanations or extra text."""

JUDGE_AGENT_SYSTEM = ("Determine whether the EXISTING QUERIES and RETRIEVED DOCUMENTS provide sufficient information "
                      "to answer the QUESTION correctly. Output only one of the following: 'Sufficient Information' "
                      "or 'Insufficient Information'. Do not include explanations or additional text.")

ANSWER_AGENT_SYSTEM = ("Answer the question based on the given document. Output only the final answer with no "
                       "explanations or additional text.\n\nQuery Pool:\n{query_pool}")

POOL_USER = "Question: {question}\nQuery Pool:\n{query_pool}"
ANSWER_USER = "Question: {question}"

SUFFICIENT = "Sufficient Information"
INSUFFICIENT = "Insufficient Information"

# ---- Appendix B: retrieval-debate prompts (DRAG, used for data synthesis and as a baseline) ----------------------

PROPONENT_SYSTEM = ("You are a debater. Argue that the current retrieved content is sufficient to answer the question "
                    "and try to give the answer based on the given documents. Deliver a brief, strong argument with "
                    "clear reasoning. Do not suggest further retrieval. No extra explanations.")

OPPONENT_SYSTEM = """You are a critical thinker and debater. Your task is to challenge the sufficiency of the current documents. However, your ultimate goal is to find the correct answer efficiently. If you believe the provided information is TRULY and COMPLETELY sufficient, your duty is to concede.
The action you can choose:
1. Query Expansion: If a completely new line of inquiry is needed. Output exactly in this format in the end of your response: Query Expansion: [New Query]
2. Concede: If the current information is truly sufficient. Only Output: Concede
Deliver a brief, strong argument, then you must choose one action in the exact format required."""

MODERATOR_SYSTEM = """You are the judge in a debate. Your task is to evaluate the arguments from agents. There are two types of agents:
1. Proponent Agent: Argues that the current retrieved content is sufficient.
2. Opponent Agent: Argues that the current retrieved content is insufficient and proposes query refinement."""

MODERATOR_USER = ("Question: {question}\nQuery Pool:\n{query_pool}\nProponent:\n{proponent}\nOpponent:\n{opponent}\n\n"
                  "Output only the agent's name. Do NOT output more than one agent or any explanation.")

PROPONENT, OPPONENT = "Proponent", "Opponent"


def _chat(system: str, user: str) -> Messages:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def query_messages(question: str, query_pool: str) -> Messages:
    return _chat(QUERY_AGENT_SYSTEM, POOL_USER.format(question=question, query_pool=query_pool))


def judge_messages(question: str, query_pool: str) -> Messages:
    return _chat(JUDGE_AGENT_SYSTEM, POOL_USER.format(question=question, query_pool=query_pool))


def answer_messages(question: str, query_pool: str) -> Messages:
    return _chat(ANSWER_AGENT_SYSTEM.format(query_pool=query_pool), ANSWER_USER.format(question=question))


def proponent_messages(question: str, query_pool: str) -> Messages:
    return _chat(PROPONENT_SYSTEM, POOL_USER.format(question=question, query_pool=query_pool))


def opponent_messages(question: str, query_pool: str) -> Messages:
    return _chat(OPPONENT_SYSTEM, POOL_USER.format(question=question, query_pool=query_pool))


def moderator_messages(question: str, query_pool: str, proponent: str, opponent: str) -> Messages:
    return _chat(MODERATOR_SYSTEM, MODERATOR_USER.format(question=question, query_pool=query_pool,
                                                         proponent=proponent.strip(), opponent=opponent.strip()))


# ---- parsers ------------------------------------------------------------------------------------------------------

MAX_KEYWORDS = 8
_QUERY_LABEL = re.compile(r"^\s*(?:new\s+query|query(?:\s*\d+)?|keywords?|output|search(?:\s+query)?|question)"
                          r"\s*[:：\-]\s*", re.IGNORECASE)  # small models often echo the prompt's "Question:"
_LEAD_IN = re.compile(r"^\s*(?:sure|okay|ok|here\s+(?:is|are)|certainly)\b", re.IGNORECASE)


def keywords(text: str, max_keywords: int = MAX_KEYWORDS) -> str:
    """At most `max_keywords` distinct words of `text`, stopwords and punctuation dropped, order kept."""
    out, seen = [], set()
    for w in _WORD.findall(text):
        key = w.lower()
        if key in STOPWORDS or key in seen:
            continue
        seen.add(key)
        out.append(w)
        if len(out) == max_keywords:
            break
    return " ".join(out)


def parse_query(text: str, max_keywords: int = MAX_KEYWORDS) -> str | FormatError:
    """The query agent's NEW QUERY as <= 8 keywords.

    Lead-in lines ("Sure, here is the query:") and labels ("New Query:", "Query 3:") are dropped, the first
    remaining line is kept (multi-line output), stopwords are removed and the rest is cut to `max_keywords`.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return FormatError("empty query")
    content = [ln for ln in lines if not (ln.endswith(":") or _LEAD_IN.match(ln))] or lines
    line = _QUERY_LABEL.sub("", content[0])
    if not line.strip() and len(content) > 1:  # "New Query:" alone on its line, the query below it
        line = content[1]
    q = keywords(line, max_keywords)
    return q if q else FormatError(f"no keywords left in {first_line(text)[:80]!r}")


def parse_judge(text: str) -> str | FormatError:
    """Exactly one of the two labels (case, quotes, surrounding space and a final period ignored); else FormatError."""
    s = " ".join(text.strip().strip("'\"`*").rstrip(".").strip("'\"`* ").split()).lower()
    if s == SUFFICIENT.lower():
        return SUFFICIENT
    if s == INSUFFICIENT.lower():
        return INSUFFICIENT
    return FormatError(f"not one of the two labels: {text.strip()[:80]!r}" if text.strip() else "empty judgement")


def parse_proponent(text: str) -> str | FormatError:
    """The proponent's argument, free text; only an empty one is malformed (the moderator then sees nothing)."""
    return text.strip() or FormatError("empty argument")


@dataclass(frozen=True)
class OpponentAction:
    action: str            # "expand" | "concede"
    query: str | None = None

    def to_dict(self) -> dict:
        return {"action": self.action, "query": self.query}


_EXPANSION = re.compile(r"query\s+expansion\s*[:：]", re.IGNORECASE)
_CONCEDE = re.compile(r"\bconcede\b", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"^\s*new\s+query\s*$", re.IGNORECASE)
MAX_DEBATE_QUERY_WORDS = 32


def parse_opponent(text: str) -> dict | FormatError:
    """The opponent's action, the last one in its output: `Query Expansion: [q]` -> expand with q, or `Concede`."""
    exps = list(_EXPANSION.finditer(text))
    cons = list(_CONCEDE.finditer(text))
    if not exps and not cons:
        return FormatError("neither 'Query Expansion: [New Query]' nor 'Concede'")
    if cons and (not exps or cons[-1].start() > exps[-1].start()):
        return OpponentAction("concede").to_dict()
    rest = text[exps[-1].end():]
    q = first_line(rest).strip().strip("[]\"'*` ").strip()
    if not q or _PLACEHOLDER.match(q):
        return FormatError("'Query Expansion:' without a query")
    return OpponentAction("expand", " ".join(q.split()[:MAX_DEBATE_QUERY_WORDS])).to_dict()


_AGENT_NAME = re.compile(r"\b(proponent|opponent)\b", re.IGNORECASE)


def parse_moderator(text: str) -> str | FormatError:
    """The winner's name. The name the output starts with wins; otherwise exactly one name must be mentioned."""
    names = [m.group(1).capitalize() for m in _AGENT_NAME.finditer(text)]
    if not names:
        return FormatError(f"no agent named in {text.strip()[:80]!r}" if text.strip() else "empty verdict")
    lead = text.strip().lstrip("*\"'`# ").lower()
    for name in (PROPONENT, OPPONENT):
        if lead.startswith(name.lower()):
            return name
    if len(set(names)) == 1:
        return names[0]
    return FormatError(f"both agents named in {text.strip()[:80]!r}")


# ---- the longest outputs each role must be able to write (budgets: ragteam.agents.core, tests/test_budgets.py) ----
# The three MAPS agents and the debate roles that have a format (synthesis and the DRAG baseline): the opponent's
# "brief, strong argument" as one sentence, then its action line; the moderator's name. The proponent argues in free
# text (any non-empty argument parses, a cut one too): it is not listed, its budget bounds an argument by design.

LONGEST_OUTPUTS: dict[str, tuple[str, ...]] = {
    "query_agent": ("Lost Borben director employer company headquarters city country",),   # MAX_KEYWORDS keywords
    "judge_agent": (INSUFFICIENT, SUFFICIENT),
    "answer_agent": (LONG_ANSWER,),
    "opponent": ("Doc 1 names Hali Quiver as the director of The Lost Borben, but no document says who employs him or "
                 "where his employer is headquartered.\nQuery Expansion: [Hali Quiver employer headquarters country]",
                 "Concede"),
    "moderator": (PROPONENT, OPPONENT),
}
