"""Versions of the trained agents and other `dvc.yaml` artifacts, the way DVC's model registry keeps them: a
registered version is an annotated git tag in GTO's format (`<artifact>@v<major>.<minor>.<patch>`), so
`dvc artifacts get <repo> <artifact> --rev v1.2.0` fetches exactly that version from the DVC remote.

`register` checks what GTO does not: the artifact is declared in `dvc.yaml`, and the commit's `dvc.lock` records its
path as an output of a stage (a version must point at something a stage produced, with its hash); GTO then writes
the tag. The outputs must be in the remote (`dvc push`) for a fetch from another machine to work.

`register_run` registers every model artifact the committed run at HEAD produced, under one version (the next minor
above all of theirs), after checking what `dvc artifacts get` will need: a clean tree, `dvc status` clean for each
artifact's stage and the stages upstream of it, and the files in the default remote.
"""
from __future__ import annotations

import contextlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

SEMVER = re.compile(r"^v\d+\.\d+\.\d+$")


class RegistryError(ValueError):
    """An artifact that is not declared, not produced at that commit, or a malformed version."""


@dataclass(frozen=True)
class Registered:
    artifact: str
    version: str
    tag: str
    commit: str


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def declared_artifacts(root: Path, rev: str = "HEAD") -> dict[str, dict]:
    """`artifacts:` of dvc.yaml at REV."""
    got = _git(root, "show", f"{rev}:dvc.yaml")
    if got.returncode:
        raise RegistryError(f"{root}: no dvc.yaml at {rev} ({got.stderr.strip()})")
    return (yaml.safe_load(got.stdout) or {}).get("artifacts") or {}


def locked_outs(root: Path, rev: str = "HEAD") -> dict[str, str]:
    """Output path -> the stage that produced it, from dvc.lock at REV."""
    got = _git(root, "show", f"{rev}:dvc.lock")
    if got.returncode:
        return {}
    stages = (yaml.safe_load(got.stdout) or {}).get("stages") or {}
    return {o["path"]: name for name, st in stages.items() for o in st.get("outs", [])}


def register(root: str | Path, artifact: str, version: str | None = None, rev: str = "HEAD",
             message: str | None = None) -> Registered:
    """Register ARTIFACT at REV as VERSION (default: the next patch version, v0.0.1 first)."""
    import gto.api
    from gto.exceptions import GTOException

    r = Path(root).resolve()
    commit = _git(r, "rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}")
    if commit.returncode:
        raise RegistryError(f"{r}: {rev!r} is not a commit")
    commit_sha = commit.stdout.strip()
    arts = declared_artifacts(r, commit_sha)
    if artifact not in arts:
        raise RegistryError(f"artifact {artifact!r} is not in dvc.yaml's artifacts at {rev} "
                            f"(declared: {', '.join(sorted(arts)) or 'none'})")
    path = str(arts[artifact].get("path", "")).rstrip("/")
    outs = locked_outs(r, commit_sha)
    if path not in outs:
        raise RegistryError(f"artifact {artifact!r}: {path} is not an output in dvc.lock at {rev}: "
                            "run the stage that produces it and commit dvc.lock first")
    if version is not None and not SEMVER.match(version):
        raise RegistryError(f"version {version!r}: expected v<major>.<minor>.<patch>, e.g. v1.0.0")
    msg = message or f"{artifact} from stage {outs[path]} at {commit_sha[:12]}"
    try:
        got = gto.api.register(r, artifact, commit_sha, version=version, message=msg)
    except GTOException as e:
        raise RegistryError(f"artifact {artifact!r}: {e}") from e
    return Registered(artifact, got.version, f"{artifact}@{got.version}", commit_sha)


def versions(root: str | Path, artifact: str | None = None) -> list[Registered]:
    """Every registered version (of one artifact, or all), in version order per artifact (not by tag time: two tags
    made in the same second have the same timestamp)."""
    import gto.api

    from gto.exceptions import ArtifactNotFound

    r = Path(root).resolve()
    names = [artifact] if artifact else sorted(gto.api.show(r))
    out = []
    for name in names:
        try:    # an artifact with tags is listed even where HEAD's dvc.yaml no longer declares it
            rows = gto.api.show(r, name)
        except ArtifactNotFound:
            declared = declared_artifacts(r)
            if name in declared:             # declared, never registered: no versions
                continue
            raise RegistryError(f"artifact {name!r} is not in dvc.yaml's artifacts and has no registered version "
                                f"(declared: {', '.join(sorted(declared)) or 'none'})") from None
        for row in sorted(rows, key=lambda x: tuple(int(n) for n in x["version"].lstrip("v").split("."))):
            out.append(Registered(name, row["version"], row["ref"], row["commit_hexsha"]))
    return out


# ---- the committed run's models, registered together: `ragteam registry register-run` ----

@dataclass(frozen=True)
class RunRegistration:
    """What `register_run` tagged (or, with dry_run, would tag), and what it left alone and why."""
    version: str
    commit: str
    registered: list[Registered]
    skipped: list[tuple[str, str]]          # (artifact, why)


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in version.lstrip("v").split("."))


