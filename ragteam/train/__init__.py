"""Training backends for the agents: objects in, objects out (no params.yaml, no fixed paths).

- `grpo.train_grpo`: GRPO on TRL's GRPOTrainer, or (`trainer: shared_prefix`) `grpo_prefix`, the same objective
  with the prompt encoded once per group (the CPU default);
- `sft.train_sft`: SFT with the loss on the assistant turn only;
- `maps`: the MAPS recipes (two-stage answer agent, ΔF1 query reward);
- `ppo.train_joint_ppo`: joint multi-agent PPO of one shared policy over every role of a system (M-ASK; `systems`
  registers them), on one policy-gradient core (`pg`) and pluggable advantage estimators (`advantages`);
- `openrlhf`: datasets, reward-function file and Ray / DeepSpeed commands for a GPU cluster;
- `checkpoints`, `curves`, `model_card`: resume, the saved agent, DVC plots and the model card.
Heavy imports (torch, transformers, trl, peft) happen inside the functions that need them.
"""
