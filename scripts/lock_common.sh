# Sourced by scripts/lock*.sh: one pinned uv, in a throwaway venv removed on exit, for every lock file.
# After sourcing: $tools (the scratch directory) and $uv_bin (the uv executable).
UV_VERSION=0.13.9
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools/venv"
"$tools/venv/bin/python" -m pip install -q "uv==$UV_VERSION"
uv_bin="$tools/venv/bin/uv"
