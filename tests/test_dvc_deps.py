"""DVC deps follow the code: every repository file a stage's code imports (transitively, lazy imports included) is
covered by a declared dep, so editing it makes `dvc status` report the stage (and the stages that import it)."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from code_deps import REPO, imported_files, missing_deps, stage_code_files, unused_code_deps

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_every_stage_declares_the_code_it_imports():
    files = stage_code_files(REPO)
    stages = set(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
    # every dvc.yaml stage runs a `python -m stages.<name>` module, so every stage is checked (foreach entries too)
    assert {n.split("@")[0] for n in files} == stages
    missing = missing_deps(REPO)
    assert not missing, "dvc.yaml deps miss code the stages import:\n" + "\n".join(missing)


@pytest.mark.slow
def test_declared_code_deps_are_code_the_stage_imports():
    unused = unused_code_deps(REPO)
    assert not unused, "dvc.yaml declares code deps the stages never import:\n" + "\n".join(unused)


@pytest.mark.slow
def test_train_answer_depends_on_the_answer_prompt_parser_and_metrics():
    """The issue's example: the answer prompt and parser (agents/maps.py) and the normaliser (ragteam/metrics.py)."""
    files = stage_code_files(REPO)
    for stage in ("train_answer", "train_query", "label_judge", "evaluate"):
        assert {"ragteam/agents/maps.py", "ragteam/metrics.py"} <= set(files[stage]), stage


def _toy(tmp_path, deps):
    (tmp_path / "stages").mkdir()
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "stages/__init__.py").write_text('"""Stage modules."""\n')
    (tmp_path / "stages/s.py").write_text(
        "from pkg import a\n\n\ndef main():\n    from pkg.sub import lazy  # only when the stage runs\n"
        "    return lazy.f(a.g())\n")
    (tmp_path / "pkg/__init__.py").write_text('"""Docstring only."""\n__version__ = "1"\n')
    (tmp_path / "pkg/a.py").write_text("from .c import h\n\n\ndef g():\n    return h()\n")
    (tmp_path / "pkg/c.py").write_text("import json\n\n\ndef h():\n    return json.dumps(1)\n")
    (tmp_path / "pkg/unused.py").write_text("X = 1\n")
    (tmp_path / "pkg/sub/__init__.py").write_text("from pkg.unused import X  # runs code\n")
    (tmp_path / "pkg/sub/lazy.py").write_text("def f(x):\n    return x\n")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(
        {"stages": {"s": {"cmd": "python -m stages.s", "deps": deps, "outs": ["out.txt"]}}}))


def test_checker_follows_lazy_relative_and_package_imports_and_names_what_is_missing(tmp_path):
    _toy(tmp_path, ["stages/s.py", "pkg/a.py"])
    files = imported_files(tmp_path, ["stages.s"])
    # docstring-only / constant-only __init__ files run no code; a lazy import and a relative import are followed;
    # a package __init__ that imports something runs it
    assert set(files) == {"stages/s.py", "pkg/a.py", "pkg/c.py", "pkg/sub/__init__.py", "pkg/sub/lazy.py",
                          "pkg/unused.py"}
    assert files["pkg/c.py"] == ["stages/s.py", "pkg/a.py", "pkg/c.py"]
    missing = missing_deps(tmp_path)
    assert [m.split(" but")[0] for m in missing] == [
        "stage s: imports pkg/c.py", "stage s: imports pkg/sub/__init__.py", "stage s: imports pkg/sub/lazy.py",
        "stage s: imports pkg/unused.py"]
    assert "import chain: stages/s.py -> pkg/a.py -> pkg/c.py" in missing[0]


def test_checker_accepts_directory_deps_and_flags_code_deps_nothing_imports(tmp_path):
    _toy(tmp_path, ["stages/s.py", "pkg", "stages/gone.py"])
    assert missing_deps(tmp_path) == []
    assert unused_code_deps(tmp_path) == ["stage s: dep stages/gone.py covers no file the stage imports"]


# ---------------------------------------------------------------- dvc status after a one-line prompt edit


def _dvc(root, *args):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    r = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _placeholder(path: Path):
    if path.exists():
        return
    if path.suffix:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"placeholder {path.name}\n")
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / "placeholder").write_text("placeholder\n")


@pytest.mark.slow
def test_editing_one_line_of_the_answer_prompt_makes_dvc_status_list_every_stage_that_runs_it(tmp_path):
    """A scratch copy of the project with a dvc.lock that matches the workspace (placeholder artifacts, real code):
    clean status, then one edited line of the MAPS answer prompt -> exactly the stages whose code imports it."""
    from ragteam.lineage import load_stages

    root = tmp_path / "proj"
    root.mkdir()
    for d in ("stages", "ragteam"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy(REPO / f, root / f)
    stages = load_stages(root)
    for s in stages.values():
        for p in (*s.deps, *s.outs):
            _placeholder(root / p)
    _dvc(root, "init", "--no-scm", "-q")
    _dvc(root, "config", "core.analytics", "false")
    _dvc(root, "commit", "-f", "-q")       # lock every stage at the workspace's hashes
    assert json.loads(_dvc(root, "status", "--json")) == {}

    maps = root / "ragteam/agents/maps.py"
    text = maps.read_text()
    edited = re.sub(r'^(ANSWER_AGENT_SYSTEM = \(")', r"\1Please. ", text, count=1, flags=re.M)
    assert edited != text, "ANSWER_AGENT_SYSTEM not found in ragteam/agents/maps.py"
    maps.write_text(edited)

    status = json.loads(_dvc(root, "status", "--json"))
    importers = {n for n, files in stage_code_files(root).items() if "ragteam/agents/maps.py" in files}
    assert {"train_answer", "train_query", "label_judge", "train_judge", "evaluate", "synthesize"} <= importers
    assert set(status) == importers
    assert not {"prepare_data", "prepare_models", "index_dense"} & set(status)
    for name in importers:  # each is stale because of its own code dep, not because an upstream out changed
        changed = [c["changed deps"] for c in status[name] if isinstance(c, dict) and "changed deps" in c]
        assert changed and any(k.startswith("ragteam/agents") for k in changed[0]), (name, status[name])
