"""Every CLI error a user can cause prints one `ERROR ...` line naming the problem, exits 1, and shows no traceback."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragteam.cli import error_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args, names", [
    (["profile", "flags", "nosuch"], "profile 'nosuch' not found"),
    (["profile", "apply", "nosuch", "--params", "{params}"], "profile 'nosuch' not found"),
    (["profile", "flags", "paper", "--params", "{tmp}/missing.yaml"], "missing.yaml: params file not found"),
    (["studies:", "summarize", "--metrics", "{tmp}/none.json", "--out-md", "{tmp}/r.md", "--out-json",
      "{tmp}/r.json"], "none.json: file not found"),
    (["lineage", "{tmp}/nothing.txt"], "no dvc.yaml in"),
    (["ask", "--params", "{tmp}/missing.yaml", "who?"], "missing.yaml: params file not found"),
    (["oracle-traces", "nosuch", "--params", "{params}"], "no oracle for system 'nosuch' (known: decor, jade, mask, qagent)"),
    (["oracle-traces", "mask", "--params", "{tmp}/missing.yaml"], "missing.yaml: params file not found"),
])
def test_a_user_error_is_one_line_and_exit_1(tmp_path, args, names):
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    before = params.read_text()
    argv = [a.format(tmp=tmp_path, params=params) for a in args]
    module = "ragteam.cli"
    if argv[0] == "studies:":     # the study tools' own entry point (`python -m studies`), same error handling
        module, argv = "studies", argv[1:]
    done = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR "), done.stderr
    assert names in lines[0]
    assert "Traceback" not in done.stderr and "╭" not in done.stderr
    assert params.read_text() == before                      # a failed command changed nothing


def test_error_line_folds_whitespace_and_names_a_missing_file():
    assert error_line(ValueError("a\n  b\tc")) == "a b c"
    assert error_line(FileNotFoundError(2, "No such file or directory", "x/y.json")) == "x/y.json: file not found"
    assert error_line(ValueError()) == "ValueError"


@pytest.mark.slow
def test_a_missing_model_or_index_names_the_stage_that_makes_it(tmp_path):
    """A model directory or index a stage writes, missing (a fresh clone before `dvc repro` / `dvc pull`): one line
    naming the path, the param it came from and the fix, before any loader runs (transformers would try the hub)."""
    import yaml

    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["llm"]["model"] = str(tmp_path / "no-model")
    p["eval"]["retriever"] = str(tmp_path / "no-index")
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(p))
    (tmp_path / "model").mkdir()
    cases = [
        (["ask", "--system", "native", "--params", str(params), "who?"],
         f"{tmp_path}/no-model: no such model directory (llm.model): run `dvc repro prepare_models`"),
        (["oracle-traces", "mask", "--params", str(params)],
         f"{tmp_path}/no-model: no such model directory (--model, default llm.model)"),
        (["oracle-traces", "mask", "--params", str(params), "--model", str(tmp_path / "model"), "--index",
          str(tmp_path / "gone")], f"{tmp_path}/gone: no such index (--index, default joint.retriever)"),
        (["serve-retriever", "--index", str(tmp_path / "gone")],
         f"{tmp_path}/gone: no such index (--index): build it with its stage"),
    ]
    p["llm"]["model"] = str(tmp_path / "model")
    (tmp_path / "with-model.yaml").write_text(yaml.safe_dump(p))
    cases.append((["ask", "--system", "standard_rag", "--params", str(tmp_path / "with-model.yaml"), "who?"],
                  f"{tmp_path}/no-index: no such index: build it with `dvc repro index_bm25@bm25s`"))
    for argv, names in cases:
        done = subprocess.run([sys.executable, "-m", "ragteam.cli", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("ERROR "), (argv, done.stderr)
        assert names in lines[0], (argv, lines[0])


@pytest.mark.parametrize("edit, names", [
    (lambda p: p["llm"].__setitem__("threads", "many"),
     "llm.threads: Input should be a valid integer, unable to parse string as an integer (got 'many')"),
    (lambda p: p["joint"].__setitem__("systems", ["mask", "nosuch"]),
     "joint.systems: unknown system(s) ['nosuch'] (known: decor, jade, mask, qagent)"),
    (lambda p: p["joint"]["decor"]["ppo"].__setitem__("clip_eps", "wide"), "joint.decor.ppo.clip_eps"),
    (lambda p: p["warmup"]["systems"]["decor"].__setitem__("stop_when", "never"), "warmup.systems.decor"),
    (lambda p: p["eval"]["systems"]["maps"].__setitem__("workflow", "nosuch"), "eval.systems.maps.workflow"),
])
def test_a_bad_param_value_is_refused_before_a_run_or_a_profile(tmp_path, edit, names):
    """`flow run` (a dry run too) and `profile flags / apply` check every section with the models the stages parse
    it with: a bad value deep in params.yaml is one line at once, not a failure an hour into the run."""
    import yaml

    for rel in ("dvc.yaml", "profiles/table3.yaml"):      # table3 adds report rows only: the bad value stays
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    edit(p)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    before = (tmp_path / "params.yaml").read_text()
    commands = [["flow", "run", "--dry-run"], ["profile", "flags", "table3"], ["profile", "apply", "table3"]]
    # every command on the first value; one each on the others (the same check_params, ~3 s a process)
    first = "threads" in names
    for argv in commands if first else [commands[len(names) % 3]]:
        done = subprocess.run([sys.executable, "-m", "ragteam.cli", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("ERROR "), (argv, done.stderr)
        assert names in lines[0] and "Traceback" not in done.stderr, (argv, lines[0])
    assert (tmp_path / "params.yaml").read_text() == before


def test_every_profile_over_the_default_passes_the_check():
    from ragteam.config import load_params
    from ragteam.params_check import check_params
    from ragteam.profiles import merged_params

    check_params(load_params(ROOT / "params.yaml"))
    names = sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml"))
    for a in names:              # each alone, and under or over the overlays meant to compose (`profile flags a b`)
        for b in [None, "paper", "table3"]:
            if a != b:
                combo = [a] if b is None else [a, b]
                check_params(merged_params(combo, ROOT / "params.yaml", ROOT / "profiles"), " + ".join(combo))
