"""A registered agent version with its evaluation: `ragteam registry get` fetches the model directory of a GTO tag
(`<artifact>@vX.Y.Z`) and writes a release model card into the copy, the training card of the directory with its
Evaluation section replaced by the scores, 95 % intervals and paired differences that the evaluation stages
recorded at the tagged commit for the rows that read this directory, and those scores as Hugging Face `model-index`
metadata.

The training stage cannot write them into its own card: they exist only after `evaluate` / `evaluate_agents` ran,
and the model directory is a DVC output whose hash the card is part of. So the card is completed where a release
leaves the pipeline, and only with numbers that were measured on exactly these weights: at the tagged commit, the
evaluating stage's `dvc.lock` entry must match that commit's data, code and params, the way `dvc status` would judge
them in a checkout of that commit (`stage_changes`). A version whose evaluation is stale, or missing, is refused
with the command that fixes it; `--no-eval` fetches it with the training card alone.

Everything is read through `dvc.api.DVCFileSystem` at the tag: git-held files from git, DVC outputs' listings
from the cache or the remote, so a clone needs no checkout or pull of the other stages' data.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from ragteam.lineage import lookup
from ragteam.registry import SEMVER, RegistryError
from ragteam.train.model_card import README, front_matter

# the stages whose records score trained agents, and the records they write (git-held: readable at any commit)
EVALUATORS = {"evaluate": ("metrics/eval.json", "metrics/eval_compare.json"),
              "evaluate_agents": ("metrics/eval_agents.json",)}
_LEVEL = "95 %"


def _open_fs(repo: str, rev: str):
    from dvc.api import DVCFileSystem

    try:
        fs = DVCFileSystem(repo, rev=rev)
        fs.repo.scm.get_rev()    # the filesystem opens lazily: resolve the revision here, inside the try
        return fs
    except Exception as e:   # dvc raises its own SCM/clone errors; a user's bad URL or rev is what they mean
        if "unknown Git revision" in str(e) and "@" in rev:
            artifact, _, version = rev.partition("@")
            raise RegistryError(f"{repo}: no tag {rev}: {version} of {artifact!r} is not registered there (list the "
                                f"versions with `ragteam registry list`; fetch the tags of a clone with "
                                f"`git fetch --tags`)") from e
        raise RegistryError(f"{repo} at {rev}: cannot open it ({type(e).__name__}: {e})") from e


def _unreadable(fs, path: str) -> bool:
    """Whether the DVC output directory `path` exists at the revision but cannot be listed: its `.dir` listing is in
    neither the cache nor the remote (DVC then answers `exists` False for every file under it)."""
    from dvc_data.index import DataIndexError

    try:
        if not fs.isdir(path):
            return False
        fs.ls(path)
        return False
    except DataIndexError:   # DataIndexDirError: the `.dir` listing could not be loaded from cache or remote
        return True


def _read_yaml(fs, path: str) -> dict:
    try:
        return yaml.safe_load(fs.read_text(path)) or {}
    except FileNotFoundError:
        return {}


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def tree_md5(fs, path: str, out_md5: Mapping[str, str]) -> str:
    """The md5 `dvc.lock` would record for PATH as a dependency, from what the commit holds: an output's own hash;
    else a file's md5, or a directory's `.dir` hash, DVC's md5 of the JSON list of {md5, relpath} of every file
    under it sorted by path parts (dvc_data's Tree), where a file inside an output has the md5 its output's listing
    gives and a git-held file the md5 of its bytes."""
    if path in out_md5:
        return out_md5[path]
    if not fs.isdir(path):
        info = fs.info(path).get("dvc_info") or {}
        return info.get("md5") or _md5(fs.read_bytes(path))
    rows = []
    for p, info in fs.find(path, detail=True).items():
        rel = PurePosixPath(p).relative_to(path)
        if "__pycache__" in rel.parts or rel.suffix == ".pyc":   # .dvcignore
            continue
        md5 = (info.get("dvc_info") or {}).get("md5") or _md5(fs.read_bytes(p))
        rows.append((rel.parts, {"md5": md5, "relpath": rel.as_posix()}))
    rows.sort(key=lambda r: r[0])
    return _md5(json.dumps([r for _, r in rows], sort_keys=True).encode("utf-8")) + ".dir"


def stage_changes(fs, lock: Mapping, stage: str) -> list[str]:
    """What of STAGE's `dvc.lock` entry no longer matches the commit FS reads: each dependency whose hash and each
    param whose value differ, as `dvc status` would name them ([] = the stage's outputs are of these inputs)."""
    stages = lock.get("stages") or {}
    entry = stages[stage]
    out_md5 = {o["path"]: o.get("md5") for st in stages.values() for o in st.get("outs", [])}
    changed = []
    for dep in entry.get("deps", []):
        try:
            now = tree_md5(fs, dep["path"], out_md5)
        except FileNotFoundError:
            now = None
        if now != dep.get("md5"):
            changed.append(f"{dep['path']} ({'deleted' if now is None else 'modified'})")
    for file, values in (entry.get("params") or {}).items():
        current = _read_yaml(fs, file)
        # a param gone from the file differs from one locked as null: a sentinel, not None, marks it missing
        changed += [f"{file}:{k}" for k, v in values.items() if lookup(current, k, missing=KeyError) != v]
    return changed


def _ci(value: float, ci) -> str:
    return f"{value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{value:.2f}"


def _diff(d: Mapping) -> str:
    cell = f"{d['diff']:+.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"
    return f"**{cell}** †" if d.get("significant") else cell


def reading_rows(params: Mapping, path: str) -> dict[str, list[str]]:
    """Which rows of the evaluation stages read checkpoint PATH under the commit's params: {"evaluate": eval.systems
    rows whose roles load it, "evaluate_agents": the eval_agents.agents (answer/query/judge) whose eval.agents
    checkpoint it is}."""
    from ragteam.eval.agents import ROLE
    from ragteam.eval.evaluate import ROLES, EvalConfig, role_models

    try:
        ev = EvalConfig(**(params.get("eval") or {}))
    except Exception as e:
        raise RegistryError(f"params.yaml at the tagged commit: its eval section does not parse ({e})") from e
    rows = []
    for name, spec in ev.systems.items():
        used = role_models(spec, ev.agents)
        if any(used.get(r) is not None and used[r].rstrip("/") == path for r in ROLES[spec.workflow]):
            rows.append(name)
    alone = [a for a in (params.get("eval_agents") or {}).get("agents") or []
             if a in ROLE and str(ev.agents.get(ROLE[a], "")).rstrip("/") == path]
    return {"evaluate": rows, "evaluate_agents": alone}


def _benchmarks(record: Mapping) -> list[str]:
    return [b for b in record if b != "avg"] + (["avg"] if "avg" in record else [])


def evaluation_section(records: Mapping[str, Any], rows: Mapping[str, list[str]]) -> tuple[list[str], list[dict]]:
    """The card's Evaluation section (markdown lines) and its `model-index` results, from the records."""
    from ragteam.eval.agents import LABELS, TESTED

    lines: list[str] = []
    results: list[dict] = []
    ev, compare = records.get("metrics/eval.json") or {}, records.get("metrics/eval_compare.json") or {}
    team = [r for r in rows.get("evaluate", []) if r in ev]
    if team:
        lines += ["### Team rows that run on these weights (`evaluate`)", "",
                  "| row | benchmark | questions | EM | F1 | no answer % |", "|---|---|---:|---:|---:|---:|"]
        for row in team:
            for b in _benchmarks(ev[row]):
                m = ev[row][b]
                lines.append(f"| {row} | {b} | {m['n']:.0f} | {_ci(m['em'], m.get('em_ci'))} | "
                             f"{_ci(m['f1'], m.get('f1_ci'))} | {_ci(m['no_answer'], m.get('no_answer_ci'))} |")
                if b != "avg":
                    results.append({"task": {"type": "question-answering", "name": f"retrieval-augmented QA ({row})"},
                                    "dataset": {"name": b, "type": b},
                                    "metrics": [{"type": k, "value": m[k], "name": f"{k.upper()} ({row})"}
                                                for k in ("em", "f1")]})
        lines.append("")
        pairs = [(name, p) for name, p in compare.items() if p.get("a") in team or p.get("b") in team]
        if pairs:
            lines += ["Paired differences over the same questions (a − b, paired bootstrap):", "",
                      "| a − b | benchmark | questions | EM | F1 |", "|---|---|---:|---:|---:|"]
            for name, p in pairs:
                for b in (k for k in p if k not in ("a", "b")):
                    lines.append(f"| {name} | {b} | {p[b]['n']} | {_diff(p[b]['em'])} | {_diff(p[b]['f1'])} |")
            lines.append("")
    alone = records.get("metrics/eval_agents.json") or {}
    for agent in rows.get("evaluate_agents", []):
        benches = [b for b in _benchmarks(alone) if agent in alone[b]]
        if not benches:
            continue
        lines += [f"### The {agent} agent alone against its base model (`evaluate_agents`)", "",
                  "| metric | benchmark | questions | base | trained | trained − base |", "|---|---|---:|---:|---:|---:|"]
        for metric in TESTED[agent]:
            for b in benches:
                m = alone[b][agent]
                if metric not in m["diff"]:
                    continue
                lines.append(f"| {LABELS[metric]} | {b} | {alone[b]['n']} | "
                             f"{_ci(m['base'][metric], m['base'].get(f'{metric}_ci'))} | "
                             f"{_ci(m['trained'][metric], m['trained'].get(f'{metric}_ci'))} | "
                             f"{_diff(m['diff'][metric])} |")
                if b != "avg":
                    results.append({"task": {"type": "question-answering", "name": f"{agent} agent alone"},
                                    "dataset": {"name": b, "type": b},
                                    "metrics": [{"type": metric, "value": m["trained"][metric],
                                                 "name": f"{LABELS[metric]} ({agent} agent)"}]})
        lines.append("")
    return lines, results


def release_card(card: str, *, artifact: str, version: str, commit: str, evaluated: Mapping[str, list[str]],
                 section: list[str], results: list[dict]) -> str:
    """CARD (a training card: front matter, `## Evaluation` section) with the release's evaluation in place of
    that section's pointer, `model-index` results and `ragteam.release` (artifact, version, commit, which stages'
    records) in its front matter."""
    front = front_matter(card)
    body = re.sub(r"^---\n.*?\n---\n", "", card, count=1, flags=re.S)
    front.setdefault("ragteam", {})["release"] = {"artifact": artifact, "version": version, "commit": commit,
                                                  "evaluated_by": {s: r for s, r in evaluated.items() if r}}
    if results:
        front["model-index"] = [{"name": f"{artifact}@{version}", "results": results}]
    evaluated_by = ", ".join(f"`{s}` ({', '.join(r)})" for s, r in evaluated.items() if r)
    intro = [f"Release `{artifact}@{version}` (commit `{commit[:12]}`). Scores in percent with {_LEVEL} percentile "
             f"bootstrap intervals over questions; **bold †**: 0 lies outside a paired difference's interval. "
             f"Recorded by {evaluated_by} at that commit, whose `dvc.lock` entries match its data, code and params: "
             f"the numbers are of exactly these weights.", ""] if section else \
            [f"Release `{artifact}@{version}` (commit `{commit[:12]}`), fetched without evaluation (`--no-eval`): "
             f"no numbers here are of these weights.", ""]
    new_eval = "## Evaluation\n\n" + "\n".join(intro + section)
    if re.search(r"^## Evaluation\n", body, re.M):
        body = re.sub(r"^## Evaluation\n.*?(?=^## |\Z)", lambda _: new_eval + "\n", body, count=1, flags=re.S | re.M)
    else:
        body = body.rstrip("\n") + "\n\n" + new_eval + "\n"
    return "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip() + "\n---\n" + body


def get_release(repo: str | Path, artifact: str, version: str, out: str | Path, *, evaluation: bool = True) -> Path:
    """Fetch ARTIFACT at VERSION (its GTO tag) from REPO (a path or git URL; the data comes from its DVC remote)
    into OUT, a new directory, with the release card as its README.md. All or nothing: OUT appears complete or
    not at all."""
    if not SEMVER.match(version):
        raise RegistryError(f"version {version!r}: expected v<major>.<minor>.<patch>, e.g. v1.0.0")
    dest = Path(out)
    if dest.exists():
        raise RegistryError(f"{dest}: already exists; name a new directory")
    tag = f"{artifact}@{version}"
    repo = str(repo)
    fs = _open_fs(repo, tag)
    commit = fs.repo.scm.get_rev()
    dvc_yaml = _read_yaml(fs, "dvc.yaml")
    arts = dvc_yaml.get("artifacts") or {}
    if artifact not in arts:
        raise RegistryError(f"{tag}: artifact {artifact!r} is not in dvc.yaml's artifacts there")
    path = str(arts[artifact]["path"]).rstrip("/")
    lock = _read_yaml(fs, "dvc.lock")
    card_path = f"{path}/{README}"
    from dvc_data.index import DataIndexError

    try:
        has_card = fs.exists(card_path)
    except DataIndexError:   # the output's listing is in no cache or remote here
        has_card = None
    if has_card is None or (not has_card and _unreadable(fs, path)):
        raise RegistryError(f"{tag}: {path} is an output of that commit, but its files are in neither the DVC cache "
                            f"nor the remote of {repo}: run `dvc push` in the checkout that trained it (or point "
                            f"--repo at one whose remote holds them)")
    if not has_card:
        raise RegistryError(f"{tag}: {path} has no {README} (a model card); only trained agents have one")
    card = fs.read_text(card_path)

    evaluated: dict[str, list[str]] = {}
    section: list[str] = []
    results: list[dict] = []
    if evaluation:
        rows = reading_rows(_read_yaml(fs, "params.yaml"), path)
        stages = lock.get("stages") or {}
        for stage, wanted in rows.items():
            if not wanted:
                continue
            if stage not in stages:
                raise RegistryError(f"{tag}: rows {wanted} of stage {stage} read {path}, but {stage} has not run at "
                                    f"that commit (no dvc.lock entry): run `dvc repro {stage}`, commit, and "
                                    f"register a new version (or fetch with --no-eval)")
            changed = stage_changes(fs, lock, stage)
            if changed:
                raise RegistryError(f"{tag}: {stage}'s records at {commit[:12]} are not of this commit's inputs, "
                                    f"changed since it ran: {', '.join(changed[:6])}"
                                    f"{' …' if len(changed) > 6 else ''}; run `dvc repro {stage}`, commit, and "
                                    f"register a new version (or fetch with --no-eval)")
            evaluated[stage] = wanted
        if not any(evaluated.values()):
            raise RegistryError(f"{tag}: no row of evaluate or evaluate_agents reads {path} under that commit's "
                                f"params (eval.systems, eval.agents): nothing measured these weights; fetch with "
                                f"--no-eval")
        records = {}
        for stage in evaluated:
            for rec in EVALUATORS[stage]:
                if fs.exists(rec):
                    records[rec] = json.loads(fs.read_text(rec))
        section, results = evaluation_section(records, evaluated)

    text = release_card(card, artifact=artifact, version=version, commit=commit, evaluated=evaluated,
                        section=section, results=results)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        fs.get(path, str(tmp / "model"), recursive=True)
        (tmp / "model" / README).write_text(text, encoding="utf-8")
        (tmp / "model").rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
