"""Gold reasoning chains for the oracle traces (issue 25 §1): a training question's hops, read from its annotations.

A `Gold` is what an oracle team may know about one question: its golden answer and its hops in order, each hop one
gold passage with the sub-question it answers, the sub-answer (a short span of the passage) and the passage's
sentence that states it (`fact`). The oracles (`ragteam.warmup.oracle`) write every role's output from these, and
from what the role's prompt shows, never from anything else.

Sources (the training pool's `metadata`, FlashRAG format):
- synthetic (`ragteam.data.synthetic`, the default data): `template` and `supporting_ids` in hop order. Each
  template is a chain of relations between passage kinds (film -> person, person -> city, ...; `RELATIONS`), and
  every relation is stated by one sentence of the generator's passage (`_RELATION_SENTENCE` mirrors
  `World._<kind>_passage`). Sub-questions use the wording of the generator's own one-hop questions
  (`World._q_film_director` etc.), since the gold says nothing about a plan's wording; a hop's `statement` is its
  fact in the fewest words (entity, relation, sub-answer), for outputs that restate rather than quote it.
- 2WikiMultihopQA: `evidences` triples in reasoning order (`wiki2_gold`).
- HotpotQA (`supporting_titles`/`supporting_facts` name the supporting sentences, but no sub-question, relation
  or bridge entity, so neither a plan nor a search query follows from them) and MuSiQue are not read yet: their
  rows raise `GoldError`, and the builder counts them as questions without gold.

A chain is checked against the question before use: a synthetic bridge hop's sub-answer is the next hop's passage
title, the last hop of a chain (synthetic bridge, 2Wiki compositional / inference) ends in the golden answer, and
every hop's entity is named by the question or by an earlier hop; a row that fails raises GoldError (never a
trace built on a chain that does not lead to the answer).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ragteam.data.formats import split_contents


class GoldError(ValueError):
    """A training row whose annotations give no usable hop chain (names the row and why)."""


def bare(name: str) -> str:
    """A name compared as an entity: case-folded, without a trailing qualifier ("Charles Saunders (director)")."""
    return re.sub(r"\s*\([^()]*\)$", "", name).casefold()


@dataclass(frozen=True)
class Hop:
    passage_id: str
    title: str       # the entity this hop searches for (the gold passage's title, or 2Wiki's triple subject)
    question: str    # the sub-question the hop answers
    answer: str      # the sub-answer: a span of the passage (the next entity, an attribute, or the golden answer)
    fact: str        # the sentence of the passage that states `answer`
    keyword_query: str  # the entity and the relation's words of the passage sentence (a second query form)
    statement: str   # the fact in the fewest words: "<entity> was born in <answer>."


@dataclass(frozen=True)
class Gold:
    question_id: str
    question: str
    answer: str            # golden_answers[0]
    hops: tuple[Hop, ...]

    def depends_on(self, i: int) -> int | None:
        """The earlier hop whose sub-answer names hop i's entity (None: the question itself names it)."""
        for j in range(i):
            if bare(self.hops[j].answer) == bare(self.hops[i].title):
                return j
        return None


# ---- synthetic data -------------------------------------------------------------------------------------------

# relation (passage kind -> what it states): the sub-question, and the sentence of the generator's passage that
# states it with the sub-answer as group 1 (ragteam.data.synthetic.World._<kind>_passage)
_RELATION_SENTENCE: dict[tuple[str, str], tuple[str, str, str, str]] = {
    # (kind, target): (sub-question, passage sentence with the sub-answer as group 1, search keywords, statement)
    ("film", "person"): ("Who directed {t}?", r"is a \d{{4}} film directed by (.+)\.$", "film directed by",
                         "{t} was directed by {a}."),
    ("film", "year"): ("In which year did {t} come out?", r"is a (\d{{4}}) film directed by", "film",
                       "{t} came out in {a}."),
    ("person", "city"): ("In which city was {t} born?", r"^{t} \(born \d{{4}}\) is an? .+ born in (.+)\.$",
                         "born in", "{t} was born in {a}."),
    ("person", "year"): ("In which year was {t} born?", r"^{t} \(born (\d{{4}})\)", "born", "{t} was born in {a}."),
    ("person", "company"): ("Which company employs {t}?", r"^{t} works for (.+)\.$", "works for",
                            "{t} works for {a}."),
    ("company", "city"): ("In which city is {t} headquartered?", r"^{t} is a company headquartered in (.+)\.$",
                          "company headquartered", "{t} is headquartered in {a}."),
    ("city", "country"): ("In which country is the city of {t}?", r"^{t} is a city in ([^,]+), located in",
                          "is a city in", "{t} is a city in {a}."),
}

# template -> what each passage kind states in its chain (synthetic.World._q_<template>)
RELATIONS: dict[str, dict[str, str]] = {
    "film_director": {"film": "person"},
    "person_city": {"person": "city"},
    "company_city": {"company": "city"},
    "city_country": {"city": "country"},
    "birth_country": {"person": "city", "city": "country"},
    "director_city": {"film": "person", "person": "city"},
    "director_country": {"film": "person", "person": "city", "city": "country"},
    "employer_country": {"film": "person", "person": "company", "company": "city", "city": "country"},
    "born_first": {"person": "year"},
    "film_first": {"film": "year"},
    "same_country": {"person": "city", "city": "country"},
}
COMPARISONS = ("born_first", "film_first", "same_country")


def sentences(text: str) -> list[str]:
    """The passage's sentences (the synthetic generator ends each with '. '; no abbreviations occur)."""
    return [s.strip() for s in re.split(r"(?<=\.)\s+", text) if s.strip()]


