#!/bin/bash
# JADE's RL recipe over RL seeds from ONE warm-up, as DVC experiments (issue 25 §3): profiles/jade_rl_recipe.yaml
# (the default warm-up; RL at T 0.7, 8 questions a step, 8 steps) with only RL's seed (joint.ppo.seed) varied
# (studies/rl_seeds.sh), so the runs share one warm-up and differ only in RL. studies/jade_rl_recipe varied
# the warm-up's seed as well (RL over warm-up F1 +1.97 [-4.44, 8.38]).
#
#   bash studies/jade_rl_seeds/run.sh 0 1 2 2>&1 | tee /tmp/jade_rl_seeds.log
exec bash "$(dirname "$0")/../rl_seeds.sh" jade jade_rl_recipe jade-rlseed "$@"
