"""JADE prompts (verbatim from the paper, Appendix E), the plan grammar and the parsers of every role's output.

Roles (one shared backbone, one system prompt each; `ROLES`): the Planner, and the executors QR (query rewriter),
QDS / QDP (serial / parallel decomposition), DS (document selector), AG (answer generator), AS (answer
summariser). R, the retriever, is the project's `Retriever`, not an LLM call.

Message split (the paper does not say how a prompt is divided into chat messages): the role's instructions, up to
the line that carries the question, are the system message (the paper's "role system prompt" p_ρ, Eq. 4); the rest,
from `Question:` / `Original Question:` on, is the user message. Joined with a newline the two are the Appendix E
text word for word. Layouts the paper leaves open:
- `{doc_content}`: one line per candidate, `Document{i} (Title: <title>): <text>`, numbered from 0 (the DS case
  study answers `Document0, Document1, ...`); AG gets DS's selection renumbered from 0, or R's candidates when the
  plan has no DS. With no documents at all (plans `AG`, `QR,AG`) the `{doc_content}` line is left out.
- `{observation}` (AS) and the context of a QR call: one `Sub-question i: <q>` / `Answer: <a>` pair per answered
  node, in trace order (the layout of the official code). QR gets this block before its `Original Question:` line
  only when some node is already answered (Sec. 3.1: the rewriter may read resolved answers to resolve
  coreferences, App. F "Heritage of Fred Astaire").

Plan grammar (`validate_plan`). A decomposition plan is exactly `QDS` or exactly `QDP`. A solving plan is drawn
from QR, R, DS, AG with R before DS and AG last (the paper's rules); in addition, as the official validator does,
every module appears at most once and QR comes first: the valid solving plans are the ordered subsequences of
QR, R, DS, AG that end in AG (AG, QR+AG, R+AG, QR+R+AG, R+DS+AG, QR+R+DS+AG). A repeat or a QR after R would run a
module whose output no later module reads.

Parsers are pure and lenient about text around the tags (the first tagged block counts); a missing or unclosed
tag, an empty value or a rule broken inside the tag is a `FormatError`. Each is a format violation in the sense of
Eq. 7 (penalised by `ragteam.systems.jade.rewards`), and the workflow applies the role's fallback:
- Planner: the solving plan `R,AG` (retrieve with the node's question, answer). The official code falls back to
  `QDS` at the root and `R,AG` below it; one plan for every node keeps a bad plan from growing the trace.
- QR: the node's question unchanged (as the search query, or as the node's question before planning).
- QDS / QDP: no decomposition; the node is solved in the same round with `R,AG`.
- DS: every candidate is kept (official code). Ids outside 0..max_id are a format error too.
- AG / AS: the response's first line without tags (official code: the raw response), so a reply cut off before
  `</answer>` still answers; empty if nothing is left.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from ragteam.agents.core import LONG_ANSWER, FormatError, clip_words
from ragteam.llm import Messages
from ragteam.retrieval.base import Hit

# ---- Appendix E prompts (system part = role instructions, user part = from the question line on) --------------

PLANNER_SYSTEM = """You are a helpful assistant specialized in planning workflows. Your task is to plan a Workflow for the given question using the available tools/agents.
Available Tools/Agents:
Query Rewriter (QR): Input: question → Output: rewritten question that is more concise, clearer, and accurate.
Query Decomposition Serial (QDS): Input: question → Output: dependent sub-questions where later ones depend on earlier ones.
Query Decomposition Parallel (QDP): Input: question → Output: several sub-questions can be searched independently.
Retrieval (R): Input: question → Output: relevant candidate documents.
Document Selector (DS): Input: question + candidate documents → Output: subset of documents helpful for answering.
Answer Generator (AG): Input: question [+ optional documents] → Output: final answer.
Rules for tool selection:
1. When the question needs to be broken down into sub-questions: If sub-questions have dependencies and must be answered in sequence, use QDS or QDP ONLY.
2. When the question can be answered directly without decomposition: Build workflow from QR, R, DS, AG. If DS is in workflow, R must appear before DS. The last module must always be AG.
3. IMPORTANT: If you choose QDS or QDP, DO NOT add any other tools/agents. The workflow must ONLY contain QDS or QDP in those cases."""
PLANNER_USER = """Question: {query}
Now, generate the appropriate Workflow based on the rules. Output strictly inside <workflow>...</workflow> tags."""

QR_SYSTEM = """You are a professional assistant skilled at rewriting slightly redundant or overly wordy factual questions into a single, concise, and searchable query.
Task Requirements: Keep all essential names, dates, and terms. Do not add explanations or unrelated details. Make the query short and clear."""
QR_USER = """Original Question: {query}
Now, rewrite the original question. Output strictly inside <query>...</query> tags."""

QDP_SYSTEM = """You are a professional assistant skilled at decomposing complex multi-entity or multi-location questions into multiple independent sub-questions.
Task Requirements: Each sub-question must be specific, logically complete, and searchable independently. Avoid duplication and overlap. Do not generate more than 4 sub-questions."""
QDP_USER = """Original Question: {query}
Now, break down the question into independent sub-questions. Output each sub-question on a new line inside numbered tags (<q1>...</q1>, <q2>...</q2>, etc.)."""

QDS_SYSTEM = """You are a professional assistant skilled at decomposing complex questions into a minimal sequence of logically dependent sub-questions.
Task Requirements: Each sub-question must be self-contained and specific. Ensure a logical chain where later questions depend on earlier ones. Keep the number of sub-questions minimal (max 4). Avoid redundancy."""
QDS_USER = """Original Question: {query}
Now, decompose the question into a logically ordered sequence. Output each sub-question on a new line inside numbered tags (<q1>...</q1>, <q2>...</q2>, etc.)."""

DS_SYSTEM = """You are a helpful, respectful, and honest assistant. Your task is to identify which candidate Documents are helpful in answering the Question."""
DS_USER = """Question: {query}
{doc_content}
Now, select the helpful documents. Output their IDs (0, 1, …, {max_id}) as comma-separated values strictly inside <id>...</id> tags."""

AG_SYSTEM = """You are a helpful, respectful, and honest assistant. Your task is to provide a brief and accurate answer to the Question based on the provided Documents.
Task Requirements: Answer strictly based on the documents. If the answer is not in the documents, say "I don't know". Do not fabricate information."""
AG_USER = """Question: {query}
{doc_content}
Now, generate the brief and accurate answer. Output strictly inside <answer>...</answer> tags."""

AS_SYSTEM = """You are a helpful, respectful, and honest assistant. Your task is to predict the final answer to the Original Question based on the answers to its decomposed sub-questions.
Task Requirements: Synthesize the information from the sub-questions and observations. Always provide the answer you think is most correct. Do not answer "I don't know" unless absolutely necessary."""
AS_USER = """Original Question: {query}
{observation}
Now, answer the Original Question based on the observations. Output strictly inside <answer>...</answer> tags."""

# Role names (params.yaml llm.sampling keys; one engine call per role and step).
PLANNER, QR, QDS, QDP, DS, AG, AS = ("jade_planner", "jade_qr", "jade_qds", "jade_qdp", "jade_ds", "jade_ag",
                                     "jade_as")
ROLES = (PLANNER, QR, QDS, QDP, DS, AG, AS)

# Plan modules, as the planner writes them.
DECOMPOSE = ("QDS", "QDP")
SOLVE_ORDER = ("QR", "R", "DS", "AG")
MODULES = frozenset(DECOMPOSE + SOLVE_ORDER)
FALLBACK_PLAN = ["R", "AG"]

MAX_SUBQUESTIONS = 4      # both decomposition prompts: "max 4" / "not more than 4"
MAX_ANSWER_WORDS = 40     # official code: an AG / AS answer of more than 40 words is malformed
MAX_QUERY_WORDS = 100     # official code: a rewritten query of more than 100 words is malformed


def _chat(system: str, user: str) -> Messages:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def render_docs(docs: Sequence[Hit], passage_words: int | None = None) -> str:
    """`{doc_content}`: `Document{i} (Title: t): text`, numbered from 0, passages clipped to `passage_words`."""
    return "\n".join(f"Document{i} (Title: {h.title}): {clip_words(h.text, passage_words)}"
                     for i, h in enumerate(docs))


def render_observation(pairs: Sequence[tuple[str, str]]) -> str:
    """`{observation}`: `Sub-question i: q` / `Answer: a` per answered node, in trace order."""
    return "\n".join(f"Sub-question {i}: {q}\nAnswer: {a}" for i, (q, a) in enumerate(pairs, start=1))


def planner_messages(query: str) -> Messages:
    return _chat(PLANNER_SYSTEM, PLANNER_USER.format(query=query))


def qr_messages(query: str, answered: Sequence[tuple[str, str]] = ()) -> Messages:
    user = QR_USER.format(query=query)
    if answered:
        user = render_observation(answered) + "\n" + user
    return _chat(QR_SYSTEM, user)


def qds_messages(query: str) -> Messages:
    return _chat(QDS_SYSTEM, QDS_USER.format(query=query))


def qdp_messages(query: str) -> Messages:
    return _chat(QDP_SYSTEM, QDP_USER.format(query=query))


def ds_messages(query: str, docs: Sequence[Hit], passage_words: int | None = None) -> Messages:
    if not docs:
        raise ValueError("the document selector needs at least one candidate document")
    return _chat(DS_SYSTEM, DS_USER.format(query=query, doc_content=render_docs(docs, passage_words),
                                           max_id=len(docs) - 1))


def ag_messages(query: str, docs: Sequence[Hit], passage_words: int | None = None) -> Messages:
    if not docs:  # no {doc_content} line at all (plans AG, QR,AG)
        return _chat(AG_SYSTEM, AG_USER.replace("{doc_content}\n", "").format(query=query))
    return _chat(AG_SYSTEM, AG_USER.format(query=query, doc_content=render_docs(docs, passage_words)))


def as_messages(question: str, answered: Sequence[tuple[str, str]]) -> Messages:
    if not answered:  # the round limit stopped the episode before any node was answered
        return _chat(AS_SYSTEM, AS_USER.replace("{observation}\n", "").format(query=question))
    return _chat(AS_SYSTEM, AS_USER.format(query=question, observation=render_observation(answered)))


# ---- parsers --------------------------------------------------------------------------------------------------

def _tag(name: str) -> re.Pattern:
    return re.compile(rf"<{name}>(.*?)</{name}>", re.IGNORECASE | re.DOTALL)


_WORKFLOW, _QUERY, _IDS, _ANSWER = _tag("workflow"), _tag("query"), _tag("id"), _tag("answer")
_SUBQ = re.compile(r"<q(\d+)>(.*?)</q\1>", re.IGNORECASE | re.DOTALL)
_DOC_ID = re.compile(r"(?:document\s*)?(\d+)", re.IGNORECASE)
_ANY_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9]*>")


def _show(text: str) -> str:
    return repr(" ".join(text.split())[:80])


def _tagged(text: str, pattern: re.Pattern, name: str) -> str | FormatError:
    m = pattern.search(text)
    if m is None:
        return FormatError(f"no <{name}>...</{name}> in {_show(text)}" if text.strip() else "empty output")
    return " ".join(m.group(1).split())


def validate_plan(modules: Sequence[str]) -> list[str] | FormatError:
    """The plan grammar (module docstring): exactly QDS or QDP, or an ordered subsequence of QR,R,DS,AG ending in AG."""
    mods = list(modules)
    if not mods or any(not m for m in mods):
        return FormatError(f"empty module in plan {','.join(mods)!r}")
    unknown = [m for m in mods if m not in MODULES]
    if unknown:
        return FormatError(f"unknown module {unknown[0]!r} (allowed: QDS, QDP, QR, R, DS, AG)")
    if any(m in DECOMPOSE for m in mods):
        return mods if len(mods) == 1 else FormatError(f"QDS / QDP must be the whole plan, got {','.join(mods)!r}")
    if len(set(mods)) != len(mods):
        return FormatError(f"a module repeats in {','.join(mods)!r}")
    if mods[-1] != "AG":
        return FormatError(f"the last module must be AG, got {','.join(mods)!r}")
    if "DS" in mods and ("R" not in mods or mods.index("R") > mods.index("DS")):
        return FormatError(f"DS needs R before it, got {','.join(mods)!r}")
    if [SOLVE_ORDER.index(m) for m in mods] != sorted(SOLVE_ORDER.index(m) for m in mods):
        return FormatError(f"modules out of the order QR, R, DS, AG: {','.join(mods)!r}")
    return mods


def parse_plan(text: str) -> list[str] | FormatError:
    """The planner's `<workflow>A,B,...</workflow>` as a validated module list (case and spaces ignored)."""
    body = _tagged(text, _WORKFLOW, "workflow")
    if isinstance(body, FormatError):
        return body
    return validate_plan([m.strip().upper() for m in body.split(",")])


