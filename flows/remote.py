"""Remote mode: the commit a GPU worker runs, the files it needs, and stages sent to the `gpu` deployment.

The orchestrator refuses uncommitted changes to tracked code (`orchestrator_commit`), the worker checks the same
commit out (`checkout_commit`), `dvc pull`s the deps upstream stages produced, runs the stage, `dvc push`es its outs
and returns a record, which the orchestrator reads back as plain JSON from the shared result storage and adopts
(`adopt_remote_result`). See `flows.pipeline` for the flow around it.
"""
from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from ragteam import lineage as lin
from ragteam.io import atomic_dir, atomic_file
from ragteam.orchestration_env import subprocess_env
from flows.storage import (RESULT_STORAGE_ENV, Storage, is_url, result_storage_for,
                           save_storage_block)
from flows.subprocesses import StageFailed, dvc, repro


DEPLOYMENT_POLL_S = 2.0  # how often the orchestrator asks the server whether a deployment run has finished

class CommitUnavailable(RuntimeError):
    """A worker could not check out the commit its orchestrator runs; the message names both commits."""

class UncommittedChanges(RuntimeError):
    """The orchestrating checkout has uncommitted changes to tracked files a GPU worker would not see."""

FULL_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")  # sha1 or sha256, as `git rev-parse HEAD` prints them

def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=subprocess_env())

def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"

def orchestrator_commit(root: Path, stages: dict[str, lin.Stage]) -> str:
    """HEAD of the orchestrating checkout: the commit GPU workers check out. Refused (UncommittedChanges) when a
    tracked file has uncommitted changes a worker would not see: anything but dvc.lock and params files (shipped
    with each run, `worker_files`), declared outs (written by this pipeline) and .gitignore files (dvc edits them).
    Untracked files are refused where a stage depends on them (a new module under a dep directory: it runs here,
    the worker's checkout lacks it); elsewhere they are not looked at."""
    head = lin.git_head(root)
    if not head:
        raise UncommittedChanges(f"{root}: not a git checkout with a commit; prefect.gpu_mode: deployment sends GPU "
                                 f"workers the commit to check out")
    diff = _git(root, "diff", "--name-only", "--relative", "-z", "HEAD")
    if diff.returncode != 0:
        raise UncommittedChanges(f"{root}: `git diff --name-only HEAD` failed: {_last_line(diff.stderr)}")
    shipped = {"dvc.lock"} | {f for st in stages.values() for f in st.params}
    outs = [PurePosixPath(o) for st in stages.values() for o in st.outs]
    unseen = [p for p in diff.stdout.split("\0") if p and p not in shipped and PurePosixPath(p).name != ".gitignore"
              and not any(PurePosixPath(p).is_relative_to(o) for o in outs)]
    code = sorted({d for st in stages.values() for d in st.deps
                   if "${" not in d and not any(lin.overlaps(d, str(o)) for o in outs)})
    if code:
        new = _git(root, "ls-files", "--others", "--exclude-standard", "-z", "--", *code)
        unseen += [p for p in new.stdout.split("\0") if p]
    if unseen:
        raise UncommittedChanges(
            f"{root}: uncommitted changes to {', '.join(sorted(unseen))}: a GPU worker checks out commit {head} "
            f"and would not see them. Commit and push them (or set prefect.gpu_mode: local)")
    return head

