"""Links (README.md's own checks are in tests/test_readme.py): every relative link and anchor in README.md,
docs/ and studies/*.md resolves (GitHub's heading slugs), so moving a section cannot leave a dead link."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


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


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "studies" / "README.md",
         *sorted((ROOT / "studies").glob("*/README.md")), *sorted((ROOT / "studies").glob("*/notes.md"))]


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


def test_slug_matches_githubs_rule():
    assert slug(" Measured: each agent, replicated over seeds on `mirror:../shared/data`") == \
        "measured-each-agent-replicated-over-seeds-on-mirrorshareddata"
    assert slug("Agents, systems and the `evaluate` stage") == "agents-systems-and-the-evaluate-stage"