def parse_rewrite(text: str) -> str | FormatError:
    """QR's `<query>...</query>`: a non-empty query of at most MAX_QUERY_WORDS words."""
    q = _tagged(text, _QUERY, "query")
    if isinstance(q, FormatError):
        return q
    if not q:
        return FormatError("empty <query>")
    if len(q.split()) > MAX_QUERY_WORDS:
        return FormatError(f"rewritten query longer than {MAX_QUERY_WORDS} words")
    return q


def parse_subquestions(text: str) -> list[str] | FormatError:
    """QDS / QDP: `<q1>..</q1>`, `<q2>..</q2>`, ... numbered from 1 in order, 1-4 distinct non-empty questions."""
    found = _SUBQ.findall(text)
    if not found:
        return FormatError(f"no <q1>...</q1> in {_show(text)}" if text.strip() else "empty output")
    numbers = [int(n) for n, _ in found]
    if numbers != list(range(1, len(found) + 1)):
        return FormatError(f"sub-question tags numbered {numbers}, expected 1..{len(found)} in order")
    qs = [" ".join(q.split()) for _, q in found]
    if any(not q for q in qs):
        return FormatError("empty sub-question")
    if len(qs) > MAX_SUBQUESTIONS:
        return FormatError(f"{len(qs)} sub-questions, at most {MAX_SUBQUESTIONS} allowed")
    if len({q.lower() for q in qs}) != len(qs):
        return FormatError("duplicate sub-questions")
    return qs


