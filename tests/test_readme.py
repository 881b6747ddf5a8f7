"""README.md is for the people who use the project: short, its two commands first and true, its results table
generated from the committed metrics (scripts/readme_results.py), every command in it one that exists, and its DAG
the stages of dvc.yaml. Links and anchors are checked with the docs' (tests/test_docs.py)."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_WORDS = 1500
MAX_DECIMALS = 40                                     # numbers like 9.85, 0.7, 53.2
DECIMAL = re.compile(r"\d+\.\d+")
KNOWN_TOOLS = {"make", "ragteam", "dvc", "xargs"}     # what a README command may start with


def text() -> str:
    return README.read_text(encoding="utf-8")


def fenced(md: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"(?ms)^```(\w*)\n(.*?)^```", md)]


def shell_commands(body: str) -> list[list[str]]:
    """The simple commands of a shell block: comments dropped, split at && || ; |, leading VAR=value dropped."""
    out = []
    for line in body.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        for part in re.split(r"&&|\|\||;|\|", line):
            words = shlex.split(part)
            while words and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words.pop(0)
            if words:
                out.append(words)
    return out


def inline_commands(md: str) -> list[list[str]]:
    """`make ...`, `ragteam ...` and `dvc ...` in the prose (outside code blocks)."""
    prose = re.sub(r"(?ms)^```.*?^```", "", md)
    out = []
    for span in re.findall(r"`([^`\n]+)`", prose):
        out += [w for w in shell_commands(span) if w[0] in ("make", "ragteam", "dvc") and len(w) > 1]
    return out


def make_targets() -> set[str]:
    return set(re.findall(r"(?m)^([A-Za-z0-9][\w.-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(encoding="utf-8")))


def load_script():
    spec = importlib.util.spec_from_file_location("readme_results", ROOT / "scripts/readme_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- size and front page ----

def test_readme_is_short():
    md = text()
    words, decimals = len(md.split()), DECIMAL.findall(md)
    assert words <= MAX_WORDS, f"README.md has {words} words (at most {MAX_WORDS}): move detail to docs/"
    assert len(decimals) <= MAX_DECIMALS, f"README.md has {len(decimals)} decimal numbers (at most {MAX_DECIMALS})"


def test_the_two_commands_come_first_and_ci_runs_the_test_one():
    md = text()
    head = md.split("\n## ", 1)[0]
    blocks = fenced(head)
    assert blocks, "the README opens with a code block of its two commands"
    first = [" ".join(c) for c in shell_commands(blocks[0][1])]
    assert first == ["make repro", "make test"], first
    ci = [ln.strip() for ln in (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
          if ln.strip() and not ln.lstrip().startswith("#")]
    assert ci[-1] == first[1], f".ci/run ends with {ci[-1]!r}, the README's test command is {first[1]!r}"


def test_front_page_has_no_lab_notebook():
    """No dated logs and no CPU model names: those belong in docs/ and studies/."""
    md = text()
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", md), "a date on the front page"
    cpus = re.findall(r"\b(Xeon|EPYC|Ryzen|AMX|AVX\w*|Core i\d)\b", md)
    assert not cpus, f"CPU names on the front page: {cpus}"


def test_readme_links_every_docs_page_and_the_studies_index():
    targets = re.findall(r"\]\(([^)\s]+)\)", text())
    linked = {t.split("#", 1)[0] for t in targets}
    want = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} | {"docs/adding-a-system.md", "studies/README.md"}
    assert not want - linked, f"the README does not link {sorted(want - linked)}"
    anchored = [t for t in targets if t.startswith(("docs/", "studies/")) and "#" in t]
    assert not anchored, f"link docs pages by file, not into their sections (they are rewritten): {anchored}"


# ---- the generated blocks ----

def test_results_table_and_run_time_are_generated_from_committed_files():
    mod = load_script()
    md = text()
    stale = [name for name, make in mod.BLOCKS.items() if mod.current(md, name) != make().strip("\n")]
    assert not stale, f"README.md's {stale} block(s) differ from the committed files: " \
                      "python scripts/readme_results.py --write"
    assert mod.rewrite(md) == md


def test_results_table_rounds_to_whole_points():
    mod = load_script()
    assert [mod.whole(x) for x in (2.5, 12.5, -5.5, -0.42, 0.0, 33.91)] == [3, 13, -6, 0, 0, 34]
    assert mod.gain({"diff": 12.5, "lo": 2.5, "hi": 22.5, "significant": True}) == "**+13 [3, 23]**"
    assert mod.gain({"diff": -1.71, "lo": -9.21, "hi": 5.88, "significant": False}) == "-2 [-9, 6]"
    table = mod.results_block()
    assert not DECIMAL.search(table)
    for label, _, _ in mod.ROWS:
        assert f"| {label} |" in table


# ---- commands ----

def ragteam_problem(words: list[str], full: bool) -> str | None:
    """None when `ragteam <words>` names a command of the CLI (and, with full, parses); else why not."""
    import typer

    from ragteam.cli import app

    cmd, path, args = typer.main.get_command(app), ["ragteam"], list(words[1:])
    while getattr(cmd, "commands", None) is not None:         # a group (Typer vendors its own click: no isinstance)
        if not args or args[0].startswith("-"):
            return f"{' '.join(path)}: no subcommand given"
        name = args.pop(0)
        if name not in cmd.commands:
            return f"{' '.join(path)} has no command {name!r}"
        cmd, path = cmd.commands[name], path + [name]
    if path[1:] == ["profile", "flags"] or path[1:] == ["profile", "apply"]:
        missing = [p for p in args if not p.startswith("-") and not (ROOT / "profiles" / f"{p}.yaml").exists()]
        if missing:
            return f"no profiles/{missing[0]}.yaml"
    if full:
        try:
            cmd.make_context(" ".join(path), args)
        except Exception as e:                                  # the vendored click's UsageError and kin
            return f"{' '.join(path)}: {e.format_message() if hasattr(e, 'format_message') else e}"
    return None


def dvc_problem(words: list[str]) -> str | None:
    from dvc.cli.parser import get_main_parser

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ns = get_main_parser().parse_args(words[1:])
    except (SystemExit, Exception):                             # argparse exits; DVC raises DvcParserError
        return f"dvc does not parse {' '.join(words[1:])!r}"
    dvc_yaml = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    if words[1:3] == ["artifacts", "get"] and ns.name.split("@")[0] not in dvc_yaml.get("artifacts", {}):
        return f"dvc.yaml declares no artifact {ns.name!r}"
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    for setting in getattr(ns, "set_param", None) or []:
        node = params
        for key in setting.split("=", 1)[0].split("."):
            if not isinstance(node, dict) or key not in node:
                return f"params.yaml has no {setting.split('=', 1)[0]!r}"
            node = node[key]
    return None


def problem(words: list[str], targets: set[str], full: bool) -> str | None:
    tool = words[0].removeprefix(".venv/bin/")
    if tool not in KNOWN_TOOLS:
        return f"{tool!r} is not a command this project provides ({sorted(KNOWN_TOOLS)})"
    if tool == "xargs":
        rest = [w for w in words[1:] if not w.startswith("-")]
        return problem(rest, targets, full) if rest else "xargs without a command"
    if tool == "make":
        missing = [w for w in words[1:] if not w.startswith("-") and "=" not in w and w not in targets]
        return f"the Makefile has no target {missing[0]!r}" if missing else None
    if tool == "ragteam":
        return ragteam_problem(words, full)
    return dvc_problem(words)


def commands() -> list[tuple[str, list[str], bool]]:
    md = text()
    found = [("block", w, True) for lang, body in fenced(md) if lang in ("bash", "sh", "shell", "")
             for w in shell_commands(body)]
    return found + [("inline", w, False) for w in inline_commands(md)]


@pytest.mark.parametrize("where,words,full", commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_every_readme_command_exists(where, words, full):
    """Make targets, `ragteam` subcommands (and profiles), and dvc commands as DVC parses them, with the artifacts
    and params they name. `make smoke`, `make plots`, `make dag` and `ragteam experiments` are checked like the rest."""
    why = problem(words, make_targets(), full)
    assert why is None, f"README ({where}) `{' '.join(words)}`: {why}"


def test_the_commands_the_readme_promises_are_there():
    cmds = {" ".join(w[:2]) for _, w, _ in commands()}
    assert {"make repro", "make test", "make smoke", "make plots", "make dag", "ragteam experiments",
            "dvc pull", "ragteam registry", "dvc artifacts"} <= cmds


# ---- the DAG ----

def test_the_readme_dag_names_every_stage_of_dvc_yaml():
    """The README's mermaid block is the DAG grouped by hand: every stage of dvc.yaml appears in it (a foreach stage
    as `<stage>@system`), and nothing else does."""
    mermaid = [body for lang, body in fenced(text()) if lang == "mermaid"]
    assert len(mermaid) == 1, "one mermaid block: the DAG"
    labels = re.findall(r"\[\"?([^\]\"]+)\"?\]", mermaid[0])
    named = {n.strip().split("@")[0] for label in labels for n in label.split(",")}
    stages = set(yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
    assert named == stages, f"missing: {sorted(stages - named)}; not stages: {sorted(named - stages)}"
