"""No module outside a system's own decides anything by a system's name. A string constant that is a system's name
(`"decor"`, `"jade_trained"`, `"joint.mask"`...) in the library, the stages or the flows is such a decision; the
files that still hold them are listed with how many, a debt of the "one system, one module" issue: a file may only
lose names (a new one, or more of them, fails), and a file that has none left must leave the list. Docstrings and
comments do not count; `ragteam/systems/` (a system's own module) is exempt."""
from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = "maps|mask|m-ask|jade|decor|qagent|native|standard_rag|iter_retgen|ircot|sure|drag"
NAME = re.compile(rf"(?i)({SYSTEMS})(_\w+)?")
IN_TEXT = re.compile(rf"(?i)\b(joint|warmup\.systems)\.(maps|mask|jade|decor|qagent)\b|ragteam\.\w+\.(maps|mask|jade|decor|qagent)\b")

# file -> string constants naming a system it still holds (to remove when the systems become modules)
KNOWN = {
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def names_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            s = node.value.strip()
            if NAME.fullmatch(s) or IN_TEXT.search(s):
                hits.append(s)
    return hits


def library_files() -> list[Path]:
    files = [p for d in ("ragteam", "stages", "flows") for p in (ROOT / d).rglob("*.py")]
    return sorted(p for p in files if "ragteam/systems/" not in p.as_posix())


def test_no_new_module_decides_by_a_systems_name():
    found = Counter()
    for path in library_files():
        if hits := names_in(path):
            found[path.relative_to(ROOT).as_posix()] = len(hits)
    grew = {f: (KNOWN.get(f, 0), n) for f, n in found.items() if n > KNOWN.get(f, 0)}
    assert not grew, ("system names as string constants outside ragteam/systems/ (file: (allowed, found)): "
                      f"{grew}; a system's decisions belong in its own module")
    done = sorted(set(KNOWN) - set(found))
    assert not done, f"no system names left in {done}: remove them from KNOWN"
    fewer = {f: (KNOWN[f], n) for f, n in found.items() if n < KNOWN[f]}
    assert not fewer, f"fewer system names than listed (file: (listed, found)): {fewer}: lower KNOWN to match"


def test_the_check_sees_a_planted_dispatch(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text('"""Docstrings may say decor."""\nif system == "decor":\n    key = "joint.jade.ppo"\n'
                       'label = "Decor team"\n')
    assert names_in(planted) == ["decor", "joint.jade.ppo"]
