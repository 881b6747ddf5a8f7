"""JADE inference (paper Algorithm 1), every question advancing together.

State: the trace 𝒯 of nodes ⟨q_m, a_m⟩ (Eq. 2), the root holding Q_origin. Each round targets the first node that
is neither answered nor decomposed, calls the Planner on its question, and runs the plan:
- a decomposition (`QDS` / `QDP`) inserts the sub-questions as new nodes right after the target and ends the round;
  the target is then "expanded" (its answer comes from its sub-nodes, for the root from AS). Sub-nodes may be
  decomposed again (Alg. 1 gives every round the full plan space); inserting them after their parent keeps the
  first-unsolved order depth-first, so a serial chain is solved in order.
- a solving plan runs QR → R → DS → AG in order: QR rewrites the search query, R retrieves `top_k` candidates, DS
  selects among them, AG answers the target from the selection (or from R's candidates without DS, or from nothing
  without R). DS and AG see the node's question, not QR's rewrite.
- before planning a node produced by QDS, QR rewrites the node's question with the answers found so far
  (`serial_rewrite`; the paper's Case 1 shows this unlisted QR step before each sub-planner, the official code does
  it for every QDS sub-question). The rewrite replaces the node's question.
The loop ends when every node is answered or after `max_rounds` rounds (`stop_reason` "answered" / "max_rounds").
When the root was decomposed, AS answers Q_origin from the answered nodes; when the root was answered directly its
AG answer is final and no AS call is made (Case 2 ends at AG; Alg. 1's unconditional AS would only restate it).

Batching: each episode waits at exactly one action (a role call, or retrieval). Every loop iteration groups the
waiting episodes by action and makes one engine call per role (`llm_step`) and one `batch_search`, whatever node or
module each episode is at. Every LLM call is an AgentCall in its Episode, in execution order; retrieval is not an
LLM call: its ids go to the Episode (`queries`, `retrieved_ids`) and to the call whose output it searched with
(QR, else the planner). Per question, `meta["workflow"]` counts rounds, retrievals, DS calls, plans, decomposing
plans and whether the root was decomposed; `meta["trace"]` and `meta["plans"]` keep the trace and every plan.
Fallbacks for malformed outputs are documented in `ragteam.systems.jade.roles`.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import Field

import ragteam.systems.jade.roles as jade
from ragteam.agents.core import FormatError, finish_episode, llm_step, new_episode, retrieve_step
from ragteam.config import Strict
from ragteam.llm import Messages, Team
from ragteam.records import AgentCall, Episode
from ragteam.retrieval.base import Hit, Retriever
from ragteam.systems.jade.rewards import JadeRewardConfig


class JadeConfig(Strict):
    """The `jade` section of params.yaml (inference and the rewards of Eq. 6-8)."""

    max_rounds: int = Field(5, ge=1)          # round limit of Alg. 1 ("max steps", value not stated)
    top_k: int = Field(5, ge=1)               # candidates per retrieval (not stated; official code and Vanilla RAG: 5)
    passage_words: int | None = Field(None, ge=1)  # clip each passage to this many words in prompts (None: whole)
    serial_rewrite: bool = True               # QR rewrites each QDS sub-question before it is planned (Case 1)
    reward: JadeRewardConfig = JadeRewardConfig()


# action an episode waits for -> role (None: retrieval, not an LLM call)
ACTIONS = {"planner": jade.PLANNER, "qr": jade.QR, "qds": jade.QDS, "qdp": jade.QDP, "ds": jade.DS, "ag": jade.AG,
           "as": jade.AS, "retrieve": None}
_MODULE_ACTION = {"QR": "qr", "R": "retrieve", "DS": "ds", "AG": "ag", "QDS": "qds", "QDP": "qdp"}


@dataclass
class Node:
    """One trace node ⟨q_m, a_m⟩ (Eq. 2)."""

    id: int
    query: str
    parent: int | None = None
    kind: str = "root"                 # root | serial (from QDS) | parallel (from QDP)
    answer: str | None = None          # a_m, ∅ until AG fills it
    expanded: bool = False             # decomposed: its sub-nodes carry the work
    asked: str | None = None           # the decomposer's wording, when a serial rewrite replaced `query`

    @property
    def open(self) -> bool:
        return self.answer is None and not self.expanded

    def to_dict(self) -> dict:
        return {"id": self.id, "query": self.query, "parent": self.parent, "kind": self.kind, "answer": self.answer,
                "expanded": self.expanded, "asked": self.asked}


@dataclass
class _Run:
    """One episode's progress: the trace, the round, and the action it waits for."""

    ep: Episode
    nodes: list[Node]
    next: str = "planner"
    round: int = 0
    target: Node | None = None
    plan: list[str] = field(default_factory=list)   # modules of this round still to run
    pre_plan: bool = False                          # the waiting QR call is the serial rewrite before planning
    search: str = ""                                # R's query: QR's rewrite, else the target's question
    issuer: AgentCall | None = None                 # the call whose output R searches with
    docs: list[Hit] = field(default_factory=list)   # R's candidates
    selected: list[Hit] | None = None               # DS's selection
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    stop_reason: str = ""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("rounds", "retrievals", "ds_calls", "plans", "plans_decompose"), 0))

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def answered(self) -> list[tuple[str, str]]:
        return [(n.query, n.answer) for n in self.nodes if n.answer is not None]


