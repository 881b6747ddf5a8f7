"""What the worker tests share besides fixtures."""
from __future__ import annotations

LORA_RANK = 16  # params.yaml joint.ppo.lora: rank 16, alpha 32, top 4 layers


def engine_config():
    """The tests' vLLM settings: float32 (bf16 is slow on AVX2) and eager (starts in ~15 s instead of ~45 s)."""
    from ragteam.llm import EngineConfig

    return EngineConfig(backend="vllm", device="cpu", dtype="float32", seed=0, threads=1,
                        vllm={"enforce_eager": True, "max_model_len": 2048})


def peft_policy(model_dir, seed: int):
    """SmolLM2 with a LoRA adapter as the joint trainer builds it (params.yaml joint.ppo.lora) and random weights in
    place of a trained step's (peft initialises B to zero: the adapter would change nothing)."""
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
            if "lora_B" in name:
                t.copy_(torch.randn(t.shape, generator=g) * 0.02)
    return model.eval()
