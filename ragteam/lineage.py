"""The stage graph and lineage of a DVC project, read from `dvc.yaml` and `dvc.lock` (the only copy of the DAG).

Used by the Prefect flow (`flows/pipeline.py`: plan, per-stage records) and by `ragteam lineage <path>`.
Stages are loaded through DVC's own loader so `vars`, `${...}`, `foreach` and `matrix` resolve exactly as in
`dvc repro`; edges are then derived the way DVC does: stage B depends on stage A when one of B's deps is one of
A's outs, lies inside a directory out of A, or is a directory that contains an out of A.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml


class LineageError(ValueError):
    """dvc.yaml / dvc.lock is missing or inconsistent, or a path/stage is unknown; the message names it."""


@dataclass(frozen=True)
class Stage:
    name: str
    cmd: str
    deps: tuple[str, ...]  # repo-relative posix paths (params files excluded)
    outs: tuple[str, ...]  # every out, metrics and plots included
    cached_outs: tuple[str, ...]  # outs that go to the DVC cache/remote (cache: true)
    metrics: tuple[str, ...]
    params: dict[str, tuple[str, ...]] = field(default_factory=dict)  # params file -> keys ("" = whole file)


# ---------------------------------------------------------------- dvc.yaml


def find_root(start: str | Path = ".") -> Path:
    """The nearest directory at or above `start` holding a dvc.yaml."""
    p = Path(start).resolve()
    for d in (p, *p.parents):
        if (d / "dvc.yaml").is_file():
            return d
    raise LineageError(f"no dvc.yaml in {p} or any parent directory: run it inside a ragteam checkout")


def _rel(root: Path, fs_path: str) -> str:
    return Path(os.path.relpath(fs_path, root)).as_posix()


def load_stages(root: str | Path = ".") -> dict[str, Stage]:
    """Stages of `<root>/dvc.yaml` in file order, with templating resolved by DVC itself."""
    root = Path(root).resolve()
    if not (root / "dvc.yaml").is_file():
        raise LineageError(f"{root / 'dvc.yaml'}: not found")
    from dvc.dependency.param import ParamsDependency
    from dvc.dvcfile import load_file
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    try:
        repo = Repo(str(root), uninitialized=True)
        try:
            loaded = list(load_file(repo, str(root / "dvc.yaml")).stages.values())
        finally:
            repo.close()
    except DvcException as e:
        raise LineageError(f"{root / 'dvc.yaml'}: {e}") from None
    stages: dict[str, Stage] = {}
    for s in loaded:
        cmd = s.cmd if isinstance(s.cmd, str) else " && ".join(s.cmd)
        params: dict[str, tuple[str, ...]] = {}
        deps = []
        for d in s.deps:
            if isinstance(d, ParamsDependency):
                params[_rel(root, d.fs_path)] = tuple(d.params) or ("",)
            else:
                deps.append(_rel(root, d.fs_path))
        outs = tuple(_rel(root, o.fs_path) for o in s.outs)
        stages[s.name] = Stage(
            name=s.name,
            cmd=cmd,
            deps=tuple(deps),
            outs=outs,
            cached_outs=tuple(_rel(root, o.fs_path) for o in s.outs if o.use_cache),
            metrics=tuple(_rel(root, o.fs_path) for o in s.outs if o.metric),
            params=params,
        )
    return stages


def overlaps(a: str, b: str) -> bool:
    """True if the paths are equal or one is a directory containing the other (DVC's dep/out matching)."""
    pa, pb = PurePosixPath(a).parts, PurePosixPath(b).parts
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def build_graph(stages: dict[str, Stage]) -> dict[str, tuple[str, ...]]:
    """stage -> the stages it depends on (whose outs overlap its deps), in dvc.yaml order."""
    graph = {}
    for s in stages.values():
        ups = [
            o.name
            for o in stages.values()
            if o.name != s.name and any(overlaps(d, out) for d in s.deps for out in o.outs)
        ]
        graph[s.name] = tuple(ups)
    return graph


def topo_levels(graph: dict[str, tuple[str, ...]]) -> list[list[str]]:
    """Kahn's algorithm by levels: every stage of a level depends only on earlier levels (order kept)."""
    remaining = {n: set(ups) for n, ups in graph.items()}
    levels = []
    while remaining:
        level = [n for n, ups in remaining.items() if not ups]
        if not level:
            raise LineageError(f"dvc.yaml: cycle among stages {sorted(remaining)}")
        levels.append(level)
        for n in level:
            del remaining[n]
        for ups in remaining.values():
            ups.difference_update(level)
    return levels


def upstream_closure(graph: dict[str, tuple[str, ...]], targets: list[str]) -> set[str]:
    """The targets and every stage they (transitively) depend on."""
    unknown = [t for t in targets if t not in graph]
    if unknown:
        raise LineageError(f"unknown stage(s) {unknown}; dvc.yaml has {list(graph)}")
    seen: set[str] = set()
    todo = list(targets)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(graph[n])
    return seen


def plan(
    graph: dict[str, tuple[str, ...]], targets: list[str] | None = None, upstream: bool = True
) -> list[list[str]]:
    """Topological levels restricted to the targets (plus their upstreams if `upstream`); None = all stages."""
    if not targets:
        keep = set(graph)
    elif upstream:
        keep = upstream_closure(graph, targets)
    else:
        upstream_closure(graph, targets)  # validates the names
        keep = set(targets)
    levels = [[n for n in lvl if n in keep] for lvl in topo_levels(graph)]
    return [lvl for lvl in levels if lvl]


# ---------------------------------------------------------------- dvc.lock, params, metrics, git


def load_lock(root: str | Path = ".") -> dict[str, dict]:
    """Raw `dvc.lock` stage entries (empty if there is no lock yet)."""
    path = Path(root) / "dvc.lock"
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise LineageError(f"{path}: not valid YAML: {e}") from None
    return data.get("stages", {}) or {}


def entry_hashes(entry: dict, kind: str) -> dict[str, dict]:
    """`deps` or `outs` of a lock entry as {path: {md5, size, nfiles?}}."""
    out = {}
    for item in entry.get(kind, []) or []:
        out[item["path"]] = {k: v for k, v in item.items() if k in ("md5", "size", "nfiles")}
    return out


def lookup(data: Any, dotted: str, missing: Any = None) -> Any:
    """The value at DOTTED ("a.b.c") in nested mappings, or MISSING where a key is absent (the whole of DATA for
    "")."""
    node = data
    for part in dotted.split(".") if dotted else []:
        if not isinstance(node, Mapping) or part not in node:
            return missing
        node = node[part]
    return node


def current_params(root: str | Path, stage: Stage) -> dict[str, dict[str, Any]]:
    """The stage's params as they are now in its params files."""
    out: dict[str, dict[str, Any]] = {}
    for fname, keys in stage.params.items():
        path = Path(root) / fname
        data = yaml.safe_load(path.read_text()) if path.exists() else {}
        out[fname] = {k: lookup(data, k) for k in keys}
    return out


def read_metrics(root: str | Path, stage: Stage, records: bool = False) -> dict[str, Any]:
    """The stage's declared metrics files parsed as JSON/YAML (None where missing); with `records` also its plain
    outputs under metrics/ (the whole record a stage writes beside its declared metrics, `ragteam.io.write_metrics`:
    timings, counts, the environment)."""
    values: dict[str, Any] = {}
    extra = [o for o in stage.outs if records and o.startswith("metrics/") and o.endswith(".json")]
    for m in dict.fromkeys([*stage.metrics, *extra]):
        path = Path(root) / m
        if not path.is_file():
            values[m] = None
            continue
        text = path.read_text()
        values[m] = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return values


def _git(root: str | Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_head(root: str | Path) -> str | None:
    return _git(root, "rev-parse", "HEAD")


def git_last_commit(root: str | Path, path: str) -> str | None:
    """The last commit that changed `path` (None if never committed or not a git repo)."""
    return _git(root, "log", "-n1", "--format=%H", "--", path) or None


def git_is_dirty(root: str | Path, path: str) -> bool:
    """True if `path` has uncommitted changes (or is untracked)."""
    return bool(_git(root, "status", "--porcelain", "--", path))


def commit_of(root: str | Path, rev: str) -> str:
    """The full hash of commit `rev`, verified by git (`rev-parse --verify --end-of-options REV^{commit}`): a rev
    read from a file (`--exp-json`) is never handed to git where it could be taken for an option (`--output=...`)."""
    sha = _git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if sha and re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", sha):
        return sha
    if re.fullmatch(r"[0-9a-fA-F]{4,64}", rev):
        raise LineageError(f"commit {rev[:7]} (a run of the study) is not in this repository: DVC keeps "
                           f"experiment commits under refs/exps, which a clone does not fetch; where the study "
                           f"ran, `python -m studies keep <its experiments>` puts them in the branch's history")
    raise LineageError(f"revision {rev!r}: not a commit of the repository at {root} (a run's rev is its commit "
                       f"hash, as `dvc exp show --json` writes it)")


def git_show(root: str | Path, rev: str, path: str) -> str | None:
    """A git-tracked file as commit `rev` holds it, or None where that commit has no such file. A commit missing
    from the repository is an error: a study's experiment commits live under refs/exps, which a clone does not
    fetch, unless `python -m studies keep` put them in the branch's history. `rev` is resolved to a verified commit
    hash first (`commit_of`), so nothing from it reaches git's option parser."""
    sha = commit_of(root, rev)
    got = subprocess.run(["git", "show", "--end-of-options", f"{sha}:{path}"], cwd=root, capture_output=True,
                         text=True)
    return got.stdout if got.returncode == 0 else None


def json_at(root: str | Path, rev: str, path: str) -> Any:
    """A git-tracked JSON record as commit `rev` holds it (None where it has none): `git_show`, parsed."""
    text = git_show(root, rev, path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise LineageError(f"{rev[:7]}:{path}: not JSON ({e})") from None


def experiment_commit(root: str | Path, name: str) -> str:
    """The commit of DVC experiment `name` (its ref `refs/exps/../<name>`), or of any git revision `name`."""
    refs = _git(root, "for-each-ref", "--format=%(objectname) %(refname)", "refs/exps") or ""
    hits = sorted({sha for sha, ref in (line.split(" ", 1) for line in refs.splitlines() if line)
                   if ref.rsplit("/", 1)[-1] == name})
    if len(hits) > 1:
        raise LineageError(f"experiment {name!r}: {len(hits)} experiments have that name ({', '.join(h[:7] for h in hits)}): "
                           f"name one by its commit")
    if hits:
        return hits[0]
    sha = _git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{name}^{{commit}}")
    if not sha:
        raise LineageError(f"{name}: neither a DVC experiment here (`dvc exp list`) nor a git revision")
    return sha


def keep_commits(root: str | Path, names: list[str], message: str) -> tuple[str, list[str]]:
    """Make experiment commits part of the current branch's history, so every clone of it holds them (a clone
    fetches no `refs/exps`): one merge commit whose tree is the branch's own (`git merge -s ours`), with the
    experiments as further parents. `git log --first-parent` still reads the branch alone. Returns (the merge
    commit, the kept commits); commits the branch already holds are not merged again, and with none left nothing
    is written (the branch's HEAD is returned)."""
    shas = list(dict.fromkeys(experiment_commit(root, n) for n in names))
    if _git(root, "symbolic-ref", "--quiet", "HEAD") is None:
        raise LineageError("HEAD is detached: check out the branch that should keep the experiments")
    new = [s for s in shas if _git(root, "merge-base", "--is-ancestor", s, "HEAD") is None]
    if not new:
        return git_head(root) or "", []
    r = subprocess.run(["git", "merge", "--quiet", "--no-ff", "--no-edit", "-s", "ours", "-m", message, *new],
                       cwd=root, capture_output=True, text=True, check=False)
    if r.returncode:
        raise LineageError(f"git merge -s ours of {', '.join(s[:7] for s in new)} failed: "
                           f"{(r.stderr or r.stdout).strip()[-400:]}")
    return git_head(root) or "", new


def md5_file(path: str | Path) -> str:
    h = hashlib.md5()
    with Path(path).open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def stage_record(root: str | Path, name: str, stages: dict[str, Stage] | None = None) -> dict[str, Any]:
    """What a run of `name` produced, from dvc.lock after the run: commit, dep/out md5s, params, metrics."""
    root = Path(root)
    stages = stages or load_stages(root)
    stage = stages[name]
    entry = load_lock(root).get(name)
    if entry is None:
        raise LineageError(f"{root / 'dvc.lock'}: no entry for stage '{name}' (has it run?)")
    return {
        "stage": name,
        "cmd": stage.cmd,
        "git_commit": git_head(root),
        "deps": {p: h.get("md5") for p, h in entry_hashes(entry, "deps").items()},
        "outs": {p: h.get("md5") for p, h in entry_hashes(entry, "outs").items()},
        "params": entry.get("params", {}),
        "metrics": read_metrics(root, stage, records=True),
        "lock": entry,
    }


# ---------------------------------------------------------------- lineage of a path


def load_artifacts(root: str | Path) -> dict[str, dict]:
    """The `artifacts:` section of dvc.yaml (name -> {path, type, desc, ...})."""
    data = yaml.safe_load((Path(root) / "dvc.yaml").read_text()) or {}
    return data.get("artifacts", {}) or {}


def _dir_member_md5(root: Path, dir_md5: str, relpath: str) -> str | None:
    """md5 of a file inside a directory out, from the cached `.dir` manifest of the DVC project at `root` (None if
    not in its cache)."""
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            manifest = Path(repo.cache.local.oid_to_path(dir_md5))
    except Exception:  # not a DVC repo / no cache: the manifest is optional detail
        return None
    if not manifest.is_file():
        return None
    for item in json.loads(manifest.read_text()):
        if item.get("relpath") == relpath:
            return item.get("md5")
    return None


def find_producer(stages: dict[str, Stage], path: str) -> tuple[Stage, str]:
    """The stage whose out is `path` or a directory containing it, and that out."""
    for s in stages.values():
        for out in s.outs:
            if path == out or PurePosixPath(path).is_relative_to(out):
                return s, out
    raise LineageError(f"{path}: not produced by any stage in dvc.yaml")


def recorded_environment(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The `environment` a stage recorded in one of its metrics records (stages/common.py, synthesize, label_judge:
    main or worker, Python, the engine packages' versions), or None where the stage records none."""
    for values in metrics.values():
        if isinstance(values, dict) and isinstance(values.get("environment"), dict):
            return values["environment"]
    return None


def lineage(root: str | Path, path: str | Path, rev: str | None = None) -> dict[str, Any]:
    """Which stage produced `path` (repo-relative or absolute), with its cmd, params, deps, outs and commit, and
    the environment that ran it where the stage recorded one. With `rev` (a commit, branch, tag or experiment
    commit), as that commit has them: read from a detached git worktree of it, so a study's numbers trace to the
    experiment commit that holds them; "current" params are then the commit's own."""
    root = Path(root).resolve()
    p = Path(path)
    rel = Path(os.path.relpath(p.resolve() if p.is_absolute() else (Path.cwd() / p).resolve(), root)).as_posix()
    if rel.startswith("../"):
        raise LineageError(f"{path}: outside the project {root}")
    if rev is not None:
        return _lineage_at(root, rel, rev)
    return _lineage(root, rel, cache_root=root)


def _lineage_at(root: Path, rel: str, rev: str) -> dict[str, Any]:
    import shutil
    import tempfile

    sha = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if not sha:
        raise LineageError(f"--rev {rev}: not a commit of {root} (an experiment's commit is kept by "
                           f"`python -m studies keep <exp>`, or by `dvc exp branch <exp> <branch>`)")
    tmp = Path(tempfile.mkdtemp(prefix="ragteam-lineage-"))
    tree = tmp / "tree"
    try:
        if _git(root, "worktree", "add", "--detach", "--quiet", str(tree), sha) is None:
            raise LineageError(f"--rev {rev}: git worktree add failed in {root}")
        info = _lineage(tree, rel, cache_root=root)
        info["rev"] = sha
        return info
    finally:
        _git(root, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)
        _git(root, "worktree", "prune")


def _lineage(root: Path, rel: str, cache_root: Path) -> dict[str, Any]:
    stages = load_stages(root)
    stage, out = find_producer(stages, rel)
    entry = load_lock(root).get(stage.name)
    lock_deps = entry_hashes(entry, "deps") if entry else {}
    lock_outs = entry_hashes(entry, "outs") if entry else {}
    locked_params = (entry or {}).get("params", {})
    now_params = current_params(root, stage)
    params = []
    for fname, keys in stage.params.items():
        for k in keys:
            in_lock = locked_params.get(fname, {}) or {}
            locked = in_lock.get(k) if k in in_lock else (lookup(in_lock, k) if k else in_lock)  # keys are flat
            params.append({"file": fname, "name": k, "current": now_params[fname][k], "locked": locked})
    info: dict[str, Any] = {
        "path": rel,
        "stage": stage.name,
        "out": out,
        "cmd": stage.cmd,
        "locked": entry is not None,
        "params": params,
        "deps": [{"path": d, **lock_deps.get(d, {})} for d in stage.deps],
        "outs": [{"path": o, **lock_outs.get(o, {})} for o in stage.outs],
        "lock_commit": git_last_commit(root, "dvc.lock"),
        "lock_dirty": git_is_dirty(root, "dvc.lock"),
        "rev": None,
        "artifact": None,
        "environment": recorded_environment(read_metrics(root, stage, records=True)),
    }
    if rel != out and out in lock_outs:
        member = PurePosixPath(rel).relative_to(out).as_posix()
        info["member_md5"] = _dir_member_md5(cache_root, lock_outs[out].get("md5", ""), member)
    if (root / rel).is_file():
        info["workspace_md5"] = md5_file(root / rel)
    for name, art in load_artifacts(root).items():
        apath = PurePosixPath(str(art.get("path", "")))
        if PurePosixPath(rel) == apath or PurePosixPath(rel).is_relative_to(apath):
            info["artifact"] = {"name": name, **art}
            break
    return info
