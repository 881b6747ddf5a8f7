"""Versions of the trained agents and other `dvc.yaml` artifacts, the way DVC's model registry keeps them: a
registered version is an annotated git tag in GTO's format (`<artifact>@v<major>.<minor>.<patch>`), so
`dvc artifacts get <repo> <artifact> --rev v1.2.0` fetches exactly that version from the DVC remote.

`register` checks what GTO does not: the artifact is declared in `dvc.yaml`, and the commit's `dvc.lock` records its
path as an output of a stage (a version must point at something a stage produced, with its hash); GTO then writes
the tag. The outputs must be in the remote (`dvc push`) for a fetch from another machine to work.
"""
from __future__ import annotations

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
