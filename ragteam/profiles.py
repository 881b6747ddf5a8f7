"""Profiles are overlays on params.yaml (profiles/<name>.yaml): they change values, never code paths."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from ragteam.config import ParamsError, deep_merge, load_params
from ragteam.io import atomic_file

PROFILE_DIR = Path("profiles")
# Mappings whose entries the user names (report rows, agent roles): an overlay may add entries there, e.g. the
# Table 3 rows of profiles/table3.yaml; and each joint system's overrides of joint.ppo (empty by default, their keys
# checked against PPOParams by stages.train_joint.load_joint). Everywhere else a key the base lacks is a typo.
def open_mappings() -> tuple[str, ...]:
    """The mappings whose entries the user names (the comment above): the joint systems' and the warmed-up systems'
    from the registry (`ragteam.systems`)."""
    from ragteam.systems.registry import joint_names, oracle_names

    return ("eval.systems", "llm.sampling", *(f"joint.{n}.ppo" for n in joint_names()),
            *(f"warmup.systems.{n}" for n in oracle_names()))
# Mappings an overlay may also take entries out of, by setting an entry to null: a study that scores a few rows of
# `evaluate` (profiles/mask_rl_recipe.yaml) leaves the others out instead of paying for them. The entry must exist
# (a typo stays an error); `dvc exp run` gets `-S '~key'`, Hydra's deletion.
REMOVABLE = ("eval.systems",)


def load_profile(name: str, directory: Path = PROFILE_DIR) -> dict:
    path = directory / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ParamsError(f"profile {name!r} not found at {path} (known: {known})")
    return load_params(path)


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= _flatten(v, key + ".")
        else:
            out[key] = v
    return out


def _has(base: dict, dotted: str) -> bool:
    node: object = base
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _removes(dotted: str, value: object) -> bool:
    """Whether overlay entry `dotted` = `value` takes an entry out of a REMOVABLE mapping (a null entry there)."""
    return value is None and dotted.rpartition(".")[0] in REMOVABLE


def to_set_flags(overlay: dict, base: dict | None = None) -> list[str]:
    """`-S key=value` pairs for `dvc exp run`; values are JSON/YAML literals so lists survive.

    A key `base` lacks (a new entry of an `open_mappings()` mapping) is written `+key=value`: DVC parses `-S` with
    Hydra's override grammar, where `+` adds a key and a plain override of a missing key is an error. A null entry
    of a REMOVABLE mapping is written `~key`, Hydra's deletion.
    """
    flat = _flatten(overlay)
    add = {k: base is not None and not _has(base, k) for k in flat}
    return [f"-S '~{k}'" if _removes(k, v) else f"-S '{'+' if add[k] else ''}{k}={json.dumps(v)}'"
            for k, v in flat.items()]


def _without_removed(merged: dict, prefix: str = "") -> dict:
    """`merged` less the null entries of REMOVABLE mappings (what `~key` does to params.yaml under DVC)."""
    return {k: _without_removed(v, f"{prefix}{k}.") if isinstance(v, dict) else v
            for k, v in merged.items() if not _removes(f"{prefix}{k}", v)}


def _row_fields() -> frozenset[str]:
    """The settings an eval.systems row may hold (`SystemSpec`): a profile may set one a row leaves at its default."""
    from ragteam.eval.evaluate import SystemSpec

    return frozenset(SystemSpec.model_fields)


def check_keys(base: dict, overlay: dict, where: str = "") -> None:
    """An overlay may only change keys the base already has (or add entries to an `open_mappings()` mapping, or set a
    field an eval.systems row leaves at its default, e.g. its own `n_questions`): a typo must not become a silent
    new param."""
    parent = where.rstrip(".").rpartition(".")[0]
    for k, v in overlay.items():
        if k not in base:
            if _removes(f"{where}{k}", v):
                raise ParamsError(f"profile key '{where}{k}' is null, which takes the entry out, but params.yaml "
                                  f"has no such entry")
            if where.rstrip(".") in open_mappings() or (parent == "eval.systems" and k in _row_fields()):
                continue
            raise ParamsError(f"profile key '{where}{k}' does not exist in params.yaml")
        if isinstance(v, dict) and isinstance(base[k], dict):
            check_keys(base[k], v, f"{where}{k}.")


def profile_flags(names: list[str], params: Path = Path("params.yaml"), directory: Path = PROFILE_DIR) -> list[str]:
    """The `-S` flags applying profiles `names` in order (later ones win) over `params`."""
    base, overlay = load_params(params), {}
    for name in names:
        one = load_profile(name, directory)
        check_keys(base, one)
        overlay = deep_merge(overlay, one)
    return to_set_flags(overlay, base)


def merged_params(names: list[str], params: Path = Path("params.yaml"), directory: Path = PROFILE_DIR) -> dict:
    """`params` with profiles `names` applied in order, as `dvc exp run` with their flags (or `profile apply`)
    leaves params.yaml: what `ragteam.params_check.check_params` checks before either."""
    base, overlay = load_params(params), {}
    for name in names:              # the overlays merge first, as in profile_flags: a later profile may set a field
        one = load_profile(name, directory)      # on a row an earlier one takes out, and its flags keep the row
        check_keys(base, one)
        overlay = deep_merge(overlay, one)
    return _without_removed(deep_merge(base, overlay))


def apply_profile(name: str, params: Path = Path("params.yaml"), directory: Path = PROFILE_DIR) -> list[str]:
    base, overlay = load_params(params), load_profile(name, directory)
    check_keys(base, overlay)
    merged = _without_removed(deep_merge(base, overlay))
    flat_merged = _flatten(merged)
    changed = [k for k, v in flat_merged.items() if _flatten(base).get(k) != v]
    changed += [k for k in _flatten(base) if k not in flat_merged]
    with atomic_file(params) as f:
        f.write(f"# profile {name!r} applied over the default by `ragteam profile apply {name}`\n")
        yaml.safe_dump(merged, f, sort_keys=False)
    return changed