def checkout_commit(root: Path, commit: str, log=None) -> str:
    """Worker side: make the checkout at `root` the orchestrator's `commit` (detached HEAD), fetching it from
    `origin` if the clone lacks it (a deployment clones a branch head, shallow). Returns the HEAD the clone had.
    CommitUnavailable, naming both commits, if it cannot."""
    if not FULL_SHA.match(commit):
        raise CommitUnavailable(f"git_commit {commit!r}: not a full commit hash (as `git rev-parse HEAD` prints it)")
    head = lin.git_head(root)
    if head == commit:
        return head
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    if dirty:   # a deployment's fresh clone has none; a person's checkout would carry its edits onto `commit`
        raise CommitUnavailable(f"{root}: uncommitted changes to tracked files ({_last_line(dirty)} ...): refusing "
                                f"to check out the orchestrator's commit {commit} over {head}; run GPU stages in a "
                                f"clean clone (the gpu deployment makes one)")
    has = lambda: _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0  # noqa: E731
    if not has():
        origin = _git(root, "remote", "get-url", "origin").stdout.strip() or "(no 'origin' remote)"
        shallow = _git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        fetch = _git(root, "fetch", "-q", *(["--depth", "1"] if shallow else []), "origin", commit)
        if fetch.returncode != 0 or not has():
            raise CommitUnavailable(
                f"{root}: cannot run the orchestrator's commit {commit}: this clone is at {head} and "
                f"`git fetch origin {commit}` from {origin} failed ({_last_line(fetch.stderr)}); push that commit")
    # only a commit of the branch this deployment clones (its head at clone time): a hash alone would let a run's
    # caller execute any commit the remote serves (forks' and pull requests' included, on some hosts)
    if _git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        deepen = _git(root, "fetch", "-q", "--unshallow", "origin")
        if deepen.returncode != 0:
            raise CommitUnavailable(f"{root}: cannot check that {commit} belongs to the branch at {head}: `git fetch "
                                    f"--unshallow origin` failed ({_last_line(deepen.stderr)})")
    if not head or _git(root, "merge-base", "--is-ancestor", commit, head).returncode != 0:
        raise CommitUnavailable(f"{root}: the orchestrator's commit {commit} is not in the history of the branch "
                                f"this deployment clones (at {head}): push it to that branch, or deploy the branch "
                                f"it is on (RAGTEAM_GIT_BRANCH)")
    co = _git(root, "checkout", "-q", "--detach", commit)
    if co.returncode != 0:
        raise CommitUnavailable(f"{root}: cannot check out the orchestrator's commit {commit} over {head}: "
                                f"{_last_line(co.stderr)}")
    if log:
        log.info(f"checked out {commit}, the orchestrator's commit (the clone was at {head})")
        if head and _git(root, "diff", "--quiet", head, commit, "--", "flows", "ragteam").returncode == 1:
            log.warning(f"flows/ or ragteam/ differ between {head} and {commit}: the stages run {commit}'s code, "
                        f"this flow process runs the code it was loaded with ({head})")
    return head

def pull_targets(stages: dict[str, lin.Stage], name: str) -> list[str]:
    """Paths to `dvc pull` before running `name`: its deps that upstream stages put in the DVC cache."""
    targets: list[str] = []
    for dep in stages[name].deps:
        for other in stages.values():
            if other.name == name:
                continue
            for out in other.cached_outs:
                if lin.overlaps(dep, out):
                    t = dep if PurePosixPath(dep).is_relative_to(out) else out
                    if t not in targets:
                        targets.append(t)
    return targets

@contextmanager
def dvc_repo_lock(root: Path) -> Iterator[Any]:
    """Hold DVC's repo lock (what `dvc repro` holds while it reads/writes dvc.lock); yields the dvc Repo."""
    from dvc.repo import Repo

    with Repo(str(root), _wait_for_lock=True) as repo, repo.lock:
        yield repo


def locked_stage_record(root: Path, name: str, stages: dict[str, lin.Stage]) -> dict:
    """`lineage.stage_record` read under DVC's repo lock. Another stage of the run may be in its `dvc repro` writing
    dvc.lock right now, and DVC rewrites the file in place: read without the lock, it can be empty or cut short and
    the stage that just ran has "no entry" (a smoke run failed so, oracle_traces@decor beside oracle_traces@qagent)."""
    with dvc_repo_lock(root):
        return lin.stage_record(root, name, stages)

def worker_files(root: Path, stages: dict[str, lin.Stage], name: str) -> dict[str, FileBody]:
    """Small git-tracked files a remote worker needs besides its checkout: dvc.lock (so `dvc pull` knows the
    upstream hashes), the stage's params files, and uncached upstream outs it depends on (e.g. metrics)."""
    with dvc_repo_lock(root):
        return out_files(root, sorted(sendable_files(stages, [name])))

def sendable_files(stages: dict[str, lin.Stage], targets: list[str] | None) -> set[str]:
    """What an orchestrator may ship to a remote run of `targets` (see `worker_files`): dvc.lock, the targets'
    params files and the uncached outs of other stages they depend on. Never code, dvc.yaml or anything else."""
    allowed = {"dvc.lock"} | upstream_uncached_outs(stages, targets)
    for name in targets or list(stages):
        allowed.update(stages[name].params)
    return allowed

def upstream_uncached_outs(stages: dict[str, lin.Stage], targets: list[str] | None) -> set[str]:
    """The uncached outs of other stages that `targets` depend on (files, or directories such as curves)."""
    outs: set[str] = set()
    for name in targets or list(stages):
        if name not in stages:
            raise ValueError(f"files: unknown target stage {name!r}")
        for dep in stages[name].deps:
            outs.update(o for other in stages.values() if other.name != name
                        for o in other.outs if o not in other.cached_outs and lin.overlaps(dep, o))
    return outs

# A file's content in a flow's parameters or result (JSON): its text, or {"base64": ...} for bytes that are not
# UTF-8 text (a PNG figure among a training stage's uncached outs)
FileBody = str | dict[str, str]

MAX_SHIPPED_BYTES = 64 << 20   # uncached outs a record or a run's `files` may carry, in all