def _start_round(run: _Run, cfg: JadeConfig) -> None:
    """Target the first unsolved node (Alg. 1 line 4), or stop: everything answered or the round limit."""
    target = next((n for n in run.nodes if n.open), None)
    if target is None or run.round >= cfg.max_rounds:
        run.stop_reason = "answered" if target is None else "max_rounds"
        run.next = "as" if run.root.expanded else "done"
        run.target = None
        return
    run.round += 1
    run.counts["rounds"] = run.round
    run.target, run.plan, run.docs, run.selected, run.issuer = target, [], [], None, None
    run.search = target.query
    run.pre_plan = target.kind == "serial" and cfg.serial_rewrite
    run.next = "qr" if run.pre_plan else "planner"


def _advance(run: _Run, cfg: JadeConfig) -> None:
    """Go to the plan's next module; DS without candidates has nothing to select and is skipped."""
    while run.plan:
        module = run.plan.pop(0)
        if module == "DS" and not run.docs:
            run.ep.meta.setdefault("ds_skipped", []).append({"round": run.round, "node": run.target.id})
            continue
        run.next = _MODULE_ACTION[module]
        return
    _start_round(run, cfg)  # a plan always ends with AG or a decomposition, which start the next round themselves


def _prompt(run: _Run, action: str, cfg: JadeConfig) -> Messages:
    q = run.target.query if run.target is not None else run.ep.question
    if action == "planner":
        return jade.planner_messages(q)
    if action == "qr":
        return jade.qr_messages(q, run.answered())
    if action == "qds":
        return jade.qds_messages(q)
    if action == "qdp":
        return jade.qdp_messages(q)
    if action == "ds":
        return jade.ds_messages(q, run.docs, cfg.passage_words)
    if action == "ag":
        docs = run.selected if run.selected is not None else run.docs
        return jade.ag_messages(q, docs, cfg.passage_words)
    return jade.as_messages(run.ep.question, run.answered())


_PARSERS = {"planner": jade.parse_plan, "qr": jade.parse_rewrite, "qds": jade.parse_subquestions,
            "qdp": jade.parse_subquestions, "ds": jade.parse_doc_ids, "ag": jade.parse_answer, "as": jade.parse_answer}


def _reject(call: AgentCall, err: FormatError) -> None:
    call.meta["rejected"] = call.parsed
    call.parsed, call.format_error = None, err.reason


