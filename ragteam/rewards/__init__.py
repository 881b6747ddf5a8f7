"""Reward functions, named after the paper equations they implement (pure: strings in, floats out; the QAgent
stage-2 scorer also calls its frozen generator, as Eq. 9 requires)."""
from ragteam.rewards.maps import (
    ANSWER_REWARDS,
    delta_f1,
    length_penalty,
    maps_answer_reward_stage1,
    maps_answer_reward_stage2,
)
from ragteam.rewards.qagent import (
    hit,
    qagent_reward_stage1,
    qagent_reward_stage2,
    qagent_rewards_stage1,
    qagent_rewards_stage2,
)

__all__ = ["ANSWER_REWARDS", "delta_f1", "hit", "length_penalty", "maps_answer_reward_stage1",
           "maps_answer_reward_stage2", "qagent_reward_stage1", "qagent_reward_stage2", "qagent_rewards_stage1",
           "qagent_rewards_stage2"]
