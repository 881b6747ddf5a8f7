#!/usr/bin/env bash
# Create (or rebuild) the OpenRLHF environment in .venv-openrlhf: openrlhf 0.11.2 (--no-deps), deepspeed 0.19.6
# built with DS_BUILD_OPS=0, transformers 5.15.0 and the CPU torch, with only what OpenRLHF's SFT path imports
# (requirements-openrlhf.in says what and why). Only when asked (`make setup-openrlhf`, and `make test`, whose
# OpenRLHF test runs in it): `make setup` stays light. OpenRLHF runs in it through scripts/openrlhf_cpu.py, which on a
# machine without CUDA first applies the CPU shims (../shared/notes/stack.md section 12).
#
# Two hashed files, as requirements-gpu.lock / -built.lock: requirements-openrlhf.lock (every wheel, installed
# --no-deps --require-hashes) and requirements-openrlhf-built.lock (deepspeed's sdist, built against the installed
# torch: --no-build-isolation, DS_BUILD_OPS=0, DS_ACCELERATOR=cpu; pip keeps the built wheel in its cache, so a
# rebuild on the same machine does not compile again). This project itself is not installed: nothing of ragteam
# runs in this environment (the stage runs OpenRLHF as a subprocess and reads its checkpoint back).
#
# Usage: scripts/setup_openrlhf.sh            build .venv-openrlhf (idempotent: a stamp newer than the locks and this
#                                             script means it is up to date; else it is rebuilt from scratch)
#        scripts/setup_openrlhf.sh --lock     resolve requirements-openrlhf.in in a scratch venv and rewrite both locks
# Measured on the 2-core development machine (2026-12-07): 59 s from scratch with cold pip and uv caches (35 s wheels,
# 24 s deepspeed + the import check), 1.5 GB; docs/environments.md "The OpenRLHF environment".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${RAGTEAM_OPENRLHF_VENV:-.venv-openrlhf}
PIP_VERSION=26.3
LOCK=requirements-openrlhf.lock
BUILT=requirements-openrlhf-built.lock
source scripts/install_pinned.sh     # uv, else pip: the same pins

build_deepspeed() {   # build_deepspeed VENV: the source build of requirements-openrlhf-built.lock
  DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "$1/bin/python" -m pip install -q --no-deps --no-build-isolation \
    --require-hashes -r "$BUILT"
}

if [[ "${1:-}" == "--lock" ]]; then
  source scripts/lock_common.sh      # $tools, $uv_bin (pinned uv)
  links=()
  [[ -d /opt/wheels ]] && links+=(--find-links /opt/wheels)
  # the CPU torch: a find-links wheel where there is one (this machine), else PyTorch's CPU index
  if ! compgen -G "/opt/wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
    torch_index=${RAGTEAM_TORCH_INDEX-$TORCH_CPU_INDEX_DEFAULT}
    [[ -n "$torch_index" ]] && links+=(--extra-index-url "$torch_index" --index-strategy unsafe-best-match)
  fi
  scratch="$tools/orl"
  "$PY" -m venv "$scratch"
  sed 's/#.*//; /^ *$/d; s/ *$//' requirements-openrlhf.in | grep -v '^openrlhf==\|^deepspeed==' > "$tools/resolve.in"
  "$uv_bin" pip install -q --python "$scratch/bin/python" "${links[@]}" -r "$tools/resolve.in"
  ds=$(grep -o '^deepspeed==[^ #]*' requirements-openrlhf.in); orl=$(grep -o '^openrlhf==[^ #]*' requirements-openrlhf.in)
  DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "$scratch/bin/python" -m pip install -q --no-deps --no-build-isolation \
    --no-binary deepspeed "$ds"
  "$scratch/bin/python" -m pip install -q --no-deps "$orl"
  # every requirement of deepspeed and of the resolved packages is there (openrlhf's own are left out on purpose)
  if "$scratch/bin/python" -m pip check | grep -v '^openrlhf ' | grep .; then
    echo "setup-openrlhf --lock: the resolved environment is inconsistent (above)" >&2; exit 1
  fi
  "$scratch/bin/python" -m pip freeze --all --exclude pip --exclude-editable | sort -f > "$tools/freeze.txt"
  grep -v "^deepspeed==" "$tools/freeze.txt" > "$tools/wheels.txt"
  grep "^deepspeed==" "$tools/freeze.txt" > "$tools/built.txt"
  "$uv_bin" pip compile --quiet --generate-hashes --no-deps --python-version 3.11 \
    --python-platform x86_64-manylinux_2_28 --no-header "${links[@]}" "$tools/wheels.txt" -o "$tools/wheels.hashed"
  "$uv_bin" pip compile --quiet --generate-hashes --no-deps --no-binary deepspeed --python-version 3.11 \
    --python-platform x86_64-manylinux_2_28 --no-header "$tools/built.txt" -o "$tools/built.hashed"
  "$PY" - "$tools" /opt/wheels <<'EOF'
