"""The library reads one way: a module imports only from its own layer or the layers below it, and no file of the
library, the stages or the flows is past 600 lines. Imports inside functions count (a lazy import is still a
dependency). The exceptions that remain are listed by name, each a debt of the "one system, one module" issue:
a new one fails this test, and so does an exception that no longer exists (the list only shrinks)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600

# lowest first; a module may import its own layer and those before it
LAYERS = [
    {"io", "config", "records", "environment", "orchestration_env", "metrics", "timing"},   # leaves
    {"data", "llm", "models", "ray_jobs"},
    {"retrieval"},
    {"agents"},
    {"rewards"},
    {"train"},
    {"warmup"},
    {"systems"},
    {"eval"},
    {"params_check", "profiles", "release", "lineage", "registry", "views"},
    {"stages", "flows"},
    {"cli"},
]
# module -> layer, by the first part of its name below ragteam
SPECIAL = {"ragteam": 0}

# imports that still run upward (importer, imported): to remove, not to add to
KNOWN_UPWARD: set[tuple[str, str]] = set()
# files over MAX_LINES that remain
KNOWN_LONG: set[str] = set()


def layer_of(module: str) -> int | None:
    if module in SPECIAL:
        return SPECIAL[module]
    parts = module.split(".")
    head = parts[1] if parts[0] == "ragteam" and len(parts) > 1 else parts[0]
    for i, layer in enumerate(LAYERS):
        if head in layer:
            return i
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def library_files() -> list[Path]:
    return sorted(p for d in ("ragteam", "stages", "flows") for p in (ROOT / d).rglob("*.py"))


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}   # `from ragteam.eval import evaluate`
    return {m for m in out if m.split(".")[0] in ("ragteam", "stages", "flows")}


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for path in library_files():
        me = module_name(path)
        mine = layer_of(me)
        assert mine is not None, f"{me}: in no layer of LAYERS (add it where it belongs)"
        for imp in imports(path):
            if not _is_module(imp):
                continue
            theirs = layer_of(imp)
            if theirs is not None and theirs > mine:
                found.add((me, imp))
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel.with_suffix(".py")).is_file() or (ROOT / rel / "__init__.py").is_file()


def test_no_import_runs_up_the_layers_but_the_known_ones():
    found = upward_imports()
    new = sorted(found - KNOWN_UPWARD)
    gone = sorted(KNOWN_UPWARD - found)
    assert not new, f"imports from a lower layer to a higher one: {new} (layers: tests/test_layering.py LAYERS)"
    assert not gone, f"these are gone: remove them from KNOWN_UPWARD: {gone}"


def test_no_library_file_is_past_600_lines_but_the_known_ones():
    long = {str(p.relative_to(ROOT)) for p in library_files() if len(p.read_text().splitlines()) > MAX_LINES}
    assert not long - KNOWN_LONG, f"past {MAX_LINES} lines: {sorted(long - KNOWN_LONG)}: split them"
    assert not KNOWN_LONG - long, f"no longer past {MAX_LINES} lines: remove from KNOWN_LONG: {sorted(KNOWN_LONG - long)}"


def test_the_checker_sees_an_upward_import(tmp_path):
    """A planted lower-layer module that imports the evaluation driver is caught (the checker is not blind)."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ragteam.eval.evaluate import run_system\n")
    assert "ragteam.eval.evaluate" in imports(probe)
    assert layer_of("ragteam.agents.probe") < layer_of("ragteam.eval.evaluate")


# the engine backends: what a module outside ragteam/llm asks for through `load_engine`, `EnginePool` or
# `ragteam.llm.policy.policy_engine`, never by building one itself (issue 72 §3: the warm-up probes did)
ENGINE_BACKENDS = {"ragteam.llm.hf", "ragteam.llm.vllm_backend", "ragteam.llm.ray_engines"}


def test_no_module_outside_the_llm_package_builds_an_engine_backend_itself():
    found = {(module_name(p), imp) for p in library_files() if not module_name(p).startswith("ragteam.llm")
             for imp in imports(p) if any(imp == b or imp.startswith(b + ".") for b in ENGINE_BACKENDS)}
    assert not found, f"engine backends imported outside ragteam/llm (use load_engine / policy_engine): {sorted(found)}"


def test_the_backend_check_sees_a_direct_build(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(p, c):\n    from ragteam.llm.hf import HFEngine\n    return HFEngine(p, c)\n")
    assert "ragteam.llm.hf" in imports(probe)
