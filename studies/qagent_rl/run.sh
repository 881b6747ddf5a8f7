#!/bin/bash
# QAgent's RL against its warm-up over RL seeds (issue 25 §3): the default run's train_joint@qagent (2 + 2 steps of
# 2 questions x G 4, T 1) from the warm-up model, one copy of the workspace per seed, seeds side by side with one
# torch thread each; then one `evaluate` of qagent_warmup and every seed's policy on the first 40 synthetic dev
# questions, each paired with the warm-up (metrics/eval_compare.json).
#
#   studies/qagent_rl/run.sh <workspace> <tag> <seed> [<seed> ...] [-- key=value ...]
#
# <workspace>: a scratch checkout after `dvc repro warmup_joint@qagent` (prepare_data, index_bm25@bm25s come with
# it); its params.yaml is edited and restored. key=value pairs set joint.qagent keys (params_edit.py). Results:
# studies/qagent_rl/<tag>/ (params, step log and curves per seed; the evaluate records, log and comparisons).
# As run on 2026-11-29 (docs/joint.md): `run.sh /tmp/w1 default 0 1 2`, `run.sh /tmp/w1 ds3 0 1 2 --
# dynamic_sampling.enabled=true dynamic_sampling.max_rounds=3`, and from the 64-step warm-up of
# studies/rl_signal/warmup_longer.sh: `run.sh /tmp/w1-qagent-warmup64 warmup64 0 1 2`; then summarize.py.
set -euo pipefail
ws=$1 tag=$2; shift 2
seeds=() extra=()
while (($#)); do
  if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
  seeds+=("$1"); shift
done
here=$(cd "$(dirname "$0")" && pwd)
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
out=$here/$tag
mkdir -p "$out"
threads=$(( ${#seeds[@]} > 1 ? 1 : 2 ))
pids=()
for seed in "${seeds[@]}"; do
  copy=$ws-qagent-$tag-seed$seed
  rm -rf "$copy"; mkdir -p "$copy"
  tar -C "$ws" --exclude=./.dvc/cache --exclude=./.dvc/tmp --exclude=./checkpoints --exclude=./models/qagent_rl \
    -cf - . | tar -C "$copy" -xf -
  (cd "$copy" && "$copy/.venv/bin/python" "$here/params_edit.py" train "$seed" "$threads" "${extra[@]}" &&
   mkdir -p "$out/seed$seed" && cp params.yaml "$out/seed$seed/" &&
   echo "$(date +%T) qagent $tag seed $seed train" &&
   "$copy/.venv/bin/python" -m stages.train_joint qagent > "$out/seed$seed/steps.log" 2>&1 &&
   cp metrics/train_joint_qagent.json "$out/seed$seed/" &&
   rm -rf "$out/seed$seed/curves" && cp -r reports/training/train_joint_qagent "$out/seed$seed/curves" &&
   mkdir -p "$ws/models/qagent_rl" && rm -rf "$ws/models/qagent_rl/${tag}_seed$seed" &&
   cp -r models/agents/qagent "$ws/models/qagent_rl/${tag}_seed$seed" &&
   echo "$(date +%T) qagent $tag seed $seed trained") &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
cd "$ws"
cp params.yaml params.yaml.orig
trap 'mv params.yaml.orig params.yaml' EXIT
rows=()
for seed in "${seeds[@]}"; do rows+=("qagent_${tag//-/_}_seed$seed=models/qagent_rl/${tag}_seed$seed"); done
.venv/bin/python "$here/params_edit.py" evaluate "${rows[@]}"
echo "$(date +%T) qagent evaluate: ${rows[*]}"
.venv/bin/python -m stages.evaluate > "$out/evaluate.log" 2>&1
cp metrics/eval.json metrics/eval_compare.json params.yaml "$out/"
mkdir -p "$out/records" && cp -r results/eval/. "$out/records/"
echo "$(date +%T) qagent done"
