"""The front door: README.md stays short and links every docs/ page; every relative link and anchor in README.md,
docs/ and experiments/*.md resolves (GitHub's heading slugs), so moving a section cannot leave a dead link."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_WORDS = 4000


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    out, code = set(), False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            code = not code
        elif not code and re.match(r"#{1,6} ", line):
            out.add(slug(line.lstrip("#")))
    return out


def links(md: Path) -> list[str]:
    text, code, found = md.read_text(encoding="utf-8"), False, []
    for line in text.splitlines():
        if line.startswith("```"):
            code = not code
        elif not code:
            found += LINK.findall(line)
    return [t for t in found if not re.match(r"[a-z][a-z0-9+.-]*:", t)]      # http:, mailto: ... not checked


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    dead = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            dead.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            dead.append(f"{target} (no heading with anchor #{anchor} in {dest.relative_to(ROOT)})")
    assert not dead, f"{page.relative_to(ROOT)}: dead links: {dead}"


def test_readme_is_a_front_door_that_links_every_docs_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.split()) <= README_MAX_WORDS
    head = text.split("## ", 1)[0]
    assert "make repro" in head and "make test" in head              # the two commands come first
    assert "**How long.**" in head and " min " in head                # and how long they take
    sections = re.findall(r"(?m)^## (.+)$", text)
    assert sections[0] == "Contents"                                  # then the table of contents
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    listed = {t.split("#", 1)[1] for t in re.findall(r"\]\((#[^)]+)\)", contents)}
    assert listed == {slug(h) for h in sections[1:]}, "the Contents table lists every section of the README"
    linked = {Path(t.split("#")[0]).name for t in links(ROOT / "README.md") if t.startswith("docs/")}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked


def test_slug_matches_githubs_rule():
    assert slug(" Measured: each agent, replicated over seeds on `mirror:../shared/data`") == \
        "measured-each-agent-replicated-over-seeds-on-mirrorshareddata"
    assert slug("Agents, systems and the `evaluate` stage") == "agents-systems-and-the-evaluate-stage"


def test_the_dag_in_the_docs_is_dvc_dags_own():
    import shutil
    import subprocess
    import sys

    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    assert dvc, "dvc is not installed in this environment"
    now = subprocess.run([dvc, "dag", "--mermaid"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    text = (ROOT / "docs/pipeline.md").read_text(encoding="utf-8")
    block = text.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert block.strip() == now.strip(), "docs/pipeline.md's DAG is stale: paste `dvc dag --mermaid` into it"
