"""Which repository files a DVC stage's code imports, read from the code itself (`ast`), transitively.

Used by tests/test_dvc_deps.py to check that every stage's `deps` in dvc.yaml cover the code it runs, and runnable
to print what each stage imports: `python -m tests.code_deps` (or `python tests/code_deps.py`).

Rules:
- a stage's entry module is the `python -m <module>` of its cmd;
- every `import` / `from ... import` anywhere in a file counts, inside functions too (a lazy import runs when the
  stage needs it, and what it runs decides the stage's outputs); relative imports are resolved;
- a name resolves to a repository file (`a/b.py` or `a/b/__init__.py`) or to nothing (a third-party module);
  importing `a.b.c` runs the `__init__.py` of `a` and `a.b` too;
- an `__init__.py` counts as a file the stage runs only when it holds more than a docstring, `__future__` imports
  and constant assignments (`__version__ = "..."`); the imports it does hold are followed either way.
"""
from __future__ import annotations

import ast
import re
import sys
from collections import deque
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"(?:^|\s)python3?\s+-m\s+([\w.]+)")


def entry_modules(cmd: str) -> list[str]:
    """The modules a stage cmd runs with `python -m` (a cmd may chain several with &&)."""
    return ENTRY.findall(cmd)


def module_file(root: Path, name: str) -> Path | None:
    """The repository file of a dotted module name, or None when it is not a module of this repository."""
    base = root.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(root: Path, path: Path) -> set[str]:
    """Dotted names a file imports anywhere (inside functions too); `from a import b` gives `a` and `a.b`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    this = _module_name(root, path)
    package = this if _is_package(path) else this.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .x import y / from .. import y
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                mod = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                mod = node.module or ""
            if mod == "__future__":
                continue
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names if a.name != "*")
    return names


def _runs_code(path: Path) -> bool:
    """False for an `__init__.py` of a docstring, `__future__` imports and literal assignments only."""
    if not _is_package(path):
        return True
    for stmt in ast.parse(path.read_text()).body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            continue
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            try:
                ast.literal_eval(stmt.value)
                continue
            except (ValueError, TypeError, SyntaxError):
                pass
        return True
    return False


def _files_of(root: Path, name: str) -> list[Path]:
    """Files that importing `name` runs: each package `__init__.py` on the way down, then the module."""
    parts = name.split(".")
    out = []
    for i in range(1, len(parts) + 1):
        p = module_file(root, ".".join(parts[:i]))
        if p is None:
            break
        out.append(p)
    return out


def imported_files(root: Path, modules: Iterable[str]) -> dict[str, list[str]]:
    """Every repository file that running `modules` imports, transitively -> the import chain that reaches it.

    Keys and chain entries are repo-relative posix paths; files that only hold a docstring are left out.
    """
    chains: dict[Path, list[Path]] = {}
    todo: deque[Path] = deque()  # breadth first: each chain is a shortest one
    for m in modules:
        for p in _files_of(root, m):
            if p not in chains:
                chains[p] = [p]
                todo.append(p)
    while todo:
        path = todo.popleft()
        for name in sorted(imported_names(root, path)):
            for p in _files_of(root, name):
                if p not in chains:
                    chains[p] = [*chains[path], p]
                    todo.append(p)
    rel = lambda p: p.relative_to(root).as_posix()  # noqa: E731
    return {rel(p): [rel(c) for c in chain] for p, chain in sorted(chains.items()) if _runs_code(p)}


def covered(path: str, deps: Iterable[str]) -> bool:
    """True if a dep is the file itself or a directory containing it."""
    return any(PurePosixPath(path).is_relative_to(d) for d in deps)


def stage_code_files(root: Path = REPO) -> dict[str, dict[str, list[str]]]:
    """stage name -> {imported repo file -> import chain}, for every dvc.yaml stage whose cmd runs `python -m`."""
    from ragteam.lineage import load_stages

    out = {}
    for name, stage in load_stages(root).items():
        if mods := entry_modules(stage.cmd):
            out[name] = imported_files(root, mods)
    return out


def missing_deps(root: Path = REPO) -> list[str]:
    """One line per (stage, imported repo file) that no declared dep covers, with the import chain."""
    from ragteam.lineage import load_stages

    stages = load_stages(root)
    return [f"stage {name}: imports {f} but no dep in dvc.yaml covers it (import chain: {' -> '.join(chain)})"
            for name, files in stage_code_files(root).items()
            for f, chain in files.items() if not covered(f, stages[name].deps)]


def unused_code_deps(root: Path = REPO, code_dirs: Iterable[str] = ("ragteam", "stages")) -> list[str]:
    """One line per declared dep under `code_dirs` that covers no file the stage imports: it would re-run the
    stage on edits that cannot change its outputs (often a module that moved)."""
    from ragteam.lineage import load_stages

    stages = load_stages(root)
    out = []
    for name, files in stage_code_files(root).items():
        for d in stages[name].deps:
            if PurePosixPath(d).parts[0] in code_dirs and not any(covered(f, [d]) for f in files):
                out.append(f"stage {name}: dep {d} covers no file the stage imports")
    return out


def minimal_cover(root: Path, files: Iterable[str], top: Iterable[str] = ("ragteam", "stages")) -> list[str]:
    """The fewest deps that cover `files` and nothing else that runs code: a directory where every file in it that
    runs code is in `files`, else the files. `top` directories themselves are never proposed (a wholesale
    `ragteam` dep would re-run every stage on any edit)."""
    files = set(files)

    def full(d: Path) -> bool:
        return all(p.relative_to(root).as_posix() in files or not _runs_code(p) for p in d.rglob("*.py")
                   if "__pycache__" not in p.parts)

    out: list[str] = []
    for f in sorted(files):
        parts = PurePosixPath(f).parts
        best = f
        for i in range(len(parts) - 1, 1, -1):  # the largest enclosing directory below a top one
            d = "/".join(parts[:i])
            if full(root / d):
                best = d
        if parts[0] not in top or len(parts) == 1:
            best = f
        if not covered(best, out):
            out.append(best)
    return out


if __name__ == "__main__":
    from ragteam.lineage import load_stages

    stages = load_stages(REPO)
    suggest = "--suggest" in sys.argv
    for name, files in stage_code_files(REPO).items():
        print(f"{name}:")
        if suggest:
            print("\n".join(f"  - {d}" for d in minimal_cover(REPO, files)))
            continue
        for f in files:
            print(f"  {'  ' if covered(f, stages[name].deps) else '! '}{f}")
