"""The final answer as every answering role writes it, and as the pipeline and every answer reward read it.

One parser for all systems (MAPS's answer agent, M-ASK's and DECOR's answerers, QAgent's generator, the baselines):
the first line that is an answer, with labels and lead-ins ("Answer:", "The answer is") removed; no answer at all
(an empty output, a bare lead-in, a copied passage header) is a FormatError. `is_stub` flags the lead-ins a
continuation can still complete (`agents.core.continue_lead_ins`).
"""
from __future__ import annotations

import re

from ragteam.agents.core import FormatError

# English function words (the "stopwords, or connectors" of the query agent's output rules), lower case.
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers herself
him himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only or
other our ours ourselves out over own same she should so some such than that the their theirs them themselves then
there these they this those through to too under until up very was we were what when where which while who whom whose
why will with would you your yours yourself yourselves
""".split())

_WORD = re.compile(r"[^\W_]+(?:['’.\-][^\W_]+)*")


_ANSWER_LABEL = re.compile(r"^\s*(?:(?:the\s+)?(?:final\s+)?answer\b\s*(?:is\b)?\s*[:：\-]?|a\s*[:：])\s*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# A copied passage header (`Doc 2(Title: "X"): ...`, the layout of the query pool): no answer of the model's own.
_DOC_HEADER = re.compile(r"^\W*doc(?:ument)?\s*\d+\s*\(\s*title\s*:", re.IGNORECASE)
# Lead-ins ("The answer to this question is:", "Based on the given documents, the answer is") are made of these
# words and name the answer or its source; an answer made of nothing else is a stub, not an answer.
# Lines that echo the prompt (`Question: ...`, `Query 2: ...`, `Retrieved Content:`) are not the model's answer.
_ECHO = re.compile(r"^\W*(?:question|query\s*\d*|retrieved\s+content)\s*:", re.IGNORECASE)
# the pool's own marker for a query that added nothing (`agents.core.QueryPool.render`), copied back: no answer
_NO_DOCS_ECHO = re.compile(r"^\W*no\s+new\s+documents\W*$", re.IGNORECASE)
_LEAD_NOUNS = frozenset("answer answers question questions document documents doc docs information context based "
                        "according provided given following response".split())
_LEAD_WORDS = STOPWORDS | _LEAD_NOUNS | frozenset("final correct short here sure okay ok".split())
MAX_ANSWER_WORDS = 32
LEAD_IN_ERROR = "a lead-in without an answer"


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def is_lead_in(text: str) -> bool:
    """True for text that only announces an answer ("The answer to this question is", "Based on the documents")."""
    ws = _words(text)
    return bool(ws) and all(w in _LEAD_WORDS for w in ws) and any(w in _LEAD_NOUNS for w in ws)


def _strip_lead(line: str) -> str:
    """The line without a leading label or lead-in: `X: answer` where X is a lead-in, or "Answer:"/"The answer is"."""
    head, sep, rest = line.partition(":")
    if sep and is_lead_in(head):
        return rest.strip()
    return _ANSWER_LABEL.sub("", line, count=1).strip()


def parse_answer(text: str, max_words: int = MAX_ANSWER_WORDS) -> str | FormatError:
    """The final answer as the pipeline (and every answer reward) reads it.

    The first non-empty line, with a label or lead-in removed ("Answer:", "The answer is", "The answer to this
    question is: X" -> X). A line that is only a lead-in ("The answer to this question is:") hands over to the next
    line, so an answer written below its lead-in is read. No answer at all is a FormatError: an empty output, a
    lead-in with nothing after it (the stub a policy learned when the stub was read as its answer), a copied
    passage header (`Doc 1(Title: ...`); lines that echo the prompt (`Question: ...`, the pool's `(no new documents)`)
    are skipped. Wrapping quotes, markdown and a final period are removed; an over-long answer is cut to its first
    sentence, then to `max_words` words.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return FormatError("empty answer")
    answer, i = "", 0
    while i < len(lines):
        line = lines[i]
        if _DOC_HEADER.match(line):
            return FormatError(f"a copied passage header, not an answer: {line[:80]!r}")
        if _ECHO.match(line) or _NO_DOCS_ECHO.match(line):
            i += 1
            continue
        answer = _strip_lead(line).strip("*\"'` ").strip()
        if answer and not is_lead_in(answer.rstrip(":").strip()) and not _NO_DOCS_ECHO.match(answer):
            break
        answer, i = "", i + 1
    if not answer:
        return FormatError(f"{LEAD_IN_ERROR}: {lines[0][:80]!r}" if _words(text) else
                           f"no answer in {lines[0][:80]!r}")
    if len(answer.split()) > max_words:
        answer = " ".join(_SENTENCE_END.split(answer, maxsplit=1)[0].split()[:max_words])
    answer = answer.rstrip(".").strip().strip("*\"'` ").strip()
    return answer if answer else FormatError(f"no answer in {lines[0][:80]!r}")


def is_stub(text: str) -> bool:
    """An output that announces an answer and gives none ("Answer:", "The answer to this question is:", a prompt
    echo): no answer, and the one kind a continuation can still complete (`agents.core.continue_lead_ins`). An
    empty output or a copied passage header is no answer too, but nothing the model started to say."""
    y = parse_answer(text)
    return isinstance(y, FormatError) and y.reason.startswith(LEAD_IN_ERROR)
