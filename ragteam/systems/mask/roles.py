"""M-ASK prompts (verbatim from the paper, Appendix C, typos included), the Knowledge State K (Eq. 1) and one parser
per role.

Five roles share one model and differ only by their system prompt: Planning, Search, Summary, Update and Answer.
They communicate through the Knowledge State K = {question, thinking_trajectory [(sub-query, sub-answer), ...],
predicted_answer} (`KnowledgeState`); the Search agent also reads a search history (past queries and their
summaries), which the paper keeps outside K.

Rendering (the paper does not say how `trajectory_text`, `history_text` and `docs_text` are serialised; we use the
layout of the official code, M-ASK notes §11): one `t{i}: Q: {sub-query} | A: {sub-answer}` line per step,
`{i}. Query: {query} | Summary: {evidence}` per past search (or `(No previous searches)`), `Doc{i}: {passage}` per
retrieved passage. The paper's `[EXAMPLE_PROMPT]` few-shot examples are not given in the paper; `EXAMPLES` are ours
(answer style only: short spans, yes/no).

Deviations that are recorded, not silent: the Planning prompt spells 'unkown' with typographic quotes and the Search
prompt with straight ones (both as printed). The Update system prompt says the predicted_answer is given, but the
paper's user template has no field for it; we keep the template as printed. The Answer prompt is printed inside
HTML paragraph markup (`<p>`) by the paper's source; the three paragraphs are kept as lines.

Parsers are pure (text in, value or FormatError out). Fallbacks, applied by the workflow when a parser returns a
FormatError (the call keeps `format_error`, the fallback goes into `meta["fallback"]`, and training subtracts the
format penalty from the call's reward):
- Planning: the trajectory [t1 = (question, 'unkown')] and a_0 = the untagged first line of the output
  (`answer_fallback`).
- Search: search the first line of the output (at most `MAX_QUERY_WORDS` words); an empty output searches the
  question. A malformed Search output never ends the loop.
- Summary: `No useful information` (nothing is written into K that the evidence does not support).
- Update: `<Add>t(n+1)</Add>` (an unknown key or no key appends; nothing in K is overwritten by a guess).
- Answer: the untagged first line of the output (`answer_fallback`), so an untrained model still answers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ragteam.agents.core import LONG_ANSWER, FormatError, clip_words, first_line
from ragteam.agents.answer import parse_answer as _plain_answer
from ragteam.llm import Messages
from ragteam.retrieval.base import Hit

# ---- Appendix C: the five system prompts and their user templates ----------------------------------------------

PLANNING_SYSTEM = """You are a knowledgeable reasoning assistant. Your task is to decompose a given question into multiple sub-questions based purely on your own knowledge (do not use external tools), and answer each sub-question based on your own knowledge. If you do not know the answer, write \u2018unkown\u2019 exactly.

Output all results strictly in the following format for easy parsing:
<q1>sub-question text</q1>
<a1>answer text</a1>
<q2>sub-question text</q2>
<a2>answer text</a2>

Continue numbering sequentially until done. At the end, output your final conclusion answer to the original question in the tag <predicted_answer>...</predicted_answer>, and inside this tag follow the style of: [EXAMPLE_PROMPT]"""

PLANNING_USER = "Query: {query}"

SEARCH_SYSTEM = """You are a search query generation assistant.
Your input contains:
- The original question
- A thinking_trajectory (list of sub-questions and their sub-answers)
- A search_history (list of past search queries and their summaries)

Note:
- The search_history represents queries YOU have already searched in previous turns.
- You MUST avoid generating queries that are identical to or semantically similar to any query in search_history.
- Only generate a new query if it provides new, distinct information that has not yet been searched.

Your task:
1. If any sub-question in thinking_trajectory has an answer 'unkown' or unclear, generate a specific, searchable query to find the missing information.
2. If you believe additional sub-questions are needed to answer the original question, generate a specific searchable query for that.
3. If no further search is needed, output <end>.

Output only one of the following two formats:
<search>Your query here</search>
<end>

Do not include any extra text, explanations, or other tags."""

SEARCH_USER = """Original question: {question}
Thinking trajectory: {trajectory_text}
Search history: {history_text}

Output only one of the following two formats:
<search>Your query here</search>
<end>

Do not include any extra text, explanations, or other tags."""

SUMMARY_SYSTEM = """You are an evidence extraction assistant.
You will be given:
- A search query
- Several candidate documents related to that query

Your task:
1. From the provided documents, extract the key evidence that directly answers the query.
2. If no key evidence exists in the documents, output 'No useful information'.

Output exactly in one of the two formats:
<evidence>your key evidence here</evidence>
<evidence>No useful information</evidence>