def out_files(root: Path, paths: list[str]) -> dict[str, FileBody]:
    """Every file of `paths` under `root`, by its project path: a file, or each file below a directory (a DVCLive
    curves directory). A path that does not exist is left out; a symlink is refused (it would ship its target);
    more than MAX_SHIPPED_BYTES in all is refused naming the largest path (an uncached out that big belongs in
    the DVC cache, which moves through the remote)."""
    files: dict[str, FileBody] = {}
    sizes: dict[str, int] = {}
    for rel in paths:
        top = root / rel
        found = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for f in found:
            if f.is_symlink():
                raise ValueError(f"files: {f.relative_to(root).as_posix()} is a symlink: not shipping its target")
            if not f.is_file():
                continue
            data = f.read_bytes()
            sizes[rel] = sizes.get(rel, 0) + len(data)
            if sum(sizes.values()) > MAX_SHIPPED_BYTES:
                big = max(sizes, key=sizes.__getitem__)
                raise ValueError(f"files: the uncached outs to ship exceed {MAX_SHIPPED_BYTES >> 20} MiB ({big}: "
                                 f"{sizes[big] >> 20} MiB): make it a cached out, which moves through the DVC remote")
            try:
                files[f.relative_to(root).as_posix()] = data.decode("utf-8")
            except UnicodeDecodeError:
                files[f.relative_to(root).as_posix()] = {"base64": base64.b64encode(data).decode("ascii")}
    return files

def _file_bytes(rel: str, body: Any) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, dict) and set(body) == {"base64"} and isinstance(body["base64"], str):
        try:
            return base64.b64decode(body["base64"], validate=True)
        except ValueError:
            raise ValueError(f"files: {rel!r}: its base64 does not decode") from None
    raise ValueError(f"files: {rel!r}: the content must be text or {{'base64': ...}}, got {type(body).__name__}")

def write_files(root: Path, files: dict[str, FileBody], allowed: set[str], dirs: set[str] = frozenset()) -> None:
    """Write `files` (path -> content) under `root`: each path must be an `allowed` path, or lie below one of
    `dirs` (allowed outs that may be directories, e.g. DVCLive curves; never dvc.lock or a params file) that is not
    a file here; all of them and their contents are checked before anything is written. A file is swapped in
    atomically; a directory that receives files is rebuilt from them alone and swapped in whole, so no file of its
    previous version stays behind."""
    bodies, below = {}, {}
    for rel, body in files.items():
        p = PurePosixPath(rel)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError(f"files: {rel!r} must be a path inside the project")
        under = [d for d in dirs & allowed if p != PurePosixPath(d) and p.is_relative_to(PurePosixPath(d))]
        if p.as_posix() not in allowed and not under:
            raise ValueError(f"files: refusing to write {rel!r}: a remote run may only write dvc.lock, the target "
                             f"stages' params files and declared outs ({', '.join(sorted(allowed))})")
        if under:
            top = min(under, key=len)
            if (root / top).exists() and not (root / top).is_dir():
                raise ValueError(f"files: refusing to write {rel!r}: {top} is a file here, not a directory")
            below.setdefault(top, []).append(p)
        bodies[p.as_posix()] = _file_bytes(rel, body)
    in_dirs = {p.as_posix() for ps in below.values() for p in ps}
    for rel, data in bodies.items():
        if rel not in in_dirs:
            with atomic_file(root / rel, "wb") as f:
                f.write(data)
    for top, paths in below.items():
        with atomic_dir(root / top) as tmp:
            for p in paths:
                (tmp / p.relative_to(top)).parent.mkdir(parents=True, exist_ok=True)
                (tmp / p.relative_to(top)).write_bytes(bodies[p.as_posix()])

def run_stage_remote(root: Path, stages: dict[str, lin.Stage], name: str, force: bool, log=None) -> dict:
    """Worker side: `dvc pull` the deps, repro the stage, `dvc push` its outs; return its record + uncached outs."""
    if targets := pull_targets(stages, name):
        dvc(root, "pull", *targets, log=log)
    repro(root, name, force, log)
    if stages[name].cached_outs:
        dvc(root, "push", name, log=log)
    record = locked_stage_record(root, name, stages)     # the worker may run other stages beside this one
    record["files"] = out_files(root, [o for o in stages[name].outs if o not in stages[name].cached_outs])
    return record

