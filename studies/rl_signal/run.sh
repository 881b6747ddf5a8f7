#!/bin/bash
# A joint system's RL with more answer signal (issue 25 §3, the fix studies/rollout_signal points to): rollouts
# at T 0.7 instead of 1.0, 8 questions a step instead of 2, 8 steps, from the warm-up model, one run per RL seed
# (joint.ppo.seed), through the stages' own code; then one `evaluate` of <system>_warmup and every seed's policy on
# the first 40 synthetic dev questions, each seed paired with the warm-up (metrics/eval_compare.json).
#
#   studies/rl_signal/run.sh <system> <workspace> <tag> <seed> [<seed> ...] [-- key=value ...]
#
# <workspace>: a scratch checkout after `dvc repro warmup_joint@<system> index_bm25@bm25s prepare_data`; its
# params.yaml is edited and restored. Seeds train side by side, each in a copy of the workspace with 1 torch thread
# (2 threads are 1.38x one for generation and 1.59x for forward+backward, params.yaml llm.threads: side by side
# wins), then evaluate runs alone. key=value pairs after `--` override joint.<system>.ppo (a step-size trial:
# -- actor_lr=1e-3 kl_coef=0.01). RESUME=1 keeps a seed's earlier copy and resumes its training from its last
# checkpoint (the trainer's own resume; a finished seed only saves its model again). Results:
# studies/rl_signal/<system>/<tag>/ (params, step lines and curves per seed; the evaluate records and log).
# As run on 2026-11-27: studies/rl_signal/run.sh mask /tmp/w1 fix 0 1 2, stopped after step 1 (22 min a step
# for three seeds on 2 cores); seed 0 was then resumed by hand in its copy with llm.threads 2 (`python -m
# stages.train_joint mask`, what RESUME=1 with seed 0 alone now does) and trained to step 8; evaluate not run.
# (JADE's fix/ results came from this script's first version at 97c3e83, one evaluate per seed.)
# The step-size trials, with the frozen layers run once (3e5601a): `run.sh mask /tmp/w1 lr2e-3 0 -- actor_lr=2e-3`
# (42 min of training, 22.5 min of evaluate) and `run.sh jade /tmp/w2 lr2e-3 0 1 2 -- actor_lr=2e-3`, as written.
# With a KL term toward the warm-up: `run.sh mask /tmp/w1 lr2e-3-kl0.1 0 -- actor_lr=2e-3 kl_coef=0.1` and
# `run.sh jade /tmp/w1 lr2e-3-kl0.1 0 1 2 -- actor_lr=2e-3 kl_coef=0.1` (29-30 min of training, 9 min of evaluate).
# From M-ASK's 96-step warm-up (warmup_longer.sh mask /tmp/w1 warmup96 96 16): `run.sh mask /tmp/w1-warmup96
# warmup96-lr2e-3-kl0.1-s4 0 1 2 -- actor_lr=2e-3 kl_coef=0.1 steps=4` (25-31 min beside the relock, 13 min of
# evaluate); seeds over runs: summarize.py. The same for 8 steps (2026-11-29): `run.sh mask /tmp/w1-warmup96
# warmup96-lr2e-3-kl0.1 0 1 2 -- actor_lr=2e-3 kl_coef=0.1` (35-41 min; its evaluate was run by hand, docs/joint.md).
# warmup_longer.sh now names its copy <workspace>-<system>-<tag> (here /tmp/w1-mask-warmup96).
# Seeds 3 and 4: `run.sh mask /tmp/m96 warmup96-lr2e-3-kl0.1-seeds34 3 4 -- actor_lr=2e-3 kl_coef=0.1` (/tmp/m96: a
# copy holding the same warm-up); JADE from its own 96-step warm-up: `run.sh jade /tmp/w1-warmup96 warmup96-lr2e-3-kl0.1
# 0 1 2 -- actor_lr=2e-3 kl_coef=0.1`.
set -euo pipefail
system=$1 ws=$2 tag=$3; shift 3
seeds=() extra=()
while (($#)); do
  if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
  seeds+=("$1"); shift
done
here=$(cd "$(dirname "$0")" && pwd)
out=$here/$system/$tag
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
threads=$(( ${#seeds[@]} > 1 ? 1 : 2 ))
pids=()
for seed in "${seeds[@]}"; do
  copy=$ws-$system-seed$seed
  if [[ ${RESUME:-0} == 1 && -d $copy/checkpoints/train_joint_$system ]]; then
    echo "$(date +%T) $system seed $seed resumes in $copy"
  else
    rm -rf "$copy"
    mkdir -p "$copy" && tar -C "$ws" --exclude=./.dvc/cache --exclude=./.dvc/tmp --exclude=./checkpoints -cf - . |
    tar -C "$copy" -xf -
  fi
  (cd "$copy" && python_bin=$copy/.venv/bin/python &&
   "$python_bin" "$here/params_edit.py" train "$system" "$seed" "$threads" "${extra[@]}" &&
   mkdir -p "$out/seed$seed" && cp params.yaml "$out/seed$seed/" &&
   { [[ ${RESUME:-0} == 1 ]] || rm -f "$out/seed$seed/steps.log"; } &&
   echo "$(date +%T) $system seed $seed train" &&
   "$python_bin" -m stages.train_joint "$system" >> "$out/seed$seed/steps.log" 2>&1 &&
   cp "metrics/train_joint_$system.json" "$out/seed$seed/" &&
   rm -rf "$out/seed$seed/curves" && cp -r "reports/training/train_joint_$system" "$out/seed$seed/curves" &&
   echo "$(date +%T) $system seed $seed trained") &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
cd "$ws"
cp params.yaml params.yaml.orig
trap 'mv params.yaml.orig params.yaml' EXIT
mkdir -p models/rl_signal
for seed in "${seeds[@]}"; do
  rm -rf "models/rl_signal/${system}_seed$seed"
  cp -r "$ws-$system-seed$seed/models/agents/$system" "models/rl_signal/${system}_seed$seed"
done
.venv/bin/python "$here/params_edit.py" evaluate "$system" "${seeds[@]}"
echo "$(date +%T) $system evaluate"
.venv/bin/python -m stages.evaluate > "$out/evaluate.log" 2>&1
cp -r metrics/eval.json metrics/eval_compare.json params.yaml "$out/"
mkdir -p "$out/records" && cp -r results/eval/. "$out/records/"
echo "$(date +%T) $system done"
