"""Where a joint system starts: the warm-up's merged model, or the backbone where the warm-up was off.

Its own small module (no training imports) so that the stages that only read the choice (train_joint, evaluate,
evaluate_agents) depend on this file alone, not on the warm-up's trainer.
"""
from __future__ import annotations

import json
from pathlib import Path

from ragteam.io import DataError

WARMUP_DIR = Path("models/warmup")     # models/warmup/<system>: the warm-up's merged model (stage warmup_joint)
WARMUP_OFF = "warmup_off.json"         # what that dir holds instead when `warmup.enabled` is false


def start_model(warmup_dir: str | Path, base_model: str) -> str:
    """The checkpoint a joint system starts from (train_joint) and its `<system>_warmup` evaluation row reads: the
    warm-up's model in `warmup_dir`, or `base_model` where the dir records that the warm-up was off."""
    d = Path(warmup_dir)
    if (d / "config.json").is_file():
        return str(d)
    off = d / WARMUP_OFF
    if off.is_file() and json.loads(off.read_text(encoding="utf-8")).get("enabled") is False:
        return base_model
    raise DataError(f"{d}: neither a warm-up model nor {WARMUP_OFF} (warm-up off); run stage "
                    f"warmup_joint@{d.name} first (dvc repro)")