def run_version(taken: list[str]) -> str:
    """The version of a run's registration: the next minor version above every version the run's artifacts already
    have (v0.1.0 first). A run's models share one version; `register` (one artifact) bumps the patch in between."""
    if not taken:
        return "v0.1.0"
    major, minor, _ = _vkey(max(taken, key=_vkey))
    return f"v{major}.{minor + 1}.0"


def _dirty(root: Path) -> list[str]:
    got = _git(root, "status", "--porcelain", "--untracked-files=no")
    if got.returncode:
        raise RegistryError(f"{root}: not a git checkout ({got.stderr.strip()})")
    return [line[3:] for line in got.stdout.splitlines() if line.strip()]


def _fmt_status(entries: list) -> str:
    """`dvc status`'s entries for one stage, as 'changed deps: params.yaml:w modified, ...'."""
    parts = []
    for e in entries:
        if isinstance(e, str):
            parts.append(e)
            continue
        for kind, changed in e.items():
            items = []
            for path, what in changed.items():
                if isinstance(what, dict):          # params: {file: {param: modified}}
                    items += [f"{path}:{p} {w}" for p, w in what.items()]
                else:
                    items.append(f"{path} {what}")
            parts.append(f"{kind}: {', '.join(items)}")
    return "; ".join(parts)


def _run_problems(root: Path, todo: list[tuple[str, str, str]]) -> list[str]:
    """For each (artifact, path, stage): why it may not be registered from this workspace, as `dvc status` sees it:
    its stage or a stage upstream is not up to date with dvc.lock, or the DVC remote lacks its files."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    problems = []
    try:    # dvc resolves stage names and reports paths from the working directory
        with contextlib.chdir(root), Repo(str(root)) as repo:
            for artifact, path, stage in todo:
                stale = repo.status(targets=[stage], with_deps=True)
                if stale:
                    why = " | ".join(f"{s}: {_fmt_status(e)}" for s, e in stale.items())
                    problems.append(f"{artifact}: `dvc status` finds the lock stale for it ({why}): run `dvc repro "
                                    f"{stage}` and commit dvc.lock (`dvc pull` where outputs are only not checked out)")
                    continue
                cloud = repo.status(targets=[stage], cloud=True)
                if any(st in ("new", "missing") for p, st in cloud.items() if p == path or p.startswith(path + "/")):
                    remote = repo.config["core"].get("remote") or "default"
                    problems.append(f"{artifact}: {path} is not (all) in the DVC remote '{remote}': run `dvc push`")
    except DvcException as e:
        raise RegistryError(f"{root}: dvc status failed: {e}") from e
    return problems


def register_run(root: str | Path, version: str | None = None, types: tuple[str, ...] = ("model",),
                 dry_run: bool = False) -> RunRegistration:
    """Register every artifact of dvc.yaml of a type in TYPES that the committed run at HEAD produced, all under one
    version (default: `run_version`). Refused, with nothing tagged, where the working tree has uncommitted changes,
    where `dvc status` finds an artifact's stage or a stage upstream of it out of date with dvc.lock, or where the
    default DVC remote lacks its files (`dvc artifacts get` fetches from there). An artifact already registered at
    this commit, or declared but not an output in dvc.lock, is skipped and reported."""
    import gto.api
    from gto.exceptions import GTOException

    r = Path(root).resolve()
    dirty = _dirty(r)
    if dirty:
        raise RegistryError(f"{r}: uncommitted changes ({', '.join(dirty[:5])}{', ...' * (len(dirty) > 5)}): "
                            "commit them first, a version names a commit")
    commit = _git(r, "rev-parse", "--verify", "HEAD^{commit}")
    if commit.returncode:
        raise RegistryError(f"{r}: no commit yet")
    sha = commit.stdout.strip()
    if version is not None and not SEMVER.match(version):
        raise RegistryError(f"version {version!r}: expected v<major>.<minor>.<patch>, e.g. v1.0.0")
    arts = {name: a for name, a in declared_artifacts(r, sha).items() if a.get("type") in types}
    if not arts:
        raise RegistryError(f"{r}: dvc.yaml declares no artifact of type {' or '.join(types)}")
    outs = locked_outs(r, sha)
    known = versions(r)
    taken = [v.version for v in known if v.artifact in arts]
    here = {v.artifact: v.version for v in known if v.commit == sha}
    todo, skipped = [], []
    for name, a in sorted(arts.items()):
        path = str(a.get("path", "")).rstrip("/")
        if name in here:
            skipped.append((name, f"already registered at this commit as {here[name]}"))
        elif path not in outs:
            skipped.append((name, f"{path} is not an output in dvc.lock"))
        else:
            todo.append((name, path, outs[path]))
    version = version or run_version(taken)
    if todo:
        problems = _run_problems(r, todo)
        if problems:
            raise RegistryError("nothing registered: " + "; ".join(problems))
    registered = [Registered(name, version, f"{name}@{version}", sha) for name, _, _ in todo]
    if dry_run:
        return RunRegistration(version, sha, registered, skipped)
    made = []
    try:
        for name, _, stage in todo:
            gto.api.register(r, name, sha, version=version,
                             message=f"{name} from stage {stage} at {sha[:12]} (run {version})")
            made.append(f"{name}@{version}")
    except GTOException as e:
        for tag in made:                    # all or nothing
            _git(r, "tag", "-d", tag)
        raise RegistryError(f"nothing registered: {e}") from e
    return RunRegistration(version, sha, registered, skipped)
