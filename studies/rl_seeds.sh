#!/bin/bash
# One joint system's RL recipe over RL seeds from ONE warm-up, as DVC experiments (issue 25 §3): the profile's params
# with the warm-up's SFT seed left at params.yaml's 0 and only RL's seed (joint.ppo.seed) varied, so the runs share
# one warm-up (DVC trains it in the first run and finds it unchanged in the others) and differ only in RL. This
# isolates what RL adds to a warm-up; `ragteam replicate flags <s> --kind joint` varies both seeds instead.
#
#   bash studies/rl_seeds.sh SYSTEM PROFILE NAME_PREFIX SEED...
#   e.g. bash studies/rl_seeds.sh mask mask_rl_recipe mask-rlseed 0 1 2     (studies/mask_rl_seeds/run.sh)
#
# Run in a clone of main whose default remote has the lock's outputs, from its root. Each run is the experiment
# <NAME_PREFIX><seed>; `ragteam replicate keep` then puts their commits in the branch's history.
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: bash studies/rl_seeds.sh SYSTEM PROFILE NAME_PREFIX SEED... (e.g. mask mask_rl_recipe mask-rlseed 0 1 2)" >&2
  exit 2
fi
system=$1 profile=$2 prefix=$3
shift 3
for s in "$@"; do
  [[ $s =~ ^[0-9]+$ ]] || { echo "rl_seeds.sh: seed '$s' is not a non-negative integer" >&2; exit 2; }
done
export PATH="$PWD/.venv/bin:$PATH"
flags=$(ragteam profile flags "$profile")     # fails with one line on an unknown profile, before anything runs
stages="prepare_models prepare_data index_bm25@bm25s oracle_traces@$system warmup_joint@$system train_joint@$system evaluate"
dvc pull -q prepare_models prepare_data index_bm25@bm25s "oracle_traces@$system"
for s in "$@"; do
  git checkout -- params.yaml      # each run's flags apply to the default params
  echo "seed $s: start $(date -u +%FT%TZ)"
  eval dvc exp run -n "$prefix$s" "$flags" -S joint.ppo.seed="$s" -s $stages
  echo "seed $s: end $(date -u +%FT%TZ)"
done
git checkout -- params.yaml
