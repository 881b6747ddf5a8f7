"""The joint systems' output formats as regular expressions, one per role, for guided decoding (vLLM's structured
outputs: `SamplingConfig.regex`).

What they are for: the `<system>_grammar` rows of `evaluate` run a system's roles on the base model with each role's
output constrained to its format, so the row beside `<system>` (the same model, unconstrained) measures how much of
the system's score the base model loses to formatting alone, and beside `<system>_warmup` how much of that the
format warm-up recovers (issue 24 §3, for the cold-start work of issue 25). They are never used for a trainer's
policy samples (`ragteam.llm.policy.Rollouts` refuses a regex on a trained role).

Each regex is the layout the role's parser reads (`ragteam.agents.<system>.parse_*`), the layout the oracle traces
write (`ragteam.warmup.oracle`; tests/test_oracle.py checks every oracle output of the default pool matches its
role's regex, tests/test_grammars.py that hand-picked outputs a regex admits parse and those it refuses do not, and
tests/worker that the base model's guided outputs parse; no test enumerates a regex's whole language). Free text is bounded so that a constrained
completion fits its role's token budget: where the budget ends first the completion is cut and still fails its
parser, as an unconstrained one would. What a regex cannot say is left to the parsers: numbers that depend on the
state (M-ASK's step index, JADE's document ids in range), the words of a query.
"""
from __future__ import annotations

from collections.abc import Mapping

from ragteam.agents import decor as D
from ragteam.agents import jade as J
from ragteam.agents import mask as M
from ragteam.agents.qagent import MAX_QUERIES
from ragteam.agents.qagent_workflow import ROLE as QAGENT_ROLE


def _text(most: int, first: str = r"[^<>\s]") -> str:
    """1..most characters of one line without tags, the first one of class `first` (not a space: a parser strips
    it to non-empty)."""
    return rf"{first}[^<>\n]{{0,{most - 1}}}"


def _numbered_pairs(steps: int, q: str, a: str) -> str:
    """`<q1>..</q1>\n<a1>..</a1>\n` then optionally the next pair, up to `steps` pairs, numbered in order."""
    out = ""
    for i in range(steps, 0, -1):
        pair = rf"<q{i}>{q}</q{i}>\n<a{i}>{a}</a{i}>\n"
        out = pair + (f"({out})?" if out else "")
    return out


def _numbered_questions(most: int, q: str) -> str:
    """`<q1>..</q1>` then optionally `\n<q2>..</q2>` ..., up to `most`, numbered in order."""
    out = ""
    for i in range(most, 1, -1):
        out = rf"\n<q{i}>{q}</q{i}>" + (f"({out})?" if out else "")
    return rf"<q1>{q}</q1>" + (f"({out})?" if out else "")


def _jade_plans() -> str:
    """QDS, QDP, or an ordered subsequence of QR, R, DS, AG that ends in AG and has R before DS."""
    solve = ["AG", "R, AG", "R, DS, AG", "QR, AG", "QR, R, AG", "QR, R, DS, AG"]
    return "|".join(["QDS", "QDP", *solve])


def _decor_block(tag: str, think: int, content: int) -> str:
    """Appendix A's layout: `<think>` one paragraph `</think>` then the role's block, tags on their own lines; the
    block does not open with `[` (the templates' bracketed placeholders, which small models echo)."""
    body = _text(content, NOT_A_PLACEHOLDER)
    return rf"<think>\n{_text(think)}\n</think>\n<{tag}>\n{body}\n</{tag}>"


NOT_A_PLACEHOLDER = r"[^<>\s\[]"


# Bounds in characters, from each role's token budget (llm.sampling; about 3.5 characters per token of text once
# the tags' tokens are paid): a constrained output that uses every character still ends inside its budget.
GRAMMARS: dict[str, dict[str, str]] = {
    "mask": {
        # at most 4 pairs where the format allows MAX_PLAN_STEPS (5): 5 pairs of digit-heavy text overran the
        # 192-token budget (tests/worker), and the default data's chains have at most 4 hops
        M.PLANNING: _numbered_pairs(4, _text(50), _text(20))
        + rf"<predicted_answer>{_text(30)}</predicted_answer>",
        M.SEARCH: rf"<search>{_text(80)}</search>|<end>",
        M.SUMMARY: rf"<evidence>{_text(120)}</evidence>",
        # the prompt's own `t(n+1)` for an Add: valid in every state (the parser reads it as the next step), where a
        # number would have to be the trajectory's length, which a regex cannot know
        M.UPDATE: r"<Update>t[1-9]</Update>|<Add>t\(n\+1\)</Add>",
        M.ANSWER: rf"<predicted_answer>{_text(40)}</predicted_answer>",
    },
    "jade": {
        J.PLANNER: rf"<workflow>({_jade_plans()})</workflow>",
        J.QR: rf"<query>{_text(90)}</query>",
        J.QDS: _numbered_questions(J.MAX_SUBQUESTIONS, _text(60)),
        J.QDP: _numbered_questions(J.MAX_SUBQUESTIONS, _text(60)),
        J.DS: r"<id>((Document ?)?[0-9]{1,2}(, ?(Document ?)?[0-9]{1,2}){0,4})?</id>",
        J.AG: rf"<answer>{_text(55)}</answer>",
        J.AS: rf"<answer>{_text(55)}</answer>",
    },
    "decor": {
        D.PLANNER: _decor_block("search", 90, 70),
        D.FILTER: _decor_block("filter", 80, 160),
        D.ANSWERER: _decor_block("answer", 110, 40),
    },
    "qagent": {
        # one turn: a reflection (the parser wants one after an <information> block; a role's regex cannot see the
        # state, so it is optional), then either the answer or a plan and 1..MAX_QUERIES queries
        QAGENT_ROLE: rf"(<reflection>{_text(100)}</reflection>\n)?(<answer>{_text(40)}</answer>|<plan>{_text(130)}"
                     rf"</plan>\n<search>\n<query>{_text(50)}</query>\n(<query>{_text(50)}</query>\n)"
                     rf"{{0,{MAX_QUERIES - 1}}}</search>)",
    },
}


def grammar_sampling(workflow: str, sampling: Mapping, default_key: str = "default") -> dict:
    """`sampling` (llm.sampling: role -> SamplingConfig) with each of `workflow`'s roles constrained to its regex;
    a ValueError for a workflow without grammars."""
    from ragteam.llm import SamplingConfig

    if workflow not in GRAMMARS:
        raise ValueError(f"no output grammars for workflow {workflow!r} (known: {', '.join(sorted(GRAMMARS))})")
    default = sampling.get(default_key) or SamplingConfig()
    out = dict(sampling)
    for role, regex in GRAMMARS[workflow].items():
        out[role] = (sampling.get(role) or default).model_copy(update={"regex": regex})
    return out
