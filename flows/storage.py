"""Where the flow's results are persisted (`prefect.result_storage`): a directory, or an s3:// URL through a
RemoteFileSystem block, shared by an orchestrator and its GPU workers."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any


from ragteam.config import ParamsError, load_params


DEFAULT_RESULT_STORAGE = ".prefect/results"  # git-ignored (/.prefect/)

RESULT_STORAGE_ENV = "RAGTEAM_RESULT_STORAGE"  # set by an orchestrator for the runs it starts on a work pool

# URL schemes a result storage may have: fsspec file systems this environment installs (s3fs comes with dvc-s3)
REMOTE_RESULT_SCHEMES = ("s3",)

Storage = Path | str   # a result storage: a directory, or an s3:// URL (`is_url`)

def check_result_storage(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a directory path or an s3:// URL (a non-empty string)")
    if "://" in v:
        scheme, _, rest = v.partition("://")
        if scheme not in REMOTE_RESULT_SCHEMES:
            raise ValueError(f"a URL must be s3://<bucket>[/<prefix>], not {scheme}:// (or give a directory path, "
                             "relative to the project root or absolute)")
        parts = rest.rstrip("/").split("/")
        if not parts[0] or any(p in ("", ".", "..") for p in parts[1:]):
            raise ValueError(f"{v!r}: an s3:// URL needs a bucket and a prefix without empty, '.' or '..' parts")
    return v

def is_url(storage: Storage) -> bool:
    return isinstance(storage, str) and "://" in storage

def _block_name(url: str) -> str:
    return "ragteam-results-" + hashlib.sha256(url.encode()).hexdigest()[:12]

def storage_block(storage: Storage) -> Path | str:
    """What a flow's `result_storage` is given: a directory as such (Prefect writes through an unsaved
    LocalFileSystem), an s3:// URL as the slug of the RemoteFileSystem block `save_storage_block` creates (Prefect
    persists results only through blocks saved on its server, and loads this one when a run persists)."""
    return f"remote-file-system/{_block_name(storage)}" if is_url(storage) else storage

def save_storage_block(storage: Storage) -> None:
    """Create or update, on the Prefect API in use, the block an s3:// result storage is referred to by
    (`storage_block`): a RemoteFileSystem on that URL, without credentials (fsspec/s3fs reads the usual AWS_*
    variables on whichever host writes or reads). A directory needs none."""
    if is_url(storage):
        from prefect.filesystems import RemoteFileSystem

        RemoteFileSystem(basepath=str(storage)).save(_block_name(str(storage)), overwrite=True)

def result_storage_for(root: str | Path) -> Storage:
    """Where Prefect persists this project's flow results: $RAGTEAM_RESULT_STORAGE if set (an orchestrator sets it
    for the deployment runs it starts, so both sides use one place), else `params.yaml: prefect.result_storage` of
    `root` (relative paths are under `root`), else `.prefect/results`. A directory as a resolved Path, an s3:// URL
    as a string without a trailing slash."""
    if env := os.environ.get(RESULT_STORAGE_ENV):
        if "://" in env:
            try:
                return check_result_storage(env).rstrip("/")
            except ValueError as e:
                raise ValueError(f"${RESULT_STORAGE_ENV}={env!r}: {e}") from None
        path = Path(env).expanduser()
        if not path.is_absolute():
            raise ValueError(f"${RESULT_STORAGE_ENV}={env!r}: must be an absolute path or an s3:// URL")
        return path
    params = Path(root) / "params.yaml"
    value = DEFAULT_RESULT_STORAGE
    if params.is_file():
        cfg = load_params(params).get("prefect")
        if isinstance(cfg, dict) and "result_storage" in cfg:
            value = cfg["result_storage"]
            try:  # the rest of the section is validated when the flow runs (load_prefect_params)
                check_result_storage(value)
            except ValueError as e:
                raise ParamsError(f"{params}: invalid params:\n  prefect.result_storage: {e} (got {value!r})") from None
    if is_url(value):
        return value.rstrip("/")
    return (Path(root) / Path(value).expanduser()).resolve()