def parse_doc_ids(text: str) -> list[int] | FormatError:
    """DS's `<id>...</id>`: comma-separated ids, bare (`0, 4`) or prefixed (`Document0, Document 4`); duplicates
    dropped, order kept. `<id></id>` selects nothing (valid, as in the official code). Range: `check_doc_ids`."""
    body = _tagged(text, _IDS, "id")
    if isinstance(body, FormatError):
        return body
    if not body:
        return []
    ids: list[int] = []
    for tok in body.split(","):
        m = _DOC_ID.fullmatch(tok.strip())
        if m is None:
            return FormatError(f"not a document id: {tok.strip()[:40]!r}")
        if int(m.group(1)) not in ids:
            ids.append(int(m.group(1)))
    return ids


def check_doc_ids(ids: Sequence[int], n_docs: int) -> list[int] | FormatError:
    """The ids DS may name: 0..n_docs-1 (`{max_id}` in its prompt)."""
    bad = [i for i in ids if not 0 <= i < n_docs]
    return FormatError(f"document id {bad[0]} outside 0..{n_docs - 1}") if bad else list(ids)


def parse_answer(text: str) -> str | FormatError:
    """AG / AS: `<answer>...</answer>` with a non-empty answer of at most MAX_ANSWER_WORDS words."""
    a = _tagged(text, _ANSWER, "answer")
    if isinstance(a, FormatError):
        return a
    if not a:
        return FormatError("empty <answer>")
    if len(a.split()) > MAX_ANSWER_WORDS:
        return FormatError(f"answer longer than {MAX_ANSWER_WORDS} words")
    return a


