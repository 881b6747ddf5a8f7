"""The joint trainer in parts: `params`, `system`, `batch` (rollouts -> samples), `actor_critic`, `update`
(the loss from `ragteam.train.pg`) and `loop` (`train_joint_ppo`, the step log)."""
