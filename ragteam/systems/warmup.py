"""params.yaml `warmup` as the stages parse it: the warm-up's own model (`ragteam.warmup.sft.WarmupParams`), whose
per-system overrides may name only the registered systems with a warm-up oracle."""
from __future__ import annotations

from pydantic import model_validator

from ragteam.systems.registry import oracle_names
from ragteam.warmup.sft import WarmupParams


class WarmupSection(WarmupParams):
    """params.yaml `warmup` as the stages parse it: `WarmupParams` whose per-system overrides (`systems.<system>`)
    name registered systems with a warm-up oracle."""

    @model_validator(mode="after")
    def _known_systems(self) -> WarmupSection:
        known = oracle_names()
        unknown = sorted(set(self.systems) - set(known))
        if unknown:
            raise ValueError(f"systems: no joint system {', '.join(map(repr, unknown))} (known: {', '.join(known)})")
        return self
