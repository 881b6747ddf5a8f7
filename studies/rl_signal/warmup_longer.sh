#!/bin/bash
# A joint system's warm-up trained past its format threshold (issue 25 §3): does more behaviour cloning give RL's
# rollouts the answers they lack? The default warm-up stops once the held-out format error rate is below 20 %
# (M-ASK at step 24 of 32: 96 of its 320 rows seen once), so its roles write the tags but not yet their content
# (M-ASK's Summary copies the query where the oracle writes the fact sentence). This trains the same warm-up, in a
# copy of the workspace, to <steps> optimiser steps with the probes measured every <probe_every> steps and stopping
# nothing, scores it greedily on the first 40 synthetic dev questions (the default run's joint rows), and pairs it
# question by question with the workspace's own `<system>_warmup` records when its `evaluate` has run.
#
#   studies/rl_signal/warmup_longer.sh <system> <workspace> <tag> <steps> <probe_every>
#
# <workspace>: a scratch checkout after `dvc repro warmup_joint@<system> index_bm25@bm25s prepare_data` (and
# `evaluate` for the pairing). The copy is <workspace>-<system>-<tag> (with the system in its name, so that two
# systems' warm-ups of one tag from one workspace cannot overwrite each other's copy; it is replaced if it exists);
# `run.sh <system> <workspace>-<system>-<tag> ...` then trains RL from the longer warm-up. Results:
# studies/rl_signal/<system>/<tag>/ (params, warm-up log, metrics, curves, evaluate records, pairing.json).
set -euo pipefail
system=$1 ws=$2 tag=$3 steps=$4 every=$5
here=$(cd "$(dirname "$0")" && pwd)
out=$here/$system/$tag copy=$ws-$system-$tag
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
rm -rf "$copy" && mkdir -p "$copy"
tar -C "$ws" --exclude=./.dvc/cache --exclude=./.dvc/tmp --exclude=./checkpoints --exclude=./models/qagent_rl \
  --exclude=./models/rl_signal -cf - . | tar -C "$copy" -xf -
cd "$copy"
py=$copy/.venv/bin/python
"$py" "$here/params_edit.py" warmup "$system" "$steps" "$every"
cp params.yaml "$out/params.yaml"
echo "$(date +%T) $system warm-up to step $steps"
"$py" -m stages.warmup_joint "$system" > "$out/warmup.log" 2>&1
cp "metrics/warmup_joint_$system.json" "$out/"
rm -rf "$out/curves" && cp -r "reports/training/warmup_joint_$system" "$out/curves"
cp params.yaml params.yaml.warmup
"$py" "$here/params_edit.py" evaluate "$system"
echo "$(date +%T) $system evaluate"
"$py" -m stages.evaluate > "$out/evaluate.log" 2>&1
mv params.yaml.warmup params.yaml
rm -rf "$out/records" && mkdir -p "$out/records" && cp -r "results/eval/${system}_warmup" "$out/records/"
base=$ws/results/eval/${system}_warmup/synthetic.jsonl
if [[ -f $base ]]; then
  "$py" "$here/summarize.py" pair "$base" "$out/records/${system}_warmup/synthetic.jsonl" --out "$out/pairing.json"
fi
echo "$(date +%T) $system done"
