"""studies/: every study folder is in studies/index.yaml and the index names no other; each entry has the keys the
`ragteam experiments` table reads, and its `dir` and `metrics` paths exist; every study has a README whose links
resolve, and the index page (studies/README.md) lists every study."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"
KEYS = {"name", "dir", "question", "headline", "date", "commit", "command"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _index() -> list[dict]:
    return yaml.safe_load((STUDIES / "index.yaml").read_text(encoding="utf-8"))


def _folders() -> set[str]:
    return {d.name for d in STUDIES.iterdir() if d.is_dir() and d.name != "__pycache__" and not d.name.startswith(".")}


def test_every_study_folder_is_in_the_index_and_vice_versa():
    names = [e["name"] for e in _index()]
    assert len(names) == len(set(names)), "a study is listed twice"
    assert set(names) == _folders()


@pytest.mark.parametrize("entry", _index(), ids=lambda e: e.get("name", "?"))
def test_an_entry_has_the_keys_and_its_paths_exist(entry):
    assert KEYS <= set(entry) <= KEYS | {"metrics"}
    assert all(isinstance(entry[k], str) and entry[k].strip() for k in KEYS)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"])
    assert re.fullmatch(r"[0-9a-f]{7,40}", entry["commit"])
    assert entry["dir"] == f"studies/{entry['name']}" and (ROOT / entry["dir"]).is_dir()
    for m in entry.get("metrics", []):
        assert m.endswith(".json") and (ROOT / m).is_file(), f"{entry['name']}: no metrics file {m}"
    assert (ROOT / entry["dir"] / "README.md").is_file()


def _pages() -> list[Path]:
    return [STUDIES / "README.md", *sorted(STUDIES.glob("*/README.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_readme_link_resolves(page):
    dead = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.partition("#")[0]).exists():
            dead.append(target)
    assert not dead, f"{page.relative_to(ROOT)}: dead links {dead}"


def test_the_index_page_lists_every_study_and_each_readme_fits_a_screen():
    listed = set(re.findall(r"\]\((\w[\w.-]*)/README\.md\)", (STUDIES / "README.md").read_text(encoding="utf-8")))
    assert listed == _folders()
    for readme in STUDIES.glob("*/README.md"):
        assert len(readme.read_text(encoding="utf-8").split()) <= 400, f"{readme}: longer than a screen"
