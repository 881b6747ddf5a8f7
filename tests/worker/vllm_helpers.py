"""What the worker tests share besides fixtures."""
from __future__ import annotations

LORA_RANK = 16  # params.yaml joint.ppo.lora: rank 16, alpha 32, top 4 layers
LORA_B_STD = 0.1   # measured on the 5 test prompts: seeds 0, 1, 5 change 4-5 greedy outputs (0.02: 3, 0, 1)


def engine_config():
    """The tests' vLLM settings: float32 (bf16 is slow on AVX2) and eager (starts in ~15 s instead of ~45 s)."""
    from ragteam.llm import EngineConfig

    return EngineConfig(backend="vllm", device="cpu", dtype="float32", seed=0, threads=1,
                        vllm={"enforce_eager": True, "max_model_len": 2048})


def peft_policy(model_dir, seed: int):
    """SmolLM2 with a LoRA adapter as the joint trainer builds it (params.yaml joint.ppo.lora) and random weights in
    place of a trained step's (peft initialises B to zero: the adapter would change nothing).

    Both factors come from `seed` alone: peft draws A from torch's global generator, whose state depends on what
    ran before in the process, and with such an A one adapter of a CI run left every greedy output unchanged."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from ragteam.train.common import LoraParams, lora_config

    lora = LoraParams(enabled=True, rank=LORA_RANK, alpha=32, top_layers=4)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                           lora_config(lora, str(model_dir)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if "lora_A" in name:   # peft's kaiming-uniform bound, 1/sqrt(fan_in), drawn from g
                t.copy_((torch.rand(t.shape, generator=g) * 2 - 1) / t.shape[1] ** 0.5)
            elif "lora_B" in name:
                t.copy_(torch.randn(t.shape, generator=g) * LORA_B_STD)
    return model.eval()
