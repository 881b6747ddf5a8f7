#!/usr/bin/env bash
# Add sha256 hashes to requirements-worker.txt (the CPU worker environment, .venv-worker) without moving a version:
# its pins stay the freeze its header describes, and scripts/setup_worker.sh installs them with --require-hashes,
# as scripts/setup.sh does requirements.lock. Rerun after changing a pin.
#
# uv (pinned in scripts/lock_common.sh) looks up every pinned file's hash with --no-deps, so nothing is re-resolved.
# It gives no hash for a wheel it finds only in a find-links directory (torch 2.13.0+cpu here): those are hashed
# from the wheel file itself, which must be there; requirements.lock carries the same torch wheel's hash.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lock_common.sh   # $tools, $uv_bin (uv pinned there)
links=()
[[ -d /opt/wheels ]] && links+=(--find-links /opt/wheels)   # where this machine keeps the CPU torch wheel
grep -v '^#' requirements-worker.txt | sed 's/ *\\$//; /^ *--hash/d; /^ *$/d' > "$tools/pins.txt"
"$uv_bin" pip compile --quiet --generate-hashes --no-deps --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --no-header "${links[@]}" "$tools/pins.txt" -o "$tools/hashed.txt"
python3 - "$tools/hashed.txt" "${links[@]}" <<'EOF'
import hashlib, re, sys
from pathlib import Path

hashed, dirs = Path(sys.argv[1]), [a for a in sys.argv[2:] if a != "--find-links"]
header = [l for l in Path("requirements-worker.txt").read_text().splitlines() if l.startswith("#")]
out, lines = [], hashed.read_text().splitlines()
for line in lines:
    if "# via" in line or (line.startswith("    #") and not line.strip().startswith("--hash")):
        continue
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==(\S+)$", line)
    if m:   # a pin without hashes: hash the find-links wheel of that exact version
        name, version = m.group(1).replace("-", "_"), m.group(2)
        wheels = sorted({w for d in dirs for w in Path(d).glob(f"{name}-{version}-*.whl")})
        if not wheels:
            sys.exit(f"lock_worker: no hash for {line} and no wheel of it in {dirs or 'a find-links directory'}")
        out.append(line + " \\")
        out += [f"    --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}" + (" \\" if j < len(wheels) - 1 else "")
                for j, w in enumerate(wheels)]
    else:
        out.append(line)
Path("requirements-worker.txt").write_text("\n".join(header + out) + "\n")
pins = sum(1 for l in out if re.match(r"^[A-Za-z0-9].*==", l))
print(f"lock_worker: requirements-worker.txt has {pins} pinned packages, every one hashed")
EOF
