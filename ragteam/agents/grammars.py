"""Output formats as regular expressions, one per role, for guided decoding (vLLM's structured outputs:
`SamplingConfig.regex`): the building blocks, and `constrain`, which puts a system's regexes on its roles' sampling.
Each system's own table is in its module (`System.grammars`, `ragteam.systems.<system>.GRAMMARS`).

What they are for: the `<system>_grammar` rows of `evaluate` run a system's roles on the base model with each role's
output constrained to its format, so the row beside `<system>` (the same model, unconstrained) measures how much of
the system's score the base model loses to formatting alone, and beside `<system>_warmup` how much of that the
format warm-up recovers (issue 24 §3, for the cold-start work of issue 25). They are never used for a trainer's
policy samples (`ragteam.llm.policy.Rollouts` refuses a regex on a trained role).

Each regex is the layout the role's parser reads (`ragteam.agents.<system>.parse_*`), the layout the oracle traces
write (`ragteam.systems.<system>`; tests/test_oracle.py checks every oracle output of the default pool matches its
role's regex, tests/test_grammars.py that hand-picked outputs a regex admits parse and those it refuses do not, and
tests/worker that the base model's guided outputs parse; no test enumerates a regex's whole language). Free text is bounded so that a constrained
completion fits its role's token budget: where the budget ends first the completion is cut and still fails its
parser, as an unconstrained one would. What a regex cannot say is left to the parsers: numbers that depend on the
state (M-ASK's step index, JADE's document ids in range), the words of a query. The bounds are in characters, from
each role's token budget (llm.sampling; about 3.5 characters per token of text once the tags' tokens are paid): a
constrained output that uses every character still ends inside its budget.
"""
from __future__ import annotations

from collections.abc import Mapping


def text(most: int, first: str = r"[^<>\s]") -> str:
    """1..most characters of one line without tags, the first one of class `first` (not a space: a parser strips
    it to non-empty)."""
    return rf"{first}[^<>\n]{{0,{most - 1}}}"


def numbered_pairs(steps: int, q: str, a: str) -> str:
    """`<q1>..</q1>\n<a1>..</a1>\n` then optionally the next pair, up to `steps` pairs, numbered in order."""
    out = ""
    for i in range(steps, 0, -1):
        pair = rf"<q{i}>{q}</q{i}>\n<a{i}>{a}</a{i}>\n"
        out = pair + (f"({out})?" if out else "")
    return out


def numbered_questions(most: int, q: str) -> str:
    """`<q1>..</q1>` then optionally `\n<q2>..</q2>` ..., up to `most`, numbered in order."""
    out = ""
    for i in range(most, 1, -1):
        out = rf"\n<q{i}>{q}</q{i}>" + (f"({out})?" if out else "")
    return rf"<q1>{q}</q1>" + (f"({out})?" if out else "")


# a block's first character: not a tag, a space or `[` (the templates' bracketed placeholders, which small models echo)
NOT_A_PLACEHOLDER = r"[^<>\s\[]"


def constrain(grammars: Mapping[str, str], sampling: Mapping, default_key: str = "default") -> dict:
    """`sampling` (llm.sampling: role -> SamplingConfig) with each role of `grammars` (role -> regex) constrained to
    its regex; the other roles untouched."""
    from ragteam.llm import SamplingConfig

    default = sampling.get(default_key) or SamplingConfig()
    out = dict(sampling)
    for role, regex in grammars.items():
        out[role] = (sampling.get(role) or default).model_copy(update={"regex": regex})
    return out
