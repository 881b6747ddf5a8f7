"""The pipeline's DAG in a form that fits a screen: stages grouped by family, each foreach stage one node
(`train_joint@{mask,jade,decor,qagent}`), and only the arrows no longer path implies (the transitive reduction, taken
stage by stage before the foreach stages are collapsed, so a collapsed arrow is exact). `ragteam dag` prints it in
at most 120 columns, `ragteam dag --mermaid` as the mermaid block of docs/pipeline.md's `## The DAG`.

The graph is DVC's own (`Repo.index.graph`: a stage depends on the stages whose outs it reads)."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

JOIN = "@"   # DVC's foreach join (dvc.parsing.JOIN)
# family -> the stages in it, by name (a foreach stage by the name before the @); a stage of none is "other"
FAMILIES = (
    ("data", ("prepare_models", "prepare_data")),
    ("indexes", ("index_bm25", "index_dense", "eval_retrieval")),
    ("MAPS agents", ("synthesize", "train_answer", "train_query", "label_judge", "train_judge")),
    ("joint systems", ("oracle_traces", "warmup_joint", "train_joint")),
    ("evaluate", ("evaluate", "evaluate_agents")),
)
OTHER = "other"
DOC_SECTION = "## The DAG"


def dvc_graph(root: Path) -> tuple[list[str], set[tuple[str, str]]]:
    """The stages in dvc.yaml's order and the edges (upstream, downstream), as `dvc dag` draws them."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        index = repo.index
        stages = [s.addressing for s in index.stages]
        edges = {(dep.addressing, stage.addressing) for stage, dep in index.graph.edges}
    return stages, edges


def transitive_reduction(nodes: list[str], edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges no longer path implies (a DAG's reduction is unique)."""
    succ = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)

    def reach(start: str) -> set[str]:
        seen, todo = set(), list(succ[start])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(succ[n])
        return seen

    far = {n: set().union(*(reach(c) for c in succ[n])) if succ[n] else set() for n in nodes}
    return {(a, b) for a, b in edges if b not in far[a]}


def base(stage: str) -> str:
    return stage.split(JOIN, 1)[0]


def family(stage: str) -> str:
    return next((name for name, members in FAMILIES if base(stage) in members), OTHER)


class Dag:
    """The collapsed, reduced graph: `groups` (base name -> its stages in order), grouped by family."""

    def __init__(self, stages: list[str], edges: set[tuple[str, str]]):
        self.groups: dict[str, list[str]] = {}
        for s in stages:
            self.groups.setdefault(base(s), []).append(s)
        self.edges: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
        for a, b in transitive_reduction(stages, edges):
            self.edges[(base(a), base(b))].add((a, b))
        order = [name for name, _ in FAMILIES] + [OTHER]
        self.families: dict[str, list[str]] = {f: [] for f in order}
        for g in self.groups:
            self.families[family(g)].append(g)
        self.families = {f: gs for f, gs in self.families.items() if gs}

    def label(self, group: str) -> str:
        members = self.groups[group]
        if len(members) == 1 and JOIN not in members[0]:
            return group
        return f"{group}{JOIN}{{{','.join(m.split(JOIN, 1)[1] for m in members)}}}"

    def edge_note(self, up: str, down: str) -> str:
        """'' when every stage of `up` feeds every stage of `down` it could; 'one to one' for foreach stages fed
        key by key; else the keys of `up` that feed `down` ("bm25s"), or "for <keys>" of `down` that `up` feeds."""
        pairs = self.edges[(up, down)]
        ups, downs = self.groups[up], self.groups[down]
        keys = lambda stages: [s.split(JOIN, 1)[1] for s in stages if JOIN in s]   # noqa: E731
        if len(ups) > 1 and len(downs) > 1 and keys(ups) == keys(downs) and \
                pairs == {(a, b) for a, b in zip(ups, downs)}:
            return "one to one"
        used_up = [s for s in ups if any(a == s for a, _ in pairs)]
        used_down = [s for s in downs if any(b == s for _, b in pairs)]
        if len(used_up) < len(ups):
            return ",".join(keys(used_up))
        if len(used_down) < len(downs):
            return "for " + ",".join(keys(used_down))
        return ""

    def upstream_label(self, up: str, down: str) -> str:
        """How `down`'s row names a stage it reads from: `index_bm25@bm25s` when only some items of a foreach stage
        feed it, `oracle_traces@{...} (one to one)`, `prepare_models (for mask)` when it feeds only some of `down`."""
        note = self.edge_note(up, down)
        if not note:
            return self.label(up)
        if note == "one to one" or note.startswith("for "):
            return f"{self.label(up)} ({note})"
        return f"{up}{JOIN}{note}" if "," not in note else f"{up}{JOIN}{{{note}}}"

    def upstream(self, group: str) -> list[str]:
        order = [g for gs in self.families.values() for g in gs]
        return sorted((a for a, b in self.edges if b == group), key=order.index)


def from_repo(root: Path) -> Dag:
    return Dag(*dvc_graph(root))


def render(dag: Dag, console) -> None:
    """The families, each stage with the stages it reads from directly (no longer path implied)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    n = sum(len(m) for m in dag.groups.values())
    console.print(Text(f"The pipeline (dvc.yaml): {n} stages, {len(dag.groups)} after collapsing foreach stages; "
                       "an arrow a longer path implies is left out"))
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    t.add_column("family", no_wrap=True, style="bold")
    t.add_column("stage", overflow="fold")
    t.add_column("reads from", overflow="fold")
    for fam, groups in dag.families.items():
        for i, g in enumerate(groups):
            ups = [dag.upstream_label(u, g) for u in dag.upstream(g)]
            t.add_row(fam if i == 0 else "", Text(dag.label(g)), Text(", ".join(ups) or "-"),
                      end_section=i == len(groups) - 1)
    console.print(t)


def _mermaid_id(name: str) -> str:
    return re.sub(r"\W", "_", name)


def mermaid(dag: Dag) -> str:
    """The fenced mermaid block: one subgraph per family, arrows labelled where only some foreach stages take part."""
    lines = ["```mermaid", "flowchart TD"]
    for i, (fam, groups) in enumerate(dag.families.items(), 1):
        lines.append(f'  subgraph family{i}["{fam}"]')
        lines.extend(f'    {_mermaid_id(g)}["{dag.label(g)}"]' for g in groups)
        lines.append("  end")
    order = [g for gs in dag.families.values() for g in gs]
    for a, b in sorted(dag.edges, key=lambda e: (order.index(e[0]), order.index(e[1]))):
        note = dag.edge_note(a, b)
        lines.append(f"  {_mermaid_id(a)} -->{f'|{note}|' if note else ''} {_mermaid_id(b)}")
    lines.append("```")
    return "\n".join(lines) + "\n"


def docs_block(text: str) -> str | None:
    """The mermaid block of the `## The DAG` section of a markdown text (None without one)."""
    m = re.search(rf"^{re.escape(DOC_SECTION)}\n(?:(?!^## ).*\n)*?(```mermaid\n(?:.*\n)*?```\n)", text, re.M)
    return m.group(1) if m else None


def update_docs(path: Path, block: str) -> bool:
    """Replace the mermaid block of `path`'s `## The DAG` section by `block`; False when there is no such block."""
    text = path.read_text(encoding="utf-8")
    old = docs_block(text)
    if old is None:
        return False
    start = text.index(old, text.index(f"{DOC_SECTION}\n"))
    path.write_text(text[:start] + block + text[start + len(old):], encoding="utf-8")
    return True