Do not include explanations, reasoning steps, or any text outside the <evidence> tags."""

SUMMARY_USER = """Query: {query}
Candidate Documents: {docs_text}"""

UPDATE_SYSTEM = """You are an update detection assistant.
You are given:
- An original question and its thinking_trajectory (sub-questions and their answers)
- The predicted_answer derived from thinking_trajectory
- A new question and its evidence

Your task:
1. If the new question and evidence can replace one existing sub-question-answer pair in thinking_trajectory, output <Update>ti</Update> where ti is the key.
2. If the new question and evidence contains information not present in thinking_trajectory, output <Add>t(n+1)</Add> where n is current number of t's.
3. Output strictly one of these formats and no other text."""

UPDATE_USER = """Original question: {orig_question}
Thinking trajectory: {trajectory_text}
New query: {new_query}
Evidence: {new_evidence}"""

ANSWER_SYSTEM = """You are a final answer generation assistant. You are given: - An original question - A thinking_trajectory (list of sub-questions and their answers)
Your task: 1. Use the provided thinking_trajectory's answers to determine the final answer to the original question. 2. You must only output in the following strict format as shown in [EXAMPLE_PROMPT]
IMPORTANT: Output must be: <predicted_answer>your answer here</predicted_answer> No extra text, no reasoning."""

ANSWER_USER = "Question: {question} Thinking trajectory: {trajectory_text}"

# The paper injects few-shot examples at runtime but does not print them; these are ours (answer style only).
EXAMPLES = """
Question: Who directed the film that won the festival's top prize in 1999?
<predicted_answer>Anna Berg</predicted_answer>
Question: Are both cities in the same country?
<predicted_answer>yes</predicted_answer>
Question: In which year was the company's founder born?
<predicted_answer>1957</predicted_answer>"""

EXAMPLE_SLOT = "[EXAMPLE_PROMPT]"
UNKNOWN = "unkown"                       # the paper's spelling, which both the Planning and Search prompts use
NO_USEFUL_INFORMATION = "No useful information"
NO_SEARCHES = "(No previous searches)"

ROLES = ("mask_planning", "mask_search", "mask_summary", "mask_update", "mask_answer")
PLANNING, SEARCH, SUMMARY, UPDATE, ANSWER = ROLES

MAX_PLAN_STEPS = 5        # sub-questions kept from a plan (the official code penalises more than 5)
MAX_QUERY_WORDS = 32      # a search query (or the fallback query) is cut to this many words
MAX_EVIDENCE_WORDS = 75   # evidence is clipped to this many words before it enters K (the official code's limit)


# ---- the Knowledge State (Eq. 1) -------------------------------------------------------------------------------

@dataclass
class Step:
    """τ_i = <q_sub, a_sub>: a sub-query and its sub-answer (or evidence)."""

    query: str
    answer: str


@dataclass
class KnowledgeState:
    """K_t = {question, thinking_trajectory T_t = [τ_1..τ_m], predicted_answer a_t} (Eq. 1)."""

    question: str
    thinking_trajectory: list[Step] = field(default_factory=list)
    predicted_answer: str = ""

    def render_trajectory(self) -> str:
        """`t{i}: Q: ... | A: ...` per step (keys t1, t2, ... as the Update prompt names them)."""
        if not self.thinking_trajectory:
            return "(empty)"
        return "\n".join(f"t{i}: Q: {s.query} | A: {s.answer}" for i, s in enumerate(self.thinking_trajectory, 1))

    def apply(self, op: UpdateOp, query: str, evidence: str) -> None:
        """Write (query, evidence) into step t_i (`update`, both fields replaced) or append it as t_{n+1} (`add`)."""
        step = Step(query, evidence)
        if op.kind == "update":
            if not 1 <= op.index <= len(self.thinking_trajectory):
                raise ValueError(f"no step t{op.index} in a trajectory of {len(self.thinking_trajectory)}")
            self.thinking_trajectory[op.index - 1] = step
        else:
            self.thinking_trajectory.append(step)

    def to_dict(self) -> dict:
        return {"question": self.question, "predicted_answer": self.predicted_answer,
                "thinking_trajectory": [{"query": s.query, "answer": s.answer} for s in self.thinking_trajectory]}

    @classmethod
    def from_dict(cls, d: dict) -> KnowledgeState:
        return cls(d["question"], [Step(s["query"], s["answer"]) for s in d["thinking_trajectory"]],
                   d.get("predicted_answer", ""))


@dataclass
class SearchRecord:
    """One entry of the search history: a past query and its summary (kept outside K, as in the paper)."""

    query: str
    summary: str


def render_history(history: list[SearchRecord]) -> str:
    if not history:
        return NO_SEARCHES
    return "\n".join(f"{i}. Query: {h.query} | Summary: {h.summary}" for i, h in enumerate(history, 1))


def render_docs(hits: list[Hit], passage_words: int | None = None) -> str:
    if not hits:
        return "(no documents)"
    return "\n".join(f"Doc{i}: {clip_words(h.contents.replace(chr(10), ' '), passage_words)}"
                     for i, h in enumerate(hits, 1))


# ---- message builders ------------------------------------------------------------------------------------------

def _chat(system: str, user: str) -> Messages:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def planning_messages(question: str) -> Messages:
    return _chat(PLANNING_SYSTEM.replace(EXAMPLE_SLOT, EXAMPLES), PLANNING_USER.format(query=question))


def search_messages(k: KnowledgeState, history: list[SearchRecord]) -> Messages:
    return _chat(SEARCH_SYSTEM, SEARCH_USER.format(question=k.question, trajectory_text=k.render_trajectory(),
                                                   history_text=render_history(history)))


def summary_messages(query: str, hits: list[Hit], passage_words: int | None = None) -> Messages:
    return _chat(SUMMARY_SYSTEM, SUMMARY_USER.format(query=query, docs_text=render_docs(hits, passage_words)))


def update_messages(k: KnowledgeState, query: str, evidence: str) -> Messages:
    return _chat(UPDATE_SYSTEM, UPDATE_USER.format(orig_question=k.question, trajectory_text=k.render_trajectory(),
                                                   new_query=query, new_evidence=evidence))


def answer_messages(k: KnowledgeState) -> Messages:
    return _chat(ANSWER_SYSTEM.replace(EXAMPLE_SLOT, EXAMPLES),
                 ANSWER_USER.format(question=k.question, trajectory_text=k.render_trajectory()))


# ---- parsers -----------------------------------------------------------------------------------------------------

def _tag(name: str, text: str, flags: int = re.IGNORECASE | re.DOTALL) -> re.Match | None:
    return re.search(rf"<\s*{name}\s*>(.*?)<\s*/\s*{name}\s*>", text, flags)


def _clean(s: str) -> str:
    return " ".join(s.split()).strip().strip("\"'`*").strip()


@dataclass(frozen=True)
class Plan:
    steps: list[tuple[str, str]]   # (sub-question, answer); a missing <a_i> is 'unkown'
    predicted_answer: str

    def to_dict(self) -> dict:
        return {"steps": [list(s) for s in self.steps], "predicted_answer": self.predicted_answer}


def parse_plan(text: str) -> dict | FormatError:
    """`<q1>..</q1><a1>..</a1> ... <predicted_answer>..</predicted_answer>` -> {"steps", "predicted_answer"}.

    The predicted answer is required (it is a_0, the Planning reward's argument); sub-questions are paired with the
    answer of the same number (missing: 'unkown'), in numeric order, at most `MAX_PLAN_STEPS`.
    """
    m = _tag("predicted_answer", text)
    if m is None:
        return FormatError("no <predicted_answer>...</predicted_answer>" if text.strip() else "empty plan")
    answer = _clean(m.group(1))
    if not answer:
        return FormatError("empty <predicted_answer>")
    qs = {int(n): _clean(q) for n, q in re.findall(r"<q(\d+)>(.*?)</q\1>", text, re.IGNORECASE | re.DOTALL)}
    ans = {int(n): _clean(a) for n, a in re.findall(r"<a(\d+)>(.*?)</a\1>", text, re.IGNORECASE | re.DOTALL)}
    steps = [(qs[n], ans.get(n) or UNKNOWN) for n in sorted(qs) if qs[n]][:MAX_PLAN_STEPS]
    return Plan(steps, answer).to_dict()


def parse_search(text: str) -> dict | FormatError:
    """`<search>q</search>` -> {"action": "search", "query": q}; `<end>` -> {"action": "end"}; the first one wins."""
    s = _tag("search", text)
    e = re.search(r"<\s*end\s*/?\s*>", text, re.IGNORECASE)
    if s is not None and (e is None or s.start() < e.start()):
        q = _clean(s.group(1))
        if not q:
            return FormatError("empty <search></search>")
        return {"action": "search", "query": " ".join(q.split()[:MAX_QUERY_WORDS])}
    if e is not None:
        return {"action": "end"}
    return FormatError(f"neither <search>...</search> nor <end> in {first_line(text)[:80]!r}" if text.strip()
                       else "empty search action")


def search_fallback(text: str, question: str) -> str:
    """The query searched when the Search output is malformed: its first line without tags, else the question."""
    line = _clean(re.sub(r"<[^>]*>", " ", first_line(text)))
    return " ".join(line.split()[:MAX_QUERY_WORDS]) or question


def parse_summary(text: str) -> str | FormatError:
    """`<evidence>E</evidence>` -> E (at most `MAX_EVIDENCE_WORDS` words)."""
    m = _tag("evidence", text)
    if m is None:
        return FormatError("no <evidence>...</evidence>" if text.strip() else "empty summary")
    ev = _clean(m.group(1))
    if not ev:
        return FormatError("empty <evidence></evidence>")
    return " ".join(ev.split()[:MAX_EVIDENCE_WORDS])


@dataclass(frozen=True)
class UpdateOp:
    kind: str        # "update" | "add"
    index: int       # the step to overwrite (update) or the new step's number (add)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "index": self.index}


_KEY = r"\s*t\s*\(?\s*(\d+|n\s*\+\s*1)\s*\)?\s*"


def parse_update(text: str, n_steps: int) -> UpdateOp | FormatError:
    """`<Update>ti</Update>` (1 <= i <= n) or `<Add>t(n+1)</Add>` for a trajectory of `n_steps` steps.

    Keys may be written `t3` or `t(3)`; the prompt's literal `t(n+1)` is read as n+1. An Update of a step that does
    not exist, or an Add numbered other than n+1, is malformed.
    """
    u = re.search(rf"<\s*update\s*>{_KEY}<\s*/\s*update\s*>", text, re.IGNORECASE)
    a = re.search(rf"<\s*add\s*>{_KEY}<\s*/\s*add\s*>", text, re.IGNORECASE)
    first = min((m for m in (u, a) if m is not None), key=lambda m: m.start(), default=None)
    if first is None:
        return FormatError(f"neither <Update>ti</Update> nor <Add>t(n+1)</Add> in {first_line(text)[:80]!r}"
                           if text.strip() else "empty update decision")
    raw = first.group(1)
    index = n_steps + 1 if "n" in raw.lower() else int(raw)
    if first is u:
        if not 1 <= index <= n_steps:
            return FormatError(f"<Update>t{index}</Update>: no such step (trajectory has t1..t{n_steps})")
        return UpdateOp("update", index)
    if index != n_steps + 1:
        return FormatError(f"<Add>t{index}</Add>: the next step is t{n_steps + 1}")
    return UpdateOp("add", index)


def parse_final_answer(text: str) -> str | FormatError:
    """`<predicted_answer>a</predicted_answer>` -> a (the Answer agent's output)."""
    m = _tag("predicted_answer", text)
    if m is None:
        return FormatError("no <predicted_answer>...</predicted_answer>" if text.strip() else "empty answer")
    a = _clean(m.group(1))
    return a if a else FormatError("empty <predicted_answer>")


def answer_fallback(text: str) -> str:
    """The answer read from a malformed output: the text after an unclosed `<predicted_answer>` if there is one,
    else the output; tags removed, then the MAPS answer reading (first line, labels stripped); "" if nothing is left."""
    m = re.search(r"<\s*predicted_answer\s*>(.*)", text, re.IGNORECASE | re.DOTALL)
    body = re.sub(r"<[^>]*>", " ", m.group(1) if m else text)
    a = _plain_answer(body)
    return a if isinstance(a, str) else ""


# ---- the longest outputs each role must be able to write (budgets: ragteam.agents.core, tests/test_budgets.py) ----

LONGEST_OUTPUTS: dict[str, tuple[str, ...]] = {
    # a plan of MAX_PLAN_STEPS sub-questions, the most the workflow keeps
    PLANNING: (f"""<q1>Who directed The Lost Borben?</q1>
<a1>Hali Quiver</a1>
<q2>Which company employs Hali Quiver?</q2>
<a2>Anzan Studios</a2>
<q3>In which city is Anzan Studios headquartered?</q3>
<a3>Benel</a3>
<q4>In which country is Benel?</q4>
<a4>{UNKNOWN}</a4>
<q5>Does Anzan Studios have its headquarters in another country?</q5>
<a5>{UNKNOWN}</a5>
<predicted_answer>{LONG_ANSWER}</predicted_answer>""",),
    SEARCH: ("<search>country where the company that employs Hali Quiver, director of The Lost Borben, is "
             "headquartered</search>", "<end>"),
    SUMMARY: ("<evidence>Hali Quiver, the director of The Lost Borben, works for Anzan Studios, which is "
              "headquartered in Benel.</evidence>", f"<evidence>{NO_USEFUL_INFORMATION}</evidence>"),
    # K holds at most MAX_PLAN_STEPS + (mask.max_turns - 1) steps when Update speaks (t6 with max_turns 2; the test
    # checks the key against params.yaml); the prompt's literal `t(n+1)` is valid too
    UPDATE: ("<Update>t6</Update>", "<Add>t7</Add>", "<Add>t(n+1)</Add>"),
    ANSWER: (f"<predicted_answer>{LONG_ANSWER}</predicted_answer>",),
}
