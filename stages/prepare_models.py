"""Stage prepare_models: backbone LLM and dense encoder from their source URIs into models/."""
from __future__ import annotations

import sys
from typing import Literal

from pydantic import Field, model_validator

from ragteam.config import ParamsError, Strict, load_params, parse_section
from ragteam.environment import run_record
from ragteam.io import write_json
from ragteam.models import ModelSourceError, Source, prepare_model


class ModelSpec(Strict):
    source: str
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # pypi sources: the wheel's sha256, checked after download (a pypi source must pin ==version and give it)
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")

    @model_validator(mode="after")
    def _pypi_is_pinned(self) -> ModelSpec:
        src = Source.parse(self.source)
        if src.kind == "pypi" and (src.version is None or self.sha256 is None):
            raise ValueError(f"{self.source}: a pypi source needs a pinned version (pypi:<package>==<version>) "
                             "and the wheel's sha256 (sha256: <64 hex digits>)")
        if src.kind != "pypi" and self.sha256 is not None:
            raise ValueError(f"{self.source}: sha256 applies to pypi: sources only; set it to null")
        return self


class ModelsParams(Strict):
    llm: ModelSpec
    encoder: ModelSpec


def main() -> None:
    metrics = {}
    try:
        p = parse_section(load_params(), "models", ModelsParams)
        for name in ("llm", "encoder"):
            spec = getattr(p, name)
            print(f"prepare_models: {name} <- {spec.source}", flush=True)
            try:
                info = prepare_model(spec.source, f"models/{name}", dtype=spec.dtype, sha256=spec.sha256)
            except ModelSourceError as e:
                raise ModelSourceError(f"models.{name}: {e} (models/{name} left untouched)") from None
            metrics[name] = {"bytes": info["bytes"], "files": len(info["files"]), "seconds": info["seconds"]}
    except (ParamsError, ModelSourceError) as e:
        sys.exit(f"prepare_models FAILED: {e}")
    write_json("metrics/prepare_models.json", {**metrics, **run_record()})


if __name__ == "__main__":
    main()
