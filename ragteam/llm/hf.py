"""transformers backend: batched chat generation with left padding and the KV cache, on CPU or CUDA.

Prompts of one call are sorted by length and cut into `batch_size` chunks, so similar lengths share a forward pass
and padding stays small; results come back in the caller's order.

On CPU the prompt pass (prefill) is compute-bound: batching it saves nothing and padding wastes work. So on CPU
each prompt is prefilled alone (no padding), reusing the KV of the longest previously seen prefix (prefix caching,
`prefix_cache_tokens`), and the KV caches are left-padded into one batch cache from which all prompts decode
together; decoding is where batching pays (one weight read per step for the whole batch). On CUDA the whole chunk
is prefilled as one padded batch. Both give the outputs of one-prompt-at-a-time generation.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig

from ragteam.llm import Completion, EngineConfig, Messages, SamplingConfig, chat_text, find_stop
from ragteam.timing import timed


_MIN_PREFIX = 16  # shorter shared prefixes are not worth a cache copy


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class HFEngine:
    @timed("engine_start")
    def __init__(self, model_path: str, cfg: EngineConfig, model=None, tokenizer=None):
        """Load `model_path`, or (a trainer's rollouts) generate with the given in-memory `model` / `tokenizer`."""
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.model_path, self.batch_size, self.seed = str(model_path), cfg.batch_size, cfg.seed
        self.device = _device(cfg.device)
        self.prefill_alone = self.device == "cpu"  # see the module docstring
        self.prefix_cache_tokens = cfg.prefix_cache_tokens if self.prefill_alone else 0
        self._prefix_cache: OrderedDict[int, tuple[np.ndarray, list]] = OrderedDict()
        dtype = "auto" if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"  # decoder-only: new tokens must follow the prompt directly
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = (model if model is not None else
                      AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype).to(self.device).eval())
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        self.eos_ids.discard(None)

    def encode(self, messages: Messages) -> list[int]:
        """Prompt ids; a final assistant message is continued, not closed (see `ragteam.llm.chat_text`)."""
        text = chat_text(self.tokenizer, messages)
        # the template already holds the special tokens; adding them again would double the BOS
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _gen_config(self, s: SamplingConfig) -> GenerationConfig:
        kw = dict(max_new_tokens=s.max_new_tokens, num_return_sequences=s.n, use_cache=True,
                  pad_token_id=self.tokenizer.pad_token_id, eos_token_id=sorted(self.eos_ids))
        if s.min_new_tokens:
            kw["min_new_tokens"] = min(s.min_new_tokens, s.max_new_tokens)
        if s.temperature > 0:
            kw.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0)
        else:
            kw.update(do_sample=False)
        if s.stop:
            kw["stop_strings"] = list(s.stop)
        return GenerationConfig(**kw)

    @torch.inference_mode()
    @timed("generation")
    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        """Sampling draws from the global torch RNG (transformers' `generate` has no generator argument): it is
        seeded with `sampling.seed` (else the engine's seed) inside `fork_rng`, so a call's samples depend only on
        its seed and batch, and the caller's RNG (a trainer's dropout and shuffles) is left as it was."""
        if sampling.regex is not None:
            raise ValueError(f"guided decoding (sampling regex {sampling.regex!r}) needs the vllm engine: the hf "
                             "engine cannot constrain its output; set llm.backend (or llm.stages.<stage>) to vllm")
        if sampling.temperature <= 0:
            return self._generate(prompts, sampling)
        devices = [torch.device(self.device).index or 0] if self.device.startswith("cuda") else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed if sampling.seed is None else sampling.seed)
            return self._generate(prompts, sampling)

    def _generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        ids = [self.encode(m) for m in prompts]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        gen_cfg = self._gen_config(sampling)
        out: list[list[Completion]] = [[] for _ in prompts]
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            width = max(len(ids[i]) for i in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                input_ids[row, width - len(ids[i]):] = torch.tensor(ids[i])
                mask[row, width - len(ids[i]):] = 1
            kw = dict(generation_config=gen_cfg, tokenizer=self.tokenizer if sampling.stop else None)
            if self.prefill_alone:
                cache = self._prefill_alone([ids[i] for i in chunk], width)
                if sampling.n > 1:  # n samples per prompt: replicate the rows and their caches
                    cache.batch_repeat_interleave(sampling.n)
                    input_ids, mask = input_ids.repeat_interleave(sampling.n, 0), mask.repeat_interleave(sampling.n, 0)
                    kw["generation_config"] = self._gen_config(sampling.model_copy(update={"n": 1}))
                kw["past_key_values"] = cache
            gen = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device), **kw)
            new = gen[:, width:].tolist()
            for row, i in enumerate(chunk):
                for j in range(sampling.n):
                    out[i].append(self._completion(new[row * sampling.n + j], ids[i], sampling))
        return out

    def _prefill_alone(self, rows: list[list[int]], width: int) -> DynamicCache:
        """KV cache of every prompt but its last token, each computed alone, left-padded to `width - 1`.

        `generate` then feeds only the last prompt token of every row (cache_position = width - 1); padded slots
        are masked by the attention mask and each row keeps the rotary positions it was prefilled with.
        """
        per_layer: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.model.model.layers]
        for r in rows:
            if len(r) < 2:
                raise ValueError("a prompt must have at least 2 tokens (the chat template alone has more)")
            for li, (k, v) in enumerate(self._prefill_one(r[:-1])):
                pad = (width - 1) - k.shape[2]
                per_layer[li].append((F.pad(k, (0, 0, pad, 0)), F.pad(v, (0, 0, pad, 0))))
        cache = DynamicCache(config=self.model.config)
        for li, kv in enumerate(per_layer):
            cache.update(torch.cat([k for k, _ in kv]), torch.cat([v for _, v in kv]), li)
        return cache

    def _prefill_one(self, ctx: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer (keys, values) of `ctx`, continuing from the longest cached prefix (prefix caching).

        Workflow prompts share long prefixes: a role's system prompt across episodes, and an episode's query pool
        from one round to the next (the pool only grows). Only the new suffix is computed.
        """
        key, hit = self._longest_cached_prefix(ctx) if self.prefix_cache_tokens else (None, 0)
        c = DynamicCache(config=self.model.config)
        if key is not None:
            toks, cached = self._prefix_cache[key]
            for li, (k, v) in enumerate(cached):
                c.update(k[:, :, :hit], v[:, :, :hit], li)
            if hit >= len(toks) - _MIN_PREFIX:  # ctx extends that entry (the next round's prompt): it supersedes it
                del self._prefix_cache[key]
            else:
                self._prefix_cache.move_to_end(key)  # least recently used goes first
        if hit < len(ctx):
            self.model.model(input_ids=torch.tensor([ctx[hit:]], device=self.device), past_key_values=c,
                             use_cache=True)
        kv = [(layer.keys, layer.values) for layer in c.layers]
        if self.prefix_cache_tokens:
            self._remember(ctx, kv)
        return kv

    def clear_prefix_cache(self) -> None:
        self._prefix_cache.clear()

    def _longest_cached_prefix(self, ctx: list[int]) -> tuple[int | None, int]:
        """(key of the cached entry sharing the longest prefix with ctx, that length); (None, 0) below _MIN_PREFIX."""
        best_key, best = None, 0
        arr = np.asarray(ctx)
        for key, (toks, _) in self._prefix_cache.items():
            n = min(len(toks), len(arr))
            diff = np.flatnonzero(toks[:n] != arr[:n])
            common = int(diff[0]) if len(diff) else n
            if common > best:
                best_key, best = key, common
        return (best_key, best) if best >= _MIN_PREFIX else (None, 0)

    def _remember(self, ctx: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        key = hash(tuple(ctx))
        self._prefix_cache.pop(key, None)
        self._prefix_cache[key] = (np.asarray(ctx), kv)
        total = sum(len(e[0]) for e in self._prefix_cache.values())
        while total > self.prefix_cache_tokens and len(self._prefix_cache) > 1:  # least recently used first
            total -= len(self._prefix_cache.popitem(last=False)[1][0])

    def _completion(self, tokens: list[int], prompt_ids: list[int], s: SamplingConfig) -> Completion:
        """The row's generated ids as a Completion; `token_ids` as `ragteam.llm.Completion` defines them."""
        # pad == eos for many chat models: everything from the first EOS on is padding; the EOS itself counts
        end = next((k for k, t in enumerate(tokens) if t in self.eos_ids), None)
        used = tokens if end is None else tokens[:end + 1]
        text, stop = find_stop(self.tokenizer.decode(used, skip_special_tokens=True), s.stop)
        if stop is not None:  # a row that stopped on a stop string is padded after it, like one that stopped on EOS
            used = used[:self._stop_end(used, s.stop)]
        finish = "stop" if (end is not None or stop is not None) else "length"
        return Completion(text=text, prompt_tokens=len(prompt_ids), completion_tokens=len(used), finish_reason=finish,
                          stop_reason=stop, prompt_ids=tuple(prompt_ids), token_ids=tuple(used))

    def _stop_end(self, tokens: list[int], stop: list[str]) -> int:
        """The length of the shortest prefix of `tokens` whose text holds a stop string: the ids through the token
        that completed it (where generation stopped, as transformers' StopStringCriteria and vLLM stop). Binary
        search: once a prefix holds a stop string every longer one does."""
        lo, hi = 1, len(tokens)
        while lo < hi:
            mid = (lo + hi) // 2
            if find_stop(self.tokenizer.decode(tokens[:mid], skip_special_tokens=True), stop)[1] is None:
                lo = mid + 1
            else:
                hi = mid
        return hi


class _AdapterOff:
    """An engine view that generates with the policy's LoRA adapter switched off: the frozen base model, for the
    helper roles that must not change while the policy trains (DECOR's summarizer and an LLM judge)."""

    def __init__(self, engine: HFEngine, off):
        self.engine, self.off, self.model_path = engine, off, engine.model_path

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        with self.off():
            return self.engine.generate(prompts, sampling)


class HFPolicy:
    """A trainer's policy generating live (`ragteam.llm.policy.PolicyEngine`): an HFEngine over the very model being
    trained, so there are no weights to copy; `sync` only drops the prefix KV computed with the previous ones.

    `base()`: with LoRA, the same weights with the adapter switched off, through its own HFEngine so that the two
    prefix caches never mix adapter-on and adapter-off KV; with full fine-tuning (whose updates change the base
    weights) a second, untouched copy from `base_loader(model_path)`."""

    def __init__(self, policy, tokenizer, model_path: str, cfg: EngineConfig, base_loader):
        self.policy, self.lora = policy, hasattr(policy, "peft_config")
        # peft injects its LoRA layers into the base model in place: generating with it applies the adapter
        self._weights = policy.get_base_model() if self.lora else policy
        self.engine = HFEngine(model_path, cfg, model=self._weights, tokenizer=tokenizer)
        self.model_path, self._cfg, self._tok = self.engine.model_path, cfg, tokenizer
        self._base_loader, self._base = base_loader, None

    @timed("generation")
    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        return self.engine.generate(prompts, sampling)

    def sync(self, policy) -> None:
        if policy is not self.policy:
            raise ValueError(f"live policy on {self.model_path}: it generates with the model it was built on and "
                             "cannot take another one's weights")
        self.engine.clear_prefix_cache()      # the weights changed: cached prefix KV is stale

    def base(self):
        if self._base is None:
            if self.lora:
                self._base = _AdapterOff(HFEngine(self.model_path, self._cfg, model=self._weights,
                                                  tokenizer=self._tok), self.policy.disable_adapter)
            else:
                self._base = self._base_loader(self.model_path)
        return self._base

    def close(self) -> None:
        """Nothing to stop: the engine lives in this process and shares the trainer's weights."""
