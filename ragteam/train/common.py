"""What every trainer shares (GRPO on TRL, shared-prefix GRPO, SFT, the OpenRLHF job writer): the GRPO and LoRA
params, the sample record, LoRA and device setup.

Its own module so that `grpo` (which dispatches to `grpo_prefix`) and `grpo_prefix` both import it and never each
other.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragteam.config import Strict

Messages = list[dict[str, str]]


class LoraParams(Strict):
    enabled: bool = False
    rank: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # Llama / Qwen / Mistral projection names (peft's "all-linear" cannot be combined with top_layers)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    top_layers: int | None = Field(None, ge=1)  # adapters on the top N decoder layers only: backward stops there


class GRPOParams(Strict):
    """One GRPO run (params.yaml: e.g. `train_answer.stage1`)."""

    steps: int = Field(ge=1)                          # optimiser steps
    prompts_per_step: int = Field(ge=1)               # the paper's rollout batch (32)
    num_generations: int = Field(ge=2)                # G rollouts per prompt (16 in the paper)
    micro_batch_size: int = Field(ge=1)               # completions per forward/backward (trl; shared_prefix: a group)
    lr: float = Field(gt=0)                           # 1e-6 in the paper
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    kl_beta: float = Field(0.0, ge=0)                 # 1e-4 in the paper; 0 loads no reference model
    temperature: float = Field(1.0, gt=0)
    max_completion_length: int = Field(ge=1)          # new tokens per rollout
    seed: int = 0
    save_steps: int = Field(ge=1)
    save_total_limit: int = Field(2, ge=1)
    gradient_checkpointing: bool = False              # saves memory on GPU, costs ~30 % time on CPU
    # "trl": GRPOTrainer (CPU/GPU, vLLM); "shared_prefix": ragteam.train.grpo_prefix, the prompt encoded once per
    # group (~7x fewer FLOPs with long RAG prompts and short answers: the CPU default)
    trainer: Literal["trl", "shared_prefix"] = "trl"
    use_vllm: bool = False                            # TRL vLLM colocate (GPU env only)
    # a vLLM engine sharing the GPU with the trainer: TRL's colocate mode, and the engine of rollout_backend: vllm
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    # shared_prefix: an optimiser step with a NaN/inf gradient is skipped (and counted, `nonfinite_grad_steps`); this
    # many skipped in a row stop the run (TrainingDiverged). TRL's own trainer does not check
    max_nonfinite_grad_steps: int = Field(3, ge=1)
    # shared_prefix: one of each prompt's G completions is the greedy one, the output inference gives. A lead-in
    # stub can be the policy's mode while the sampler rarely draws it (issue 27: studies/answer_silence/notes.md);
    # scored in every group, it is penalised until it is no longer the mode. Not in the paper (False there)
    greedy_in_group: bool = False
    # shared_prefix: where the groups are sampled. live: by the model being trained (the prompt's KV repeated G
    # times); vllm: by a vLLM engine that gets the policy's LoRA adapter or weights before every step
    # (ragteam.llm.policy; the stage then runs in the worker environment). The loss scores the engine's token ids
    rollout_backend: Literal["live", "vllm"] = "live"
    # vllm rollouts: truncated importance sampling of the engine's samples, w_t = min(π_θ / π_engine, cap)
    # (pg.truncated_is_weights); None: no correction (the engine's fp32 log-probs match the trainer's to ~1e-6)
    rollout_is_cap: float | None = Field(None, gt=0)
    lora: LoraParams = LoraParams()

    @model_validator(mode="after")
    def _batches_divide(self):
        total = self.prompts_per_step * self.num_generations
        if total % self.micro_batch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) must divide prompts_per_step x "
                             f"num_generations ({total})")
        if self.greedy_in_group and self.trainer != "shared_prefix":
            raise ValueError("greedy_in_group needs trainer: shared_prefix (TRL's GRPOTrainer samples every "
                             "completion)")
        if self.rollout_backend == "vllm" and self.trainer != "shared_prefix":
            raise ValueError("rollout_backend: vllm needs trainer: shared_prefix (TRL's GRPOTrainer has its own "
                             "use_vllm, GPU only)")
        if self.rollout_is_cap is not None and self.rollout_backend != "vllm":
            raise ValueError("rollout_is_cap corrects a rollout engine's samples: it needs rollout_backend: vllm")
        return self


# Params that decide how a run is carried out, not what it trains: memory (micro-batches, i.e. gradient accumulation,
# gradient checkpointing, vLLM's memory share), checkpoint bookkeeping, what is reported (the joint trainer's
# collapse flag) and when a diverging run gives up. Changing one must resume a run, not discard its resume state.
BOOKKEEPING = frozenset({"save_steps", "save_total_limit", "micro_batch_size", "gradient_checkpointing",
                         "vllm_gpu_memory_utilization", "collapse_window", "collapse_drop",
                         "max_nonfinite_grad_steps", "reuse_frozen_layers"})


def model_params(params: BaseModel) -> dict[str, Any]:
    """The params that change the trained model: what the checkpoint fingerprint covers.

    SFT's `batch_size` x `grad_accum` enter as their product (the optimiser's batch): 4 x 1 and 2 x 2 train the same.
    """
    out = {k: v for k, v in params.model_dump().items() if k not in BOOKKEEPING}
    if "batch_size" in out and "grad_accum" in out:
        out["effective_batch"] = out.pop("batch_size") * out.pop("grad_accum")
    return out


class GRPOSample(BaseModel):
    """One GRPO prompt: chat messages and the golden answers the reward compares against."""

    model_config = ConfigDict(extra="forbid")
    id: str
    prompt: Messages = Field(min_length=1)
    golden_answers: list[str] = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)


def validate_samples(rows: Sequence[GRPOSample | dict], model: type[BaseModel] = GRPOSample) -> list:
    """Rows -> samples; a bad row fails with its index and id."""
    out = []
    for i, r in enumerate(rows):
        if isinstance(r, model):
            out.append(r)
            continue
        try:
            out.append(model.model_validate(r))
        except Exception as e:
            rid = r.get("id", "?") if isinstance(r, dict) else "?"
            raise ValueError(f"training sample {i} (id={rid!r}) is invalid: {e}") from None
    if not out:
        raise ValueError("no training samples")
    return out


def lora_config(p: LoraParams, model_path: str):
    from peft import LoraConfig  # optional dependency: only when lora.enabled
    from transformers import AutoConfig

    layers = None
    if p.top_layers is not None:
        n = AutoConfig.from_pretrained(model_path).get_text_config().num_hidden_layers
        layers = list(range(max(n - p.top_layers, 0), n))
    return LoraConfig(r=p.rank, lora_alpha=p.alpha, lora_dropout=p.dropout, target_modules=p.target_modules,
                      layers_to_transform=layers, task_type="CAUSAL_LM")


def cpu_bf16_native(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX-BF16 or AVX512-BF16, Linux /proc/cpuinfo): there
    bf16 matmuls run up to ~2x fp32 (vLLM passes 1.6-2.4x, whole training stages ~1.3x:
    benchmarks/results/cpu_bf16.md); elsewhere torch and vLLM emulate bf16, slower than fp32."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def cpu_bf16(dtype: str, device: str | None = None) -> bool:
    """Whether a trainer on `device` (None: cuda if there is one, else cpu) computes in bf16 because `llm.dtype` asks
    for it on the CPU: the one case this option changes (CUDA kept its own precision rules). Warns once when the CPU
    has no native bf16, where it runs slower than fp32."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on = dtype == "bfloat16" and str(device).startswith("cpu")
    if on and not cpu_bf16_native():
        import warnings

        warnings.warn("llm.dtype is bfloat16 but this CPU has neither AMX-BF16 nor AVX512-BF16: bf16 is emulated "
                      "here and slower than float32 (benchmarks/results/cpu_bf16.md)", RuntimeWarning, stacklevel=2)
    return on


