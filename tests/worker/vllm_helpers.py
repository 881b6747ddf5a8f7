"""What the worker tests share besides fixtures."""
from __future__ import annotations

LORA_RANK = 16  # params.yaml joint.ppo.lora: rank 16, alpha 32, top 4 layers


def engine_config():
    """The tests' vLLM settings: float32 (bf16 is slow on AVX2) and eager (starts in ~15 s instead of ~45 s)."""
    from ragteam.llm import EngineConfig

    return EngineConfig(backend="vllm", device="cpu", dtype="float32", seed=0, threads=1,
                        vllm={"enforce_eager": True, "max_model_len": 2048})