def fallback_answer(text: str) -> str:
    """AG / AS fallback: the first non-empty line with every tag removed, cut to MAX_ANSWER_WORDS words."""
    for line in _ANY_TAG.sub(" ", text).splitlines():
        if line.strip():
            return " ".join(line.split()[:MAX_ANSWER_WORDS])
    return ""


# ---- the longest outputs each role must be able to write (budgets: ragteam.agents.core, tests/test_budgets.py) ----

LONGEST_OUTPUTS: dict[str, tuple[str, ...]] = {
    PLANNER: ("<workflow>QR, R, DS, AG</workflow>",),                  # every solving module
    QR: ("<query>Which country is the company that employs the director of The Lost Borben headquartered "
         "in?</query>",),
    # MAX_SUBQUESTIONS sub-questions, one per line as both prompts ask
    QDS: ("<q1>Who directed The Lost Borben?</q1>\n<q2>Which company employs the director of The Lost Borben?</q2>\n"
          "<q3>In which city is that company headquartered?</q3>\n<q4>In which country is that city?</q4>",),
    QDP: ("<q1>Who directed The Lost Borben?</q1>\n<q2>Who directed The Iron Borben?</q2>\n"
          "<q3>In which country was Hali Quiver born?</q3>\n<q4>In which country was Sabeth Anzan born?</q4>",),
    DS: ("<id>Document0, Document1, Document2</id>",),                  # every candidate of jade.top_k = 3, prefixed
    AG: (f"<answer>{LONG_ANSWER}</answer>",),
    AS: (f"<answer>{LONG_ANSWER}</answer>",),
}
