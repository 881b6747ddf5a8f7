# Sourced by scripts/setup.sh and scripts/setup_worker.sh: install a file of exact pins into a venv with uv, falling
# back to pip. The pins decide the environment; the installer only decides how long it takes. Both environments
# from scratch on this 2-core machine (measured 2026-11-26, both at once as `make` builds them, cold uv cache):
# uv 78 s against pip's 142 s with a warm pip cache. uv checks the same sha256 hashes (--require-hashes). It
# compiles the .pyc files at install as pip does (--compile-bytecode): where PYTHONDONTWRITEBYTECODE is set (this
# machine sets it) nothing else writes them, and every stage's process compiled its imports again (vLLM's engine
# took 85 s to start instead of 38 s; without it uv's install took 26 s).
#
# install_pinned VENV [pip/uv options...] -r FILE
#
# Where the CPU torch comes from is decided here, not left to the machine's pip configuration: PyPI has only the CUDA
# build of torch 2.13.0, so a file pinning `torch==X+cpu` needs PyTorch's CPU index (RAGTEAM_TORCH_INDEX, default
# https://download.pytorch.org/whl/cpu), which is added unless a find-links directory of pip's configuration already
# holds that exact wheel (this machine keeps it in /opt/wheels; no other host is reachable here), or unless
# RAGTEAM_TORCH_INDEX is set empty (pip's own configuration then has to provide it). Either way the file's sha256
# decides which bytes are accepted, and the line `setup: torch X+cpu from ...` says which source it was. With an
# extra index uv is told to take each pin from whichever index has it (--index-strategy unsafe-best-match: its
# default stops at the first index that has the name at all, and PyTorch's index carries old numpy, jinja2, ...
# releases); the hashes still fix every file.
UV_PIN="uv==0.13.9 --hash=sha256:d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19"
TORCH_CPU_INDEX_DEFAULT=https://download.pytorch.org/whl/cpu

# torch_cpu_source FILE DIR...: "X+cpu <source>": the find-links directory holding FILE's torch==X+cpu wheel, else
# the CPU index; "X+cpu" alone where RAGTEAM_TORCH_INDEX is empty; nothing when FILE pins no CPU torch.
torch_cpu_source() {
  local file=$1; shift
  local version dir
  version=$(sed -n 's/^torch==\([^ \\]*+cpu\).*/\1/p' "$file" | head -1)
  [[ -n "$version" ]] || return 0
  for dir in "$@"; do
    if compgen -G "$dir/torch-$version-*.whl" >/dev/null; then echo "$version $dir"; return 0; fi
  done
  local index=${RAGTEAM_TORCH_INDEX-$TORCH_CPU_INDEX_DEFAULT}
  if [[ -n "$index" ]]; then echo "$version $index"; else echo "$version"; fi
}

install_pinned() {
  local venv=$1; shift
  local py="$venv/bin/python" links=() dirs=() extra=() tool file="" arg prev="" source
  # where pip is told wheels lie (this machine keeps the CPU torch wheel in a find-links directory), for uv too;
  # an extra index stays pip's business (PIP_EXTRA_INDEX_URL is passed on, pip.conf's is not: pip falls back)
  while read -r link; do [[ -n "$link" ]] && dirs+=("$link") && links+=(--find-links "$link"); done < <(
    "$py" -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" | tr ' ' '\n' | sort -u)
  [[ -n "${PIP_EXTRA_INDEX_URL:-}" ]] && for u in $PIP_EXTRA_INDEX_URL; do links+=(--extra-index-url "$u"); done
  for arg in "$@"; do [[ "$prev" == -r ]] && file=$arg; prev=$arg; done
  if [[ -n "$file" && -f "$file" ]] && source=$(torch_cpu_source "$file" "${dirs[@]}") && [[ -n "$source" ]]; then
    local from=${source#* }
    if [[ "$source" != *" "* ]]; then
      echo "setup: torch $source from pip's configuration (RAGTEAM_TORCH_INDEX is empty)"
    else
      echo "setup: torch ${source%% *} from $from"
      [[ -d "$from" ]] || extra=(--extra-index-url "$from")
    fi
  fi
  local strategy=()
  [[ " ${links[*]} ${extra[*]} " == *" --extra-index-url "* ]] && strategy=(--index-strategy unsafe-best-match)
  tool=$(mktemp); echo "$UV_PIN" > "$tool"
  if [[ "${RAGTEAM_INSTALLER:-uv}" == uv ]] && "$py" -m pip install -q --no-deps --require-hashes -r "$tool" \
      && "$venv/bin/uv" pip install -q --compile-bytecode --python "$py" --no-deps "${links[@]}" "${extra[@]}" \
         "${strategy[@]}" "$@"; then
    rm -f "$tool"; return 0
  fi
  rm -f "$tool"
  [[ "${RAGTEAM_INSTALLER:-uv}" == uv ]] && echo "setup: uv could not install $*; pip installs the same pins (slower)" >&2
  "$py" -m pip install -q --no-deps "${extra[@]}" "$@"
}