def _apply(run: _Run, action: str, call: AgentCall, cfg: JadeConfig) -> None:
    """Use one call's output (or its role's fallback) and move the episode to its next action."""
    ok = call.format_error is None
    t = run.target
    call.meta.update(round=run.round, node=t.id if t is not None else None)
    if action == "planner":
        plan = call.parsed if ok else list(jade.FALLBACK_PLAN)
        if not ok:
            call.meta["fallback"] = ",".join(plan)
        run.counts["plans"] += 1
        run.counts["plans_decompose"] += plan[0] in jade.DECOMPOSE
        run.ep.meta.setdefault("plans", []).append({"round": run.round, "node": t.id, "plan": ",".join(plan),
                                                   "fallback": not ok})
        run.plan, run.issuer = list(plan), call
        _advance(run, cfg)
    elif action == "qr":
        rewrite = call.parsed if ok else t.query
        if not ok:
            call.meta["fallback"] = rewrite
        if run.pre_plan:
            call.meta["stage"] = "pre_plan"
            if rewrite != t.query:
                t.asked, t.query = t.asked or t.query, rewrite
            run.pre_plan, run.search, run.next = False, t.query, "planner"
        else:
            run.search, run.issuer = rewrite, call
            _advance(run, cfg)
    elif action in ("qds", "qdp"):
        if not ok:  # no decomposition: solve the node in this round (jade.py)
            call.meta["fallback"] = ",".join(jade.FALLBACK_PLAN)
            run.plan = list(jade.FALLBACK_PLAN)
            _advance(run, cfg)
            return
        kind = "serial" if action == "qds" else "parallel"
        subs = [Node(next(run.ids), q, parent=t.id, kind=kind) for q in call.parsed]
        at = run.nodes.index(t) + 1
        run.nodes[at:at] = subs
        t.expanded = True
        call.meta["sub_nodes"] = [n.id for n in subs]
        _start_round(run, cfg)  # a decomposition ends the round
    elif action == "ds":
        run.counts["ds_calls"] += 1
        ids = jade.check_doc_ids(call.parsed, len(run.docs)) if ok else None
        if isinstance(ids, FormatError):
            _reject(call, ids)
            ok = False
        run.selected = [run.docs[i] for i in ids] if ok else list(run.docs)  # fallback: keep every candidate
        if not ok:
            call.meta["fallback"] = "all candidates"
        call.meta["selected_ids"] = [h.id for h in run.selected]
        _advance(run, cfg)
    elif action == "ag":
        t.answer = call.parsed if ok else jade.fallback_answer(call.response)
        if not ok:
            call.meta["fallback"] = t.answer
        _start_round(run, cfg)
    else:  # as
        run.ep.final_answer = call.parsed if ok else jade.fallback_answer(call.response)
        if not ok:
            call.meta["fallback"] = run.ep.final_answer
        run.next = "done"


def run_jade(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: JadeConfig,
             system: str = "jade") -> list[Episode]:
    """Answer every row ({"id","question","golden_answers"}) with the JADE team (Alg. 1); one Episode each."""
    runs = [_Run(new_episode(r, system), []) for r in rows]
    for run in runs:
        run.nodes.append(Node(0, run.ep.question))
        _start_round(run, cfg)
    while True:
        waiting: dict[str, list[_Run]] = {}
        for run in runs:
            if run.next != "done":
                waiting.setdefault(run.next, []).append(run)
        if not waiting:
            break
        for action, group in waiting.items():
            if action == "retrieve":
                hits = retrieve_step(retriever, [r.ep for r in group], [r.search for r in group], cfg.top_k)
                for run, hs in zip(group, hits):
                    run.docs = list(hs)
                    run.counts["retrievals"] += 1
                    run.ep.queries.append(run.search)
                    run.ep.retrieved_ids.append([h.id for h in hs])
                    run.issuer.retrieved_ids = [h.id for h in hs]
                    _advance(run, cfg)
                continue
            calls = llm_step(team, ACTIONS[action], [r.ep for r in group], [_prompt(r, action, cfg) for r in group],
                             _PARSERS[action])
            for run, call in zip(group, calls):
                _apply(run, action, call, cfg)
    for run in runs:
        _finish(run)
    return [r.ep for r in runs]


def _finish(run: _Run) -> None:
    ep = run.ep
    if not run.root.expanded:  # answered directly: AG's answer is final (Case 2)
        ep.final_answer = run.root.answer if run.root.answer is not None else ""
    ep.meta.update(rounds=run.round, stop_reason=run.stop_reason, trace=[n.to_dict() for n in run.nodes])
    ep.meta["workflow"] = {**run.counts, "decomposed": int(run.root.expanded), "max_rounds_hit":
                           int(run.stop_reason == "max_rounds")}
    finish_episode(ep)