def device_args(dtype: str = "float32") -> dict[str, Any]:
    """TrainingArguments for the device: CUDA trains in bf16 mixed precision where it can (as before); the CPU in
    fp32 unless the engine dtype (`llm.dtype`) is bfloat16, then in bf16 autocast over fp32 master weights."""
    import torch

    cuda = torch.cuda.is_available()
    bf16 = torch.cuda.is_bf16_supported() if cuda else cpu_bf16(dtype, "cpu")
    return {"use_cpu": not cuda, "bf16": bool(bf16)}


def precision_tag(dtype: str, device: str | None = None) -> dict[str, str]:
    """A training fingerprint's precision part: {"dtype": "bfloat16"} for bf16 on the CPU (`cpu_bf16`), else empty,
    so every other run's fingerprint (hence its model's hash), on the CPU or on CUDA, stays what it was, and a CPU bf16
    run never resumes an fp32 run's checkpoints or vice versa."""
    return {"dtype": "bfloat16"} if cpu_bf16(dtype, device) else {}


def trl_lm_head_labelled_only() -> bool:
    """Make TRL's fused LM head project only the labelled positions on the CPU too; returns whether it now does.

    TRL's trainers (SFT, GRPO, DPO, ...) replace the model's forward with `trl.trainer.utils.add_fused_lm_head`: the
    hidden states go through the LM head in vocabulary tiles and come back as the label tokens' log-probabilities.
    On CUDA it projects only the positions whose label is not -100; on any other device it projects every position
    and zeroes the masked ones after, a choice its comment explains by compilers (Neuron) that recompile for every
    new tile shape. Nothing is compiled on the CPU, and with the loss on the completion only (a 500-900-token prompt,
    a 20-60-token output: the joint warm-ups, the judge) nearly all of that work is thrown away: measured on the QAgent
    warm-up, the head's forward and backward were 45 % of a step (py-spy, 2 cores). The decision is the module-level
    `_use_triton(device)` that `add_fused_lm_head`'s forward reads at each call; this wraps it to answer True for the
    CPU as well. The kernel module keeps its own `_use_triton`, so the tiles stay torch code. The labelled positions'
    log-probabilities, the loss and every gradient are those of the full projection (tests/test_sft_lm_head.py
    compares them); only the unused rows are no longer computed. Without that hook (another TRL) it changes nothing
    and returns False, and the tests say so."""
    try:
        import trl.trainer.utils as tu
    except ImportError:
        return False
    current = getattr(tu, "_use_triton", None)
    if current is None or not hasattr(tu, "add_fused_lm_head"):
        return False
    if getattr(current, "_ragteam_cpu_labelled_only", False):
        return True

    def _labelled_only(device) -> bool:
        return device.type == "cpu" or current(device)

    _labelled_only._ragteam_cpu_labelled_only = True
    tu._use_triton = _labelled_only
    return True
