"""The evaluation-only baselines (FlashRAG's native, standard RAG, Iter-RetGen, IRCoT, SuRe, and DRAG's debate):
one `System` each with one row kind of the same name and no training. They share one params section,
`eval.baselines` (DRAG: `maps.debate`), so they live in one module."""
from __future__ import annotations

from ragteam.agents.baselines import ROLE as GENERATOR, run_iter_retgen, run_native, run_standard_rag
from ragteam.agents.debate import run_debate
from ragteam.agents.ircot import ROLE as REASONER, run_ircot
from ragteam.agents.sure import ROLES as SURE_ROLES, run_sure
from ragteam.systems.spec import RowKind, System

FAMILY = "Baselines"   # one figure panel for all of them

ROWS: dict[str, RowKind] = {
    "native": RowKind(roles=(GENERATOR,), family=FAMILY, retrieves=False,
                      run=lambda rows, team, retriever, cfgs, spec, name: run_native(rows, team, system=name)),
    "standard_rag": RowKind(roles=(GENERATOR,), family=FAMILY, compared_with="native",   # does retrieval help at all
                            run=lambda rows, team, retriever, cfgs, spec, name: run_standard_rag(
                                rows, team, retriever, cfgs.baselines, system=name)),
    "iter_retgen": RowKind(roles=(GENERATOR,), family=FAMILY,
                           run=lambda rows, team, retriever, cfgs, spec, name: run_iter_retgen(
                               rows, team, retriever, cfgs.baselines, system=name)),
    "drag": RowKind(roles=("proponent", "opponent", "moderator", "answer_agent"), family=FAMILY,
                    run=lambda rows, team, retriever, cfgs, spec, name: run_debate(
                        rows, team, retriever, cfgs.maps.debate, answer=True, system=name)),
    "ircot": RowKind(roles=(REASONER,), family=FAMILY,
                     run=lambda rows, team, retriever, cfgs, spec, name: run_ircot(
                         rows, team, retriever, cfgs.baselines.ircot, system=name)),
    "sure": RowKind(roles=SURE_ROLES, family=FAMILY,
                    run=lambda rows, team, retriever, cfgs, spec, name: run_sure(
                        rows, team, retriever, cfgs.baselines.sure, system=name)),
}

SYSTEMS = tuple(System(name=kind, rows={kind: row}) for kind, row in ROWS.items())
