"""Training backends for the agents: objects in, objects out (no params.yaml, no fixed paths).

- `grpo.train_grpo`: GRPO on TRL's GRPOTrainer, or (`trainer: shared_prefix`) `grpo_prefix`, the same objective
  with the prompt encoded once per group (the CPU default);
- `sft.train_sft`: SFT with the loss on the assistant turn only;
- `common`: what the trainers share (GRPO / LoRA params, the sample record, device setup);
- `synthesis`: MAPS Algorithm 1's data side (difficulty labels, debate snapshots T1, T2, judge candidates and
  unanimity labels T3): it runs the agents' prompts and debates, so it lives with the training code, not in data/;
- `maps`: the MAPS recipes (two-stage answer agent, ΔF1 query reward);
- `joint.train_joint_ppo`: joint multi-agent PPO of one shared policy over every role of a system (each system's
  module, `ragteam.systems.<system>`, builds what it trains, QAgent's two stages included), on one policy-gradient
  core (`pg`) and pluggable advantage estimators (`advantages`);
- `openrlhf`: datasets, reward-function file and Ray / DeepSpeed commands for a GPU cluster;
- `checkpoints`, `curves`, `model_card`: resume, the saved agent, DVC plots and the model card.
Heavy imports (torch, transformers, trl, peft) happen inside the functions that need them.
"""
