"""`ragteam experiments`: what this checkout has run, in at most 120 columns.

Three parts: the default run (a few key params and the headline metrics per system, from params.yaml and the
committed metrics/summary/*.json), the DVC experiment refs (`dvc exp run` results; commits kept in main's history
are not refs), and the named studies of studies/index.yaml (each a question, its answer and the commit to trace)."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

STUDY_INDEX = Path("studies/index.yaml")
STUDY_KEYS = ("name", "dir", "question", "headline", "date", "commit", "command")   # each required; `metrics` not
# params.yaml keys shown for the default run (label, dotted path); a missing one is left out
KEY_PARAMS = (
    ("profile", "profile"), ("LLM", "models.llm.source"), ("data", "data.source"), ("seed", "data.seed"),
    ("engine", "llm.backend"), ("questions/benchmark", "eval.n_questions"), ("PPO steps", "joint.ppo.steps"),
)
SYSTEM_METRICS = (("em", "EM"), ("f1", "F1"), ("no_answer", "no answer"), ("team_reward", "team reward"))


class StudyIndexError(ValueError):
    """studies/index.yaml is not a list of well-formed entries."""


def _dig(tree: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------------- default run
def default_run(root: Path) -> dict:
    """Key params, each system's averaged EM/F1/no-answer/team reward with its paired F1 differences, retrieval
    recall and the MAPS agents' trained-vs-base differences, from what the checkout has committed."""
    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8")) if (root / "params.yaml").is_file() \
        else {}
    out: dict = {"commit": _git(root, "rev-parse", "--short", "HEAD"),
                 "params": {label: v for label, path in KEY_PARAMS if (v := _dig(params, path)) is not None}}
    ev = _read_json(root / "metrics/summary/eval.json")
    systems = {}
    if isinstance(ev, dict):
        for name, row in (ev.get("systems") or {}).items():
            avg = row.get("avg", {}) if isinstance(row, dict) else {}
            systems[name] = {"metrics": {k: avg[k] for k, _ in SYSTEM_METRICS if k in avg}, "f1_vs": {}}
        for pair, row in (ev.get("differences") or {}).items():
            a, _, b = pair.partition(" vs ")
            f1 = _dig(row, "avg.f1")
            if a in systems and isinstance(f1, dict) and "diff" in f1:
                systems[a]["f1_vs"][b] = {k: f1[k] for k in ("diff", "lo", "hi") if k in f1}
    out["systems"] = systems
    out["retrieval"] = {}
    retrieval = _read_json(root / "metrics/summary/retrieval.json")
    for retriever, benches in (retrieval.items() if isinstance(retrieval, dict) else ()):
        for bench, row in (benches.items() if isinstance(benches, dict) else ()):
            if isinstance(row, dict):
                out["retrieval"][f"{retriever}/{bench}"] = row
    agents = _read_json(root / "metrics/summary/eval_agents.json")
    out["agents"] = {role: row for role, row in (_dig(agents, "avg") or {}).items() if isinstance(row, dict)}
    return out


# ----------------------------------------------------------------------------------------------- experiment refs
def experiment_refs(root: Path) -> list[dict]:
    """Every DVC experiment ref of the repository (refs/exps, read through DVC's own parser): name, baseline and
    experiment commits, the experiment commit's date and the profile its params.yaml names."""
    from dvc.repo.experiments.utils import exp_refs
    from dvc.scm import SCM

    scm = SCM(str(root))
    rows = []
    for info in exp_refs(scm):
        sha = scm.get_ref(str(info)) or ""
        rows.append({"name": info.name, "baseline": info.baseline_sha, "commit": sha,
                     "date": _git(root, "log", "-1", "--format=%cs", sha), "profile": _profile_at(root, sha)})
    return sorted(rows, key=lambda r: (r["date"], r["name"] or ""), reverse=True)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    return done.stdout.strip() if done.returncode == 0 else ""


def _profile_at(root: Path, sha: str) -> str:
    try:
        params = yaml.safe_load(_git(root, "show", f"{sha}:params.yaml") or "{}")
    except yaml.YAMLError:
        return ""
    return str(params.get("profile", "")) if isinstance(params, dict) else ""


