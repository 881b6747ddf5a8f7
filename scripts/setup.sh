#!/usr/bin/env bash
# Create (or update) the orchestrator environment in .venv, offline-capable.
# Usage: scripts/setup.sh [--dev]     (--dev: the test tools; the lock has them, so it only matters unlocked)
#
# Which torch (RAGTEAM_TORCH=cpu|cuda, default cpu):
#   cpu   exactly requirements.lock (scripts/lock.sh): every package at the version that produced dvc.lock, checked
#         against its sha256 (pip --no-deps --require-hashes), torch 2.13.0+cpu included. For CPython 3.11 on
#         x86-64 Linux; elsewhere the ranges of pyproject.toml are installed instead, with a warning.
#   cuda  PyPI's torch 2.13.0 (a CUDA build, several GB) and pyproject.toml's ranges: not locked.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=""
[[ "${1:-}" == "--dev" ]] && extras="[dev]"
stamp=".venv/.ragteam-installed${extras}"
for s in "$stamp" ".venv/.ragteam-installed[dev]"; do   # a dev install also satisfies a plain one
  if [[ -f "$s" && "$s" -nt pyproject.toml && "$s" -nt scripts/setup.sh && "$s" -nt requirements.lock \
        && "$s" -nt requirements-build.txt ]]; then
    echo "setup: .venv is up to date"; exit 0
  fi
done
# The Python versions that work are pyproject.toml's requires-python (">=A.B,<C.D"): check the interpreter that
# .venv has or will get, before anything is installed, with a message that says what to do.
req=$(sed -n 's/^requires-python = ">=\([0-9]*\.[0-9]*\),<\([0-9]*\.[0-9]*\)".*/\1 \2/p' pyproject.toml)
[[ -n "$req" ]] || { echo "setup: pyproject.toml has no requires-python = \">=A.B,<C.D\" line" >&2; exit 2; }
read -r lo hi <<<"$req"
py=$PY; [[ -x .venv/bin/python ]] && py=.venv/bin/python
have=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || {
  echo "setup: cannot run '$py'; install Python >=$lo,<$hi and point PYTHON at it (PYTHON=python3.11 make ...)" >&2
  exit 2; }
as_int() { local a=${1%%.*} b=${1#*.}; echo $(( a * 100 + b )); }
if (( $(as_int "$have") < $(as_int "$lo") || $(as_int "$have") >= $(as_int "$hi") )); then
  where="$py"; [[ "$py" == .venv/bin/python ]] && where=".venv (made with $have; remove it to rebuild)"
  echo "setup: Python $have from $where is not supported: ragteam needs >=$lo,<$hi (pyproject.toml);" \
       "run with PYTHON=python$lo (or another supported version)" >&2
  exit 2
fi
start=$(date +%s)
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
# The editable install writes ragteam.egg-info into the checkout, and `make` builds both environments at once: the
# two scripts' editable installs take turns on .setup.lock (flock; without flock, e.g. on macOS, they run as they come).
source scripts/install_pinned.sh     # uv, else pip: the same pins and hashes
locked() { if command -v flock >/dev/null 2>&1; then flock .setup.lock "$@"; else "$@"; fi; }
# pip and the build backend first, each file checked against its sha256 (requirements-build.txt); the editable
# installs below build with --no-build-isolation, so pip fetches no unpinned build tools from an index
.venv/bin/python -m pip install -q --no-deps --require-hashes -r requirements-build.txt
torch_variant=${RAGTEAM_TORCH:-cpu}
[[ "$torch_variant" == cpu || "$torch_variant" == cuda ]] || {
  echo "setup: RAGTEAM_TORCH must be cpu or cuda, not '$torch_variant'" >&2; exit 2; }
if [[ "$torch_variant" == cpu && "$have" == 3.11 && "$(uname -s)-$(uname -m)" == Linux-x86_64 ]]; then
  echo "setup: installing requirements.lock (CPU torch, exact versions, hashes checked)"
  install_pinned .venv --require-hashes -r requirements.lock
  locked .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
else
  echo "setup: WARNING: no lock for torch=$torch_variant, Python $have, $(uname -s)-$(uname -m): installing" \
       "pyproject.toml's ranges; versions may differ from the ones that produced dvc.lock" >&2
  # torch FIRST: any later resolver run then keeps this build instead of choosing one.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  locked .venv/bin/python -m pip install -q --no-build-isolation -e ".${extras}"
  # pyserini only for its bundled Anserini fatjar: we drive Lucene through pyjnius, so none of its
  # 50+ runtime deps (openai, onnxruntime, fastmcp, CUDA torch...) are wanted.
  .venv/bin/python -m pip install -q --no-deps "pyserini==1.6.0"
fi
touch "$stamp"
echo "setup: done in $(( $(date +%s) - start )) s; .venv is $(du -sh .venv | cut -f1)"
