#!/usr/bin/env bash
# `make smoke`: the whole DAG on profiles/smoke.yaml (every stage, every default `evaluate` row, a handful of
# questions and one or two steps per trainer) through the local Prefect flow, as `make repro` runs the default.
#
# It runs in a scratch copy of this checkout's working tree (tracked and untracked files git does not ignore, so
# uncommitted edits run too), $SMOKE_DIR/run (default .smoke/run; .smoke/.gitignore makes git ignore the folder): its
# own git repository and DVC cache, params.yaml with the profile applied, no dvc.lock and no outputs to start from, so
# every stage runs. This checkout's params.yaml, dvc.lock, outputs and DVC cache are never touched. Each run starts by
# removing the previous scratch copy; the last one stays for inspection (about 12 GB: models, checkpoints, cache)
# until the next run or `rm -rf .smoke`. Nothing is reused from run to run: DVC's run cache cannot restore these
# stages (each has an uncached output that is no metric or plot, its record metrics/<stage>.json), so a smoke run
# is always a whole run, which is what it is for.
# It prints where reports/eval.md landed, the wall and CPU time and each stage's seconds and time split.
#
# Offline as `make repro` (HF_HUB_OFFLINE=1; the models come from their pip wheels, the data is synthetic).
# SMOKE_DIR: the scratch folder. SMOKE_PROFILES: more profiles applied after smoke (space-separated).
set -euo pipefail

# the whole script is read before it runs (a function): an edit or `git pull` during a run cannot change it
main() {
  cd "$(dirname "$0")/.."
  root=$PWD
  [[ -x "$root/.venv/bin/ragteam" ]] && export PATH="$root/.venv/bin:$PATH"
  command -v ragteam >/dev/null || { echo "smoke: no ragteam on PATH; run scripts/setup.sh (make smoke does)" >&2; exit 2; }
  export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
  export DVC_NO_ANALYTICS=1
  dir=$(mkdir -p "${SMOKE_DIR:-$root/.smoke}" && cd "${SMOKE_DIR:-$root/.smoke}" && pwd)
  run=$dir/run
  [[ "$run" != "$root" && "$root" != "$run"/* ]] || { echo "smoke: SMOKE_DIR must not hold this checkout" >&2; exit 2; }
  [[ -f "$dir/.gitignore" ]] || echo '*' > "$dir/.gitignore"   # the folder ignores itself (as .pytest_cache does)
  start=$(date +%s)

  # the scratch copy: the working tree less the pipeline's outputs (metrics/, reports/, results/ hold outputs only)
  rm -rf "$run"
  mkdir -p "$run"
  git ls-files -z -co --exclude-standard \
    | while IFS= read -r -d '' f; do
        case $f in dvc.lock | metrics/* | reports/* | results/*) continue ;; esac
        [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"
      done \
    | tar --null -T - -cf - | tar -xf - -C "$run"
  cd "$run"
  {
    git init -q && git config user.email smoke@ragteam.local && git config user.name "ragteam smoke"
    git add -A && git commit -qm "smoke: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?') + working tree"
  } >/dev/null
  ragteam profile apply smoke
  for p in ${SMOKE_PROFILES:-}; do ragteam profile apply "$p"; done
  echo "smoke: scratch copy $run ($(( $(date +%s) - start )) s); running the DAG"

  status=0
  TIMEFORMAT='smoke: the flow took %0R s wall, %0U s user + %0S s system CPU (stages, DVC and Prefect together)'
  time ragteam flow run || status=$?
  wall=$(( $(date +%s) - start ))

  # each stage's seconds and where they went (ragteam/views/times.py), when the stages wrote their records
  ragteam times --root "$run" || true
  python - "$run" "$wall" "$status" <<'EOF'
import sys
from pathlib import Path

run, wall, status = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
eval_md = run / "reports/eval.md"
print(f"smoke: {'done' if status == 0 else 'FAILED'} in {wall // 60} min {wall % 60:02d} s (scratch copy and flow)")
if status == 0 and eval_md.is_file():
    print(f"smoke: the report is {eval_md}")
EOF
  return $status
}
main "$@"
exit