# --------------------------------------------------------------------------------------------------------- studies
def load_studies(root: Path, index: Path = STUDY_INDEX) -> list[dict] | None:
    """studies/index.yaml's entries, each checked: None when there is no index; StudyIndexError naming the file and
    the entry when one is malformed (not a mapping, a required key missing or empty, a value of the wrong type)."""
    path = root / index
    if not path.is_file():
        return None
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise StudyIndexError(f"{index}: not YAML: {' '.join(str(e).split())}") from None
    if isinstance(doc, dict) and "studies" in doc:
        doc = doc["studies"]
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise StudyIndexError(f"{index}: expected a list of studies, got {type(doc).__name__}")
    entries, seen = [], {}
    for i, raw in enumerate(doc, 1):
        where = f"{index}: entry {i}"
        if not isinstance(raw, dict):
            raise StudyIndexError(f"{where}: expected a mapping with keys {', '.join(STUDY_KEYS)}, got {raw!r:.60}")
        if isinstance(raw.get("name"), str) and raw["name"].strip():
            where += f" ({raw['name']})"
        missing = [k for k in STUDY_KEYS if raw.get(k) in (None, "")]
        if missing:
            raise StudyIndexError(f"{where}: missing {', '.join(missing)}")
        entry = {}
        for key in STUDY_KEYS:
            value = raw[key]
            if key == "date" and isinstance(value, (dt.date, dt.datetime)):
                value = value.isoformat()
            if not isinstance(value, str):
                hint = " (quote it: YAML reads an all-digit hash as a number)" if key == "commit" else ""
                raise StudyIndexError(f"{where}: {key} must be a string, got {type(value).__name__} {value!r}{hint}")
            entry[key] = value.strip()
        metrics = raw.get("metrics") or []
        if isinstance(metrics, str):
            metrics = [metrics]
        if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
            raise StudyIndexError(f"{where}: metrics must be a list of JSON paths, got {metrics!r:.60}")
        entry["metrics"] = metrics
        entry["missing"] = [m for m in metrics if not _metrics_path(root, entry["dir"], m).is_file()]
        if not (root / entry["dir"]).is_dir():
            entry["missing"].insert(0, entry["dir"])
        if entry["name"] in seen:
            raise StudyIndexError(f"{where}: name {entry['name']!r} is also entry {seen[entry['name']]}")
        seen[entry["name"]] = i
        entries.append(entry)
    return entries


def _metrics_path(root: Path, study_dir: str, path: str) -> Path:
    """A metrics path from the repository root, or else from the study's dir."""
    return root / path if (root / path).is_file() else root / study_dir / path


# ---------------------------------------------------------------------------------------------------------- output
def collect(root: Path, with_refs: bool = True) -> dict:
    """Everything the view shows, as data (`--json`); a malformed study index raises StudyIndexError."""
    view: dict = {"default": default_run(root), "studies": load_studies(root), "study_index": str(STUDY_INDEX)}
    view["experiments"], view["experiments_error"] = [], None
    if with_refs:
        try:
            view["experiments"] = experiment_refs(root)
        except Exception as e:   # a view, not a check: say why the refs are unknown and show the rest
            view["experiments_error"] = " ".join(str(e).split()) or type(e).__name__
    return view


def _num(x: Any, signed: bool = False, digits: int = 2) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "" if x is None else str(x)
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def _interval(d: dict) -> str:
    if "lo" in d and "hi" in d:
        return f"{_num(d.get('diff'), True)} [{_num(d['lo'], True)}, {_num(d['hi'], True)}]"
    return _num(d.get("diff"), True)