import hashlib, re, sys
from pathlib import Path

tools, dirs = Path(sys.argv[1]), [d for d in sys.argv[2:] if Path(d).is_dir()]
HEAD = {"requirements-openrlhf.lock": (
    "# .venv-openrlhf's wheels, every file hashed: scripts/setup_openrlhf.sh --lock resolved requirements-openrlhf.in\n"
    "# (CPython 3.11, x86-64 manylinux_2_28) and wrote this file; scripts/setup_openrlhf.sh installs it with --no-deps\n"
    "# --require-hashes. openrlhf's own requirements are not resolved (it is installed --no-deps: see the .in file).\n"
    "# torch==2.13.0+cpu is PyTorch's CPU build (download.pytorch.org/whl/cpu; here a wheel in pip's find-links).\n"),
    "requirements-openrlhf-built.lock": (
    "# .venv-openrlhf's source build, hashed (scripts/setup_openrlhf.sh --lock): installed after\n"
    "# requirements-openrlhf.lock with DS_BUILD_OPS=0 DS_ACCELERATOR=cpu pip install --no-deps --no-build-isolation\n"
    "# --require-hashes -r requirements-openrlhf-built.lock (deepspeed's setup.py imports the installed torch).\n")}
for src, dst in (("wheels.hashed", "requirements-openrlhf.lock"), ("built.hashed", "requirements-openrlhf-built.lock")):
    out = []
    for line in (tools / src).read_text().splitlines():
        if "# via" in line or (line.lstrip().startswith("#")):
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==(\S+)$", line)
        if m:  # uv gives no hash for a wheel found only in a find-links directory: hash that file
            name, version = m.group(1).replace("-", "_"), m.group(2)
            wheels = sorted({w for d in dirs for w in Path(d).glob(f"{name}-{version}-*.whl")})
            if not wheels:
                sys.exit(f"setup-openrlhf --lock: no hash for {line} and no wheel of it in {dirs}")
            out.append(line + " \\")
            out += [f"    --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}"
                    + (" \\" if j < len(wheels) - 1 else "") for j, w in enumerate(wheels)]
        else:
            out.append(line)
    Path(dst).write_text(HEAD[dst] + "\n".join(out) + "\n")
    print(f"setup-openrlhf --lock: {dst}: {sum(1 for l in out if re.match(r'^[A-Za-z0-9].*==', l))} pinned packages")
EOF
  exit 0
fi

stamp="$VENV/.ragteam-openrlhf"
fresh=1
for f in "$LOCK" "$BUILT" scripts/setup_openrlhf.sh; do
  [[ -f "$stamp" && "$stamp" -nt "$f" ]] || fresh=0
done
if (( fresh )); then
  echo "setup-openrlhf: $VENV is up to date"; exit 0
fi

echo "setup-openrlhf: building $VENV ($(grep -c '^[A-Za-z0-9].*==' "$LOCK") wheels + deepspeed from source)"
start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q "pip==$PIP_VERSION"
install_pinned "$VENV" --require-hashes -r "$LOCK"
wheels_done=$(date +%s)
build_deepspeed "$VENV"
# the SFT path must import here, with the CPU shims where there is no CUDA: fail the setup, not the first run
"$VENV/bin/python" scripts/openrlhf_cpu.py --check
touch "$stamp"
end=$(date +%s)
echo "setup-openrlhf: done in $(( end - start )) s (wheels $(( wheels_done - start )) s, deepspeed" \
  "$(( end - wheels_done )) s with the import check); $VENV is $(du -sh "$VENV" | cut -f1)"
