"""Typed parameters: every stage validates its params.yaml section into a pydantic model at the edge.

A wrong key or value fails with a message naming the dotted key (e.g. `data.synthetic.n_passages`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

T = TypeVar("T", bound=BaseModel)


class Strict(BaseModel):
    """Base for param models: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamsError(ValueError):
    """A params file or section is missing or invalid; the message names the key."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except a key repeated in one mapping is an error: YAML would keep only the last one, silently
    dropping the earlier section (a profile once lost its JADE budgets to a second `llm:`)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: params file not found")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: top level must be a mapping")
    return data


def parse_section(params: dict[str, Any], key: str, model: type[T], source: str = "params.yaml") -> T:
    """Validate params[key] (dotted keys allowed) into `model`; errors name `key.sub.field` and the value."""
    node: Any = params
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ParamsError(f"{source}: missing section '{key}'")
        node = node[part]
    try:
        return model.model_validate(node)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in (key, *err["loc"]))
            val = err.get("input")
            shown = "" if err["type"] == "missing" else f" (got {val!r})"
            lines.append(f"  {loc}: {err['msg']}{shown}")
        raise ParamsError(f"{source}: invalid params:\n" + "\n".join(lines)) from None


def deep_merge(base: dict, overlay: dict) -> dict:
    """Overlay wins; nested dicts merge key by key (used for profiles)."""
    out = dict(base)
    for k, v in overlay.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
