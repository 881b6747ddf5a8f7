#!/bin/bash
# JADE's RL with more answer signal (issue 25 §3, the fix experiments/rollout_signal points to): rollouts at T 0.7
# instead of 1.0, 8 questions a step instead of 2, 8 steps, from the warm-up model, per RL seed (joint.ppo.seed);
# then jade_trained vs jade_warmup on the first 40 synthetic dev questions through the evaluate stage's own code.
# Run in a scratch checkout after `dvc repro warmup_joint@jade index_bm25@bm25s prepare_data` (it edits params.yaml
# there and restores it). As run on 2026-11-27: experiments/jade_rl_signal/run.sh /tmp/w1 0 1 2
set -euo pipefail
ws=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
cd "$ws"
export PATH=$ws/.venv/bin:$PATH HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
cp params.yaml params.yaml.orig
trap 'mv params.yaml.orig params.yaml' EXIT
for seed in "$@"; do
  out=$here/fix_seed$seed; mkdir -p "$out"
  cp params.yaml.orig params.yaml && python "$here/params_edit.py" "$seed"
  rm -rf checkpoints/train_joint_jade
  echo "$(date +%T) seed $seed train"; python -m stages.train_joint jade > "$out/train.log" 2>&1
  echo "$(date +%T) seed $seed evaluate"; python -m stages.evaluate > "$out/eval.log" 2>&1
  cp -r metrics/train_joint_jade.json metrics/eval.json metrics/eval_compare.json reports/training/train_joint_jade \
    params.yaml "$out/"
  echo "$(date +%T) seed $seed done"
done
