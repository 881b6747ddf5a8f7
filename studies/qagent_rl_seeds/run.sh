#!/bin/bash
# QAgent's RL over RL seeds from ONE warm-up, as DVC experiments (issue 25 §3): profiles/qagent_t07.yaml (the default
# warm-up and the default two-stage GRPO, 2 + 2 steps of 2 questions x G 4, with its rollouts at T 0.7 instead of 1)
# with only RL's seed (joint.ppo.seed) varied (studies/rl_seeds.sh), so the runs share one warm-up and differ only
# in RL. T 0.7 is the fix the default's curves point to: at T 1 stage 1 never updated (every rollout's reward 0,
# zero-advantage share 1.00, policy grad norm 0; lock d8062d4).
#
#   bash studies/qagent_rl_seeds/run.sh 0 1 2 2>&1 | tee /tmp/qagent_rl_seeds.log
exec bash "$(dirname "$0")/../rl_seeds.sh" qagent qagent_t07 qagent-rlseed "$@"
