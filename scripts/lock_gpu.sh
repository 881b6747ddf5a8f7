#!/usr/bin/env bash
# Resolve the GPU training environment's lock (.venv-gpu: OpenRLHF, DeepSpeed, Ray, CUDA vLLM, faiss-gpu), whose
# input is requirements-gpu.txt: CPython 3.11 on x86_64 manylinux_2_28, from PyPI alone, every file with its sha256.
# torch is pinned with it (requirements-gpu.txt's `# TORCH torch==` line): PyPI's torch for Linux is the CUDA build,
# and its nvidia-* wheels, which the lock pins too, name the CUDA version, so no machine's pip configuration (a CPU
# torch index, say) can stand in for it.
#
# BUILT lists the source distributions that build against the installed torch (flash-attn, an OpenRLHF dependency):
# their pins and hashes go to requirements-gpu-built.lock, which requirements-gpu.txt's header installs second,
# without build isolation, so that the build finds the torch the first file installed; the rest (wheels) go to
# requirements-gpu.lock. tests/test_env_lock.py checks both against requirements-gpu.txt, so a pin moved there
# without rerunning this script fails. Made on a machine without a GPU: the environment it describes has not been
# built or run (docs/environments.md).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILT="flash-attn"
source scripts/lock_common.sh   # $tools, $uv_bin (uv pinned there)
torch_pin=$(sed -n 's/^# TORCH \(torch==[^ ]*\).*/\1/p' requirements-gpu.txt)
[[ -n "$torch_pin" ]] || { echo "lock_gpu: requirements-gpu.txt has no '# TORCH torch==<version>' line" >&2; exit 2; }
{ echo "$torch_pin"; grep -v '^ *#' requirements-gpu.txt | sed 's/ *#.*//; /^ *$/d'; } > "$tools/in.txt"
"$uv_bin" pip compile --quiet --no-config --generate-hashes --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --no-header --index-url https://pypi.org/simple \
  "$tools/in.txt" -o "$tools/lock.txt"
sed '/^ *# via/d; /^    #/d' "$tools/lock.txt" > "$tools/pins.txt"
# a pin is its `name==version \` line and the indented --hash lines after it: the block goes where its first line does
built_re="^($(echo "$BUILT" | tr ' ' '|'))=="
awk -v re="$built_re" -v built="$tools/built.txt" -v rest="$tools/rest.txt" \
  '$0 !~ /^ / {b = ($0 ~ re)} {print > (b ? built : rest)}' "$tools/pins.txt"
for n in $BUILT; do
  grep -q "^$n==" "$tools/built.txt" || { echo "lock_gpu: $n (BUILT) is not in the resolution" >&2; exit 2; }
done
header() {
  echo "# $1 of the GPU training environment's lock (.venv-gpu; install: requirements-gpu.txt's header),"
  echo "# made by scripts/lock_gpu.sh from requirements-gpu.txt + $torch_pin, CPython 3.11, x86_64 manylinux_2_28, PyPI."
  echo "# Resolved on a machine without a GPU: never installed or run yet."
}
{ header "Wheels (installed first)"; cat "$tools/rest.txt"; } > requirements-gpu.lock
{ header "Source builds against torch (installed second, --no-build-isolation)"; cat "$tools/built.txt"; } \
  > requirements-gpu-built.lock
pins() { grep -c '^[A-Za-z0-9].*==' "$1"; }
echo "lock_gpu: requirements-gpu.lock pins $(pins requirements-gpu.lock) packages, requirements-gpu-built.lock $(pins requirements-gpu-built.lock)"