def _hop(row_id: str, pid: str, contents: str, target: str) -> Hop:
    kind = pid.rsplit("-", 1)[0]
    title, text = split_contents(contents)
    question, pattern, keywords, statement = _RELATION_SENTENCE[(kind, target)]
    rx = re.compile(pattern.format(t=re.escape(title)))
    for s in sentences(text):
        m = rx.search(s)
        if m:
            a = m.group(1).strip()
            return Hop(pid, title, question.format(t=title), a, s, f"{title} {keywords}",
                       statement.format(t=title, a=a))
    raise GoldError(f"row {row_id}: passage {pid} ({title!r}) states no {kind} -> {target} sentence")


def synthetic_gold(row: dict, passages: Mapping[str, str]) -> Gold:
    """The hop chain of a synthetic training row; `passages` maps passage id -> contents (at least its gold ids)."""
    rid, meta = str(row["id"]), row.get("metadata") or {}
    template, ids = meta.get("template"), meta.get("supporting_ids")
    if template not in RELATIONS or not ids:
        raise GoldError(f"row {rid}: no synthetic gold (metadata template {template!r}, supporting_ids {ids!r})")
    missing = [p for p in ids if p not in passages]
    if missing:
        raise GoldError(f"row {rid}: supporting passages {missing} are not in the corpus")
    hops = []
    for pid in ids:
        kind = pid.rsplit("-", 1)[0]
        if kind not in RELATIONS[template]:
            raise GoldError(f"row {rid}: template {template} has no hop over a {kind} passage ({pid})")
        hops.append(_hop(rid, pid, passages[pid], RELATIONS[template][kind]))
    gold = Gold(rid, row["question"], row["golden_answers"][0], tuple(hops))
    if template not in COMPARISONS:
        chain = [h.answer for h in hops[:-1]], [h.title for h in hops[1:]]
        if chain[0] != chain[1] or hops[-1].answer != gold.answer:
            raise GoldError(f"row {rid}: the hops {[(h.title, h.answer) for h in hops]} do not lead to the "
                            f"golden answer {gold.answer!r}")
    _check_entities(gold)
    return gold


# ---- 2WikiMultihopQA ----------------------------------------------------------------------------------------------

WIKI2_CHAINS = ("compositional", "inference")   # types whose last evidence object is the answer


def _wiki_sentences(text: str) -> list[str]:
    return [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def wiki2_gold(row: dict, passages: Mapping[str, str]) -> Gold:
    """The hop chain of a 2WikiMultihopQA row: one hop per `evidences` triple (subject, relation, object), in the
    dataset's order (the reasoning path). The hop's passage is the supporting passage titled by the subject
    (`Subject` or `Subject (qualifier)`) whose text states the object; its fact is the first sentence that does,
    its sub-answer the object as that sentence writes it. Sub-question and statement are the triple in words
    ("What is the director of X?", "The director of X is Y.": 2Wiki's relations are Wikidata property labels),
    since the gold says nothing about their wording. `passages`: id -> contents, the supporting titles' at least."""
    rid, meta = str(row["id"]), row.get("metadata") or {}
    triples, titles = meta.get("evidences") or [], meta.get("supporting_titles") or []
    by_title: dict[str, list[tuple[str, str]]] = {}
    for pid, contents in passages.items():
        t, text = split_contents(contents)
        by_title.setdefault(t.casefold(), []).append((pid, text))
    hops = []
    for subj, rel, obj in triples:
        names = [t for t in titles
                 if t.casefold() == subj.casefold() or t.casefold().startswith(f"{subj} (".casefold())]
        found = [(pid, s) for t in names for pid, text in by_title.get(t.casefold(), [])
                 for s in _wiki_sentences(text) if obj.casefold() in s.casefold()]
        if not found:
            raise GoldError(f"row {rid}: no supporting passage of {subj!r} states its {rel} {obj!r}")
        pid, fact = found[0]
        at = fact.casefold().index(obj.casefold())
        answer = fact[at:at + len(obj)]
        hops.append(Hop(pid, subj, f"What is the {rel} of {subj}?", answer, fact, f"{subj} {rel}",
                        f"The {rel} of {subj} is {answer}."))
    if not hops:
        raise GoldError(f"row {rid}: no evidences triples")
    gold = Gold(rid, row["question"], row["golden_answers"][0], tuple(hops))
    if meta.get("type") in WIKI2_CHAINS and hops[-1].answer.casefold() not in {a.casefold()
                                                                               for a in row["golden_answers"]}:
        raise GoldError(f"row {rid}: the last evidence {hops[-1].answer!r} is not a golden answer "
                        f"{row['golden_answers']}")
    _check_entities(gold)
    return gold


def _check_entities(gold: Gold) -> None:
    for i, h in enumerate(gold.hops):
        if gold.depends_on(i) is None and bare(h.title) not in gold.question.casefold():
            raise GoldError(f"row {gold.question_id}: hop {i + 1} ({h.title!r}) is neither named by the question "
                            f"nor by an earlier hop")


def gold_chain(row: dict, passages: Mapping[str, str]) -> Gold:
    """The row's gold chain from whichever annotation it carries (module docstring); GoldError when none."""
    meta = row.get("metadata") or {}
    if meta.get("supporting_ids") and meta.get("template"):
        return synthetic_gold(row, passages)
    if meta.get("evidences"):
        return wiki2_gold(row, passages)
    kinds = [k for k in ("supporting_facts", "question_decomposition") if k in meta]
    raise GoldError(f"row {row.get('id')}: no hop-ordered gold the oracle reads"
                    + (f" (its {', '.join(kinds)} are not read yet)" if kinds else " (metadata has none)"))