def render(view: dict, console) -> None:
    """Print `view` (from `collect`) on a rich console (ragteam.views.console: at most 120 columns)."""
    from rich import box
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    d = view["default"]
    at = f" at {d['commit']}" if d.get("commit") else ""
    console.print(Text(f"Default run (params.yaml, metrics/summary/*.json{at})", style="bold"))
    console.print(Padding(Text(" · ".join(f"{k} {v}" for k, v in d["params"].items())), (0, 0, 0, 2), expand=False))
    if d["systems"]:
        cols = [(k, label) for k, label in SYSTEM_METRICS if any(k in s["metrics"] for s in d["systems"].values())]
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        t.add_column("system", no_wrap=True)
        for _, label in cols:
            t.add_column(label, justify="right", no_wrap=True)
        t.add_column("F1 difference, paired [95 % interval]", overflow="fold")
        for name, s in d["systems"].items():
            vs = "\n".join(f"vs {b}: {_interval(x)}" for b, x in s["f1_vs"].items())
            t.add_row(Text(name), *(_num(s["metrics"].get(k)) for k, _ in cols), Text(vs))
        console.print(t)
    else:
        console.print(Text("  no metrics/summary/eval.json: run `make repro`"))
    if d["retrieval"]:
        names = list(dict.fromkeys(k for row in d["retrieval"].values() for k in row))
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title="retrieval", title_justify="left")
        t.add_column("retriever/benchmark", no_wrap=True)
        for k in names:
            t.add_column(k, justify="right")
        for name, row in d["retrieval"].items():
            t.add_row(Text(name), *(_num(row.get(k), digits=3) for k in names))
        console.print(Padding(t, (1, 0, 0, 0), expand=False))
    if d["agents"]:
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title_justify="left",
                  title="MAPS agents alone (evaluate_agents)")
        for col in ("agent", "metric", "base", "trained", "trained - base [95 % interval]"):
            t.add_column(col, justify="left" if col in ("agent", "metric") else "right")
        for role, row in d["agents"].items():
            for metric, diff in (row.get("diff") or {}).items():
                t.add_row(Text(role), Text(metric), _num(_dig(row, f"base.{metric}")),
                          _num(_dig(row, f"trained.{metric}")), _interval(diff) if isinstance(diff, dict) else "")
        console.print(Padding(t, (1, 0, 0, 0), expand=False))

    console.print()
    exps = view["experiments"]
    console.print(Text(f"DVC experiments (refs/exps): {len(exps)}", style="bold"))
    if view["experiments_error"]:
        console.print(Text(f"  not read: {view['experiments_error']}", overflow="fold"))
    elif not exps:
        console.print(Text("  none: the studies below ran as commits, kept in main's history (not experiment refs)"))
    else:
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for col in ("experiment", "date", "profile", "commit", "baseline"):
            t.add_column(col, overflow="fold")
        for r in exps:
            t.add_row(Text(r["name"] or ""), r["date"], Text(r["profile"]), r["commit"][:7], r["baseline"][:7])
        console.print(t)

    console.print()
    studies, index = view["studies"], view["study_index"]
    if studies is None:
        console.print(Text(f"Named studies: no {index} in this checkout", style="bold"))
        return
    console.print(Text(f"Named studies ({index}): {len(studies)}", style="bold"))
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, show_lines=False)
    t.add_column("study", overflow="fold", max_width=26)
    t.add_column("date", no_wrap=True)
    t.add_column("commit", no_wrap=True)
    t.add_column("question → headline", overflow="fold")
    for s in studies:
        text = Text(s["question"])
        text.append("\n→ " + s["headline"], style="bold")
        if s["missing"]:
            text.append(f"\nmissing here: {', '.join(s['missing'])}", style="red")
        t.add_row(Text(s["name"]), s["date"], s["commit"][:7], text, end_section=True)
    console.print(t)
    console.print(Text("(ragteam experiments --study NAME: one study's command and metrics)"))


def study_detail(root: Path, name: str) -> dict:
    """One study of the index with its metrics files read (each a JSON path); KeyError naming the known ones."""
    studies = load_studies(root) or []
    match = [s for s in studies if s["name"] == name]
    if not match:
        raise KeyError(f"{STUDY_INDEX}: no study {name!r} (there are: {', '.join(s['name'] for s in studies)})")
    study = dict(match[0])
    study["metrics_data"] = {m: _read_json(_metrics_path(root, study["dir"], m)) for m in study["metrics"]}
    return study


def _leaves(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in _leaves(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(tree, list) and len(tree) <= 8 and all(not isinstance(v, (dict, list)) for v in tree):
        return [(prefix, tree)]
    return [(prefix, f"[{len(tree)} items]")] if isinstance(tree, list) else [(prefix, tree)]


def render_study(study: dict, console, max_leaves: int = 60) -> None:
    """One study: its fields, then each metrics file's values (dotted keys; at most `max_leaves` a file)."""
    from rich.table import Table
    from rich.text import Text

    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for key in STUDY_KEYS:
        t.add_row(key, Text(study[key]))
    console.print(t)
    for path, data in study["metrics_data"].items():
        console.print()
        if data is None:
            console.print(Text(f"{path}: not found or not JSON here", style="red"))
            continue
        leaves = _leaves(data)
        console.print(Text(f"{path}" + (f" (first {max_leaves} of {len(leaves)} values)"
                                        if len(leaves) > max_leaves else ""), style="bold"))
        m = Table.grid(padding=(0, 2))
        m.add_column(overflow="fold", max_width=70)
        m.add_column(overflow="fold")
        for key, value in leaves[:max_leaves]:
            m.add_row(Text(key), Text(str(value)))
        console.print(m)
