#!/bin/bash
# Device harness (issue 25 §3): M-ASK RL from one warm-up over 3 RL seeds, then the warm-up and each seed scored on
# the first NQ (100) synthetic dev questions, each row in its own process -- the stage modules that
# studies/rl_signal/run.sh runs, on one GPU, seeds side by side. Results: $OUT/res.tgz (rewritten after each
# phase) and $OUT/log.txt; `python studies/rl_signal/gpu/summarize.py <unpacked>/res` compares the rows.
#
# Two device calls (see prepare.sh for why), the second within 30 s of the first:
#   studies/rl_signal/gpu/prepare.sh <workspace>; mv studies reports /tmp/
#   run(command="bash .gpu1/check.sh", carry=[".gpu1"], timeout_s=150)
#   run(command="cd .gpu2 && DEADLINE=<budget left - 60, at most 578> bash run.sh", carry=[".gpu2"], timeout_s=595)
#   mv /tmp/studies /tmp/reports .
# DEADLINE_TRAIN (default DEADLINE - 128) stops training seeds that would leave evaluate no time.
# DRY=1 PY=.venv/bin/python OUT=/tmp/out SEEDS=0 NQ=2 rehearses it on a CPU from a copy of the tree that holds .gpu2
# (and .gpu2/dry_llm, a models/llm directory, in place of the GGUF); it ran so on 2026-11-28 (2 cores, 6-8 min).
# Not yet run on a GPU: the one session that prepared it was refused a machine.
# RECIPES (default A; "A B" trains both side by side) picks among
#   A: the rl_signal recipe (T 0.7, 8 questions a step, 8 steps) at the default actor_lr 5e-4
#   B: the same with actor_lr 2e-3 and kl_coef 0.1 (the CPU trial that kept Planning's sub-questions)
set -uo pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
G=$(cd "$(dirname "$0")" && pwd); R=$(dirname "$G")
NQ=${NQ:-100}; DEADLINE=${DEADLINE:-570}; DEADLINE_TRAIN=${DEADLINE_TRAIN:-$((DEADLINE - 128))}
RES=/tmp/res; rm -rf $RES; mkdir -p $RES "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
pack() { tar -C /tmp -czf "$OUT/res.tgz" res 2>/dev/null; }
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
W=/tmp/ws; rm -rf $W /tmp/ws-* /tmp/ev-*; mkdir -p $W
tar -C "$R" --exclude=./.gpu1 --exclude=./.gpu2 --exclude=./.venv --exclude=./.venv-worker -cf - . | tar -C $W -xf -
cp -r "$G/data/." $W/data/
if [[ ${DRY:-0} == 1 ]]; then
  export PYTHONPATH=$G/stub:$W; PY=${PY:-python3}
  cp -r "$G/dry_llm" $W/models/llm
else
  nvidia-smi -L
  export PYTHONPATH=/root/site:$G/stub:$W; PY=python3
  [[ -d /root/site/transformers ]] || { echo "no /root/site: the first call's wheels are gone"; exit 3; }
  mkdir -p /tmp/gg && cat /root/keep/smol.xz.a "$G/smol.xz.b" | xz -dc -T8 > /tmp/gg/SmolLM2-135M-Instruct.Q4_1.gguf
  (cd /tmp/gg && sha256sum -c "$G/gguf.sha256") || exit 4
  (cd $W && $PY -c "from ragteam.models import prepare_model as p; print(p('/tmp/gg/SmolLM2-135M-Instruct.Q4_1.gguf', 'models/llm'))") || exit 5
fi
cd $W && $PY "$G/params_edit.py" device $NQ 128 || exit 6
[[ ${DRY:-0} == 1 ]] && $PY "$G/params_edit.py" dry mask
echo "$(el) warm-up"
$PY -m stages.warmup_joint mask > $RES/warmup.log 2>&1 || { echo "warm-up failed"; tail -30 $RES/warmup.log; pack; exit 7; }
cp metrics/warmup_joint_mask.json $RES/ 2>/dev/null; pack
echo "$(el) warm-up done"
train() {  # recipe seed key=value...
  local rec=$1 seed=$2; shift 2
  local C=/tmp/ws-$rec-$seed; cp -a $W $C; cd $C
  $PY "$G/params_edit.py" train mask "$seed" 2 "$@" && { [[ ${DRY:-0} == 1 ]] && $PY "$G/params_edit.py" dry mask || true; } &&
  mkdir -p $RES/$rec-seed$seed && cp params.yaml $RES/$rec-seed$seed/ &&
  timeout $(( DEADLINE_TRAIN - ($(date +%s) - T0) )) $PY -m stages.train_joint mask > $RES/$rec-seed$seed/steps.log 2>&1 &&
  cp metrics/train_joint_mask.json $RES/$rec-seed$seed/ &&
  { cp -r reports/training/train_joint_mask $RES/$rec-seed$seed/curves 2>/dev/null; true; } &&
  cp checkpoints/train_joint_mask/checkpoint-*/trainer_state.json $RES/$rec-seed$seed/ 2>/dev/null
  local rc=$?; echo "$(el) $rec seed $seed rc $rc"; return $rc
}
evalrow() {  # recipe row: score one eval row in its own copy
  local rec=$1 row=$2 E=/tmp/ev-$1-$2; cp -a /tmp/ev-$rec $E; cd $E
  $PY "$G/params_edit.py" only $row && cp params.yaml $RES/eval-$rec/$row.params.yaml &&
  timeout $(( DEADLINE - ($(date +%s) - T0) )) $PY -m stages.evaluate > $RES/eval-$rec/$row.log 2>&1
  echo "$(el) $rec $row evaluate rc $?"
  mkdir -p $RES/eval-$rec/$row && cp metrics/eval.json $RES/eval-$rec/$row/ 2>/dev/null
  cp -r results/eval/$row/. $RES/eval-$rec/$row/ 2>/dev/null; true
}
recipe() {  # name key=value...: train 3 seeds side by side, then score the warm-up and every seed that finished
  local rec=$1; shift; local pids=() ok=()
  local seeds=(${SEEDS:-0 1 2})
  for s in "${seeds[@]}"; do train $rec $s "$@" & pids+=($!); done
  for i in "${!seeds[@]}"; do wait ${pids[$i]} && ok+=(${seeds[$i]}); done
  pack
  ((${#ok[@]})) || return 1
  local E=/tmp/ev-$rec; cp -a $W $E; cd $E; mkdir -p models/rl_signal $RES/eval-$rec
  for s in "${ok[@]}"; do cp -r /tmp/ws-$rec-$s/models/agents/mask models/rl_signal/mask_seed$s; done
  $PY "$G/params_edit.py" evaluate mask "${ok[@]}" && $PY "$G/params_edit.py" device $NQ 128 || return 1
  echo "$(el) $rec evaluate (seeds ${ok[*]})"
  local rows=(mask_warmup) epids=(); for s in "${ok[@]}"; do rows+=(mask_rl_seed$s); done
  for row in "${rows[@]}"; do evalrow $rec $row & epids+=($!); done
  wait "${epids[@]}"; pack
}
pids=()
for rec in ${RECIPES:-A}; do
  case $rec in
    A) recipe A & pids+=($!) ;;
    B) recipe B actor_lr=2e-3 kl_coef=0.1 & pids+=($!) ;;
  esac
done
wait "${pids[@]}"
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv 2>/dev/null
pack; echo "$(el) done"
