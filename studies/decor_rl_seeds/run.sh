#!/bin/bash
# DECOR's RL recipe over RL seeds from ONE warm-up, as DVC experiments (issue 25 §3): profiles/decor_rl_recipe.yaml
# (the default warm-up and RL size; rollouts at T 0.7, actor lr 1e-3) with only RL's seed (joint.ppo.seed) varied
# (studies/rl_seeds.sh), so the runs share one warm-up and differ only in RL.
#
#   bash studies/decor_rl_seeds/run.sh 0 1 2 2>&1 | tee /tmp/decor_rl_seeds.log
exec bash "$(dirname "$0")/../rl_seeds.sh" decor decor_rl_recipe decor-rlseed "$@"