def adopt_remote_result(root: Path, stages: dict[str, lin.Stage], record: dict, log=None) -> None:
    """Orchestrator side: take the worker's dvc.lock entry and uncached outs, then `dvc pull` the stage's outs."""
    name = record["stage"]
    # the worker returns the stage's uncached outs; nothing else of this checkout may be overwritten by it
    uncached = {o for o in stages[name].outs if o not in stages[name].cached_outs}
    write_files(root, record.get("files", {}), uncached, dirs=uncached)
    path = root / "dvc.lock"
    with dvc_repo_lock(root):  # other stages of this run may be committing to dvc.lock right now
        doc = (yaml.safe_load(path.read_text()) if path.exists() else None) or {"schema": "2.0", "stages": {}}
        doc.setdefault("stages", {})[name] = record["lock"]
        with atomic_file(path) as f:
            yaml.safe_dump(doc, f, sort_keys=False)
    if stages[name].cached_outs:
        dvc(root, "pull", name, log=log)
        with dvc_repo_lock(root) as repo:
            for out in stages[name].cached_outs:  # git-ignore them, as `dvc repro` would have done here
                repo.scm_context.ignore(str(root / out))

def submit_to_deployment(deployment: str, name: str, parameters: dict, storage: Storage) -> dict:
    """Run one stage on the deployment's work pool, wait, and return its record: the run's return value, which it
    persists in `storage` ($RAGTEAM_RESULT_STORAGE for that run) and this side reads back through Prefect."""
    from prefect.deployments import run_deployment

    save_storage_block(storage)          # the worker's run persists through it (a directory: nothing to do)
    run = run_deployment(name=deployment, parameters=parameters, flow_run_name=f"{name}-on-{deployment.split('/')[1]}",
                         job_variables={"env": {RESULT_STORAGE_ENV: str(storage)}}, poll_interval=DEPLOYMENT_POLL_S)
    where = f"stage '{name}': flow run {run.id} on {deployment}"
    if run.state is None or not run.state.is_completed():
        said = f": {run.state.message}" if run.state is not None and run.state.message else ""
        raise StageFailed(f"{where} ended {run.state and run.state.name}{said} (the worker's log has the rest)")
    try:
        result = read_worker_result(run.state, storage)
    except (OSError, ValueError) as e:  # e.g. a worker on another host wrote to a directory this machine lacks
        raise StageFailed(f"{where} completed, but its result could not be read from {storage} "
                          f"({type(e).__name__}: {e}); prefect.result_storage must be a directory the workers and "
                          f"this machine share at the same path, or an s3:// URL both can reach") from None
    record = result.get("stages", {}).get(name) if isinstance(result, dict) else None
    if not isinstance(record, dict) or record.get("stage") != name:
        raise StageFailed(f"{where} returned no record for the stage (its result: {str(result)[:200]})")
    return record

def read_worker_result(state: Any, storage: Storage) -> Any:
    """The return value a worker's flow run persisted, read as plain JSON from inside `storage` (a directory, or an
    s3:// URL through fsspec). Never through Prefect's own deserialiser (`state.result()`): that decodes with
    whatever serializer the run's state names, pickle included, so whoever can write a run's state or the shared
    storage could run code here. Refused: a state that names no stored result, a serializer other than json, a key
    outside `storage`."""
    meta = getattr(state, "data", None)
    if isinstance(meta, dict):
        key, ser = meta.get("storage_key"), (meta.get("serializer") or {}).get("type")
    else:
        key, ser = getattr(meta, "storage_key", None), getattr(getattr(meta, "serializer", None), "type", None)
    if not key:
        raise ValueError("the run's state names no persisted result (no storage_key)")
    if ser != "json":
        raise ValueError(f"the run's result is serialised as {ser!r}, not json: not reading it")
    if is_url(storage):
        base = str(storage).rstrip("/")
        url = key if "://" in key else f"{base}/{key}"
        if not url.startswith(base + "/") or any(p in ("", ".", "..") for p in url[len(base) + 1:].split("/")):
            raise ValueError(f"the run's result {url} lies outside the result storage {base}")
        import fsspec

        with fsspec.open(url, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    else:
        root = Path(storage).resolve()
        path = (Path(key) if Path(key).is_absolute() else root / key).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"the run's result {path} lies outside the result storage {root}")
        data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and set(data) == {"metadata", "result"} and isinstance(data["result"], str):
        data = json.loads(data["result"])  # a whole result record (metadata stored beside the value)
    return data

def dispatch_to_deployment(root: Path, stages: dict[str, lin.Stage], name: str, force: bool, deployment: str,
                           commit: str, log=None) -> dict:
    """Orchestrator side of a GPU stage: push its deps, run it at `commit` on the deployment, adopt the result."""
    if targets := pull_targets(stages, name):
        dvc(root, "push", *targets, log=log)
    params = {"targets": [name], "upstream": False, "remote": True, "force": force, "git_commit": commit,
              "files": worker_files(root, stages, name)}
    record = submit_to_deployment(deployment, name, params, result_storage_for(root))
    if record.get("git_commit") != commit:
        raise StageFailed(f"stage '{name}': the worker ran commit {record.get('git_commit')}, not {commit}")
    adopt_remote_result(root, stages, record, log)
    return record
