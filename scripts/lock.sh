#!/usr/bin/env bash
# Regenerate requirements.lock: the orchestrator environment (.venv) pinned to exact versions with sha256 hashes,
# for CPython 3.11 on x86-64 Linux with the CPU build of torch. scripts/setup.sh installs exactly this file
# (`pip install --no-deps --require-hashes`), so a fresh clone gets the environment that produced dvc.lock.
#
# Versions already in requirements.lock are kept while they satisfy pyproject.toml (uv's preference for existing
# pins); to move one, edit or delete its line first (or: scripts/lock.sh --upgrade-package transformers). After a
# change, rerun the stages whose outputs depend on it: config.json records transformers_version, so a new
# transformers changes every model hash in dvc.lock.
#
# uv does the resolution (pinned below, installed into a throwaway venv); pyserini is added with --no-deps: only its
# bundled Anserini jar is used, none of its 50+ runtime dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PYSERINI="pyserini==1.6.0"
source scripts/lock_common.sh   # $tools, $uv_bin (uv pinned there)
uv=("$uv_bin" pip compile --quiet --generate-hashes --python-version 3.11
    --python-platform x86_64-manylinux_2_28 --no-header)
[[ -d /opt/wheels ]] && uv+=(--find-links /opt/wheels)     # where this machine keeps the CPU torch wheel
out=$(mktemp)
[[ -f requirements.lock ]] && cp requirements.lock "$out"
"${uv[@]}" pyproject.toml --extra dev -o "$out" "$@"
{
  echo "# The orchestrator environment (.venv), exact versions and sha256 hashes: CPython 3.11, x86-64 Linux, CPU torch."
  echo "# Installed by scripts/setup.sh with pip --no-deps --require-hashes; regenerate with scripts/lock.sh."
  echo "# torch 2.13.0+cpu is PyTorch's CPU build: on a machine without it in its pip configuration, add"
  echo "# https://download.pytorch.org/whl/cpu as an extra index (PIP_EXTRA_INDEX_URL)."
  grep -v -i "^pyserini==" "$out" | sed '/^# The orchestrator/,/^# https/d'
  echo "$PYSERINI" | "${uv[@]}" - --no-deps | sed "s|    # via -r -|    # installed --no-deps: only its Anserini jar is used|"
} > "$out.final"
mv "$out.final" requirements.lock
rm -f "$out"
echo "lock: requirements.lock has $(grep -c '^[A-Za-z0-9].*==' requirements.lock) pinned packages"
