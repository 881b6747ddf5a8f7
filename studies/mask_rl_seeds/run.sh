#!/bin/bash
# M-ASK's RL recipe over RL seeds from ONE warm-up, as DVC experiments (issue 25 §3): profiles/mask_rl_recipe.yaml
# with only RL's seed (joint.ppo.seed) varied (studies/rl_seeds.sh), so the runs share one warm-up and differ
# only in RL. This is the question studies/mask_rl_recipe left open: there every seed varied the warm-up too, and
# RL over warm-up was +6.36 F1 [-14.85, 27.58] over seeds; the side study by script (5 RL seeds from one warm-up,
# studies/rl_signal/mask/warmup96-lr2e-3-kl0.1-5seeds) gave +9.14 [4.81, 13.48] outside DVC.
#
# Run in a clone of main whose default remote has the lock's outputs, from its root, every line time-stamped:
#   bash studies/mask_rl_seeds/run.sh 0 1 2 2>&1 | tee /tmp/mask_rl_seeds.log
exec bash "$(dirname "$0")/../rl_seeds.sh" mask mask_rl_recipe mask-rlseed "$@"
