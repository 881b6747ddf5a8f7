"""The actor and the critic on one backbone: LoRA (optionally on the top layers only, with the frozen layers below
run once per sample: `frozen_split`), a value head on the shared backbone or a separate copy, the optimiser with
one parameter group each, the learning-rate schedule, and log pi_old / pi_ref of a batch."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import contextmanager

from ragteam.train.common import cpu_bf16, lora_config
from ragteam.train.joint.params import PPOParams

log = logging.getLogger(__name__)


def _parts(model):
    """(decoder, lm_head) of a causal LM, through a peft wrapper (whose LoRA layers live inside the base model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()

@contextmanager
def _layer_view(decoder, start: int, stop: int | None, final_norm: bool):
    """The decoder with only its layers [start:stop] (and without its final norm unless `final_norm`) for the time
    of the block: its own forward then computes the causal mask and the rotary positions as always, over fewer
    layers. Layers [0:k] from `input_ids` give the hidden states that layers [k:] continue from as `inputs_embeds`."""
    import torch

    layers, norm = decoder.layers, decoder.norm
    decoder.layers = torch.nn.ModuleList(list(layers)[start:stop])
    if not final_norm:
        decoder.norm = torch.nn.Identity()
    try:
        yield decoder
    finally:
        decoder.layers, decoder.norm = layers, norm

def frozen_split(model, p: PPOParams) -> tuple[int | None, str]:
    """(k, why): the policy's layers [0:k] are frozen and their output can be reused across a step's passes, or
    (None, the reason it cannot). Needs LoRA on the top `lora.top_layers` layers only, no gradient checkpointing,
    nothing trainable in the embeddings or layers [0:k], and a decoder whose forward, split at k, gives the same
    hidden states as in one piece: checked on a short right-padded batch, so an architecture that treats
    `inputs_embeds` differently from its own embeddings (Gemma scales them) falls back to the full forward."""
    import torch

    if not p.reuse_frozen_layers:
        return None, "reuse_frozen_layers is off"
    if not p.lora.enabled or p.lora.top_layers is None:
        return None, "no LoRA on the top layers only: every layer trains"
    if p.gradient_checkpointing:
        return None, "gradient checkpointing recomputes the layers anyway"
    decoder, _ = _parts(model)
    n = len(decoder.layers)
    k = n - p.lora.top_layers
    if k <= 0:
        return None, f"LoRA covers all {n} layers"
    frozen = [decoder.get_input_embeddings(), *list(decoder.layers)[:k]]
    if any(t.requires_grad for m in frozen for t in m.parameters()):
        return None, f"a parameter of the embeddings or of layers 0-{k - 1} is trainable"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, decoder.get_input_embeddings().num_embeddings, (2, 12), generator=g)
    att = torch.ones_like(ids)
    att[1, 7:] = 0
    dev = next(decoder.parameters()).device
    ids, att = ids.to(dev), att.to(dev)
    with torch.no_grad():
        whole = decoder(input_ids=ids, attention_mask=att).last_hidden_state
        with _layer_view(decoder, 0, k, final_norm=False):
            h = decoder(input_ids=ids, attention_mask=att).last_hidden_state
        with _layer_view(decoder, k, None, final_norm=True):
            split = decoder(inputs_embeds=h, attention_mask=att).last_hidden_state
    keep = att.bool()
    if split.shape != whole.shape or not torch.allclose(split[keep].float(), whole[keep].float(), rtol=1e-4,
                                                        atol=1e-4):
        return None, f"{type(decoder).__name__} split at layer {k} does not reproduce its own forward"
    return k, f"layers 0-{k - 1} frozen, run once per sample a step"

def _build_actor_critic(model_path: str, p: PPOParams, device: str, dtype, with_critic: bool = True):
    """The policy (+ the separate critic's backbone) and the value head, with every trainable weight in float32.

    `dtype` is the compute precision (the engine's). With LoRA the frozen base stays in `dtype` and peft keeps the
    adapters in float32 (`autocast_adapter_dtype`); with full fine-tuning in bf16/fp16 the backbone is loaded in float32
    (the optimiser's master weights) and `forward` (and `autocast()` around the rollout) computes in `dtype`: AdamW on
    bf16 weights rounds an update of lr 2e-7 (M-ASK's actor) to zero, so the weights would never move."""
    import torch
    from transformers import AutoModelForCausalLM

    upcast = not p.lora.enabled and dtype != torch.float32     # full fine-tuning below fp32: fp32 master weights
    load_dtype = torch.float32 if upcast else dtype

    def backbone():
        m = AutoModelForCausalLM.from_pretrained(model_path, dtype=load_dtype)
        if p.lora.enabled:
            from peft import get_peft_model

            m = get_peft_model(m, lora_config(p.lora, model_path), autocast_adapter_dtype=True)
        return m

    class ActorCritic(torch.nn.Module):
        """log π(response tokens) and V at the token before each response token, in one forward pass."""

        def __init__(self):
            super().__init__()
            self.policy = backbone()
            hidden = self.policy.config.get_text_config().hidden_size
            self.critic = backbone() if with_critic and p.critic == "separate" else None
            self.value_head = torch.nn.Linear(hidden, 1, dtype=torch.float32)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
            if not with_critic:                 # critic-free estimators: the head is never trained nor read
                self.value_head.requires_grad_(False)
            if p.gradient_checkpointing:
                for m in (self.policy, self.critic):
                    if m is not None:
                        m.gradient_checkpointing_enable()
                        if p.lora.enabled:
                            m.enable_input_require_grads()
            self.split, why = frozen_split(self.policy, p)
            log.info("reuse of the frozen layers' output across a step's passes: %s (%s)",
                     "on" if self.split is not None else "off", why)

        def autocast(self):
            """Compute in the engine dtype over float32 master weights (a no-op unless they were upcast)."""
            return torch.autocast(torch.device(device).type, dtype=dtype, enabled=upcast)

        def hidden(self, input_ids, attention_mask):
            """The frozen layers' output (layers [0:split]), without gradients: what `forward(hidden=...)` and
            the separate critic (the same frozen base weights) continue from."""
            decoder, _ = _parts(self.policy)
            with torch.no_grad(), self.autocast(), _layer_view(decoder, 0, self.split, final_norm=False):
                return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        def _decode(self, model, input_ids, attention_mask, hidden):
            decoder, _ = _parts(model)
            if hidden is None:
                return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            with _layer_view(decoder, self.split, None, final_norm=True):
                return decoder(inputs_embeds=hidden, attention_mask=attention_mask).last_hidden_state

        def forward(self, input_ids, attention_mask, positions, targets, temperature: float = 1.0,
                    values: bool = True, hidden=None):
            """`hidden`: `self.hidden(input_ids, attention_mask)`, computed once and reused; None: all layers."""
            with self.autocast():
                _, head = _parts(self.policy)
                h = self._decode(self.policy, input_ids, attention_mask, hidden)
                idx = positions[..., None].expand(-1, -1, h.shape[-1])
                hs = h.gather(1, idx)                                                   # (B, R, H)
                logits = head(hs).float() / temperature
                logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
                if not values:
                    return logp, None
                if self.critic is not None:
                    hc = self._decode(self.critic, input_ids, attention_mask, hidden).gather(1, idx)
                else:
                    # the value loss trains the head, not the policy's weights (unless value_grad_to_backbone)
                    hc = hs if p.value_grad_to_backbone else hs.detach()
            v = self.value_head(hc.float()).squeeze(-1)
            return logp, v

    return ActorCritic().to(device)

def is_critic_param(name: str) -> bool:
    """Whether a parameter of the ActorCritic (or of its data-parallel wrapper, "module.") belongs to the critic:
    the value head or the separate critic's backbone; everything else trainable is the policy's."""
    return name.removeprefix("module.").startswith(("value_head.", "critic."))

def actor_critic_params(model) -> tuple[list, list]:
    """(policy, critic) trainable parameters: the optimiser's two groups and the two gradient norms."""
    named = [(n, t) for n, t in model.named_parameters() if t.requires_grad]
    return [t for n, t in named if not is_critic_param(n)], [t for n, t in named if is_critic_param(n)]

def make_optimizer(ac, p: PPOParams):
    """AdamW with the policy at actor_lr and the critic at critic_lr (no weight decay: verl's default for both)."""
    import torch

    actor, critic = actor_critic_params(ac)
    groups = [{"params": actor, "lr": p.actor_lr}]
    if critic:
        groups.append({"params": critic, "lr": p.critic_lr})
    return torch.optim.AdamW(groups, betas=p.adam_betas, weight_decay=0.0)

def _trainable_state(ac) -> dict:
    return {n: t.detach().cpu().clone() for n, t in ac.named_parameters() if t.requires_grad}

def _schedule(name: str, steps: int, warmup: int = 0) -> Callable[[int], float]:
    """The lr factor at (0-based) step s: linear warm-up over `warmup` steps, then `name` over the rest."""
    rest = max(steps - warmup, 1)
    if name == "constant":
        after = lambda s: 1.0  # noqa: E731
    elif name == "linear":
        after = lambda s: max(0.0, 1.0 - s / rest)  # noqa: E731
    else:
        after = lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, rest) / rest))  # noqa: E731
    return lambda s: (s + 1) / warmup if s < warmup else after(s - warmup)

def start_logp(ac, ref, p: PPOParams, batch, hidden=None):
    """log π_start of a collated batch's response tokens (no gradients): the reference of the KL term and of the
    `kl_start` curve. With LoRA (`ref` None) the start model is the policy with its adapters off, above the same
    frozen layers (`hidden`, when the step reuses their output); without, the separately loaded `ref`."""
    import torch

    ids, att, pos, tgt, _ = batch
    if ref is None:
        with ac.policy.disable_adapter():
            return ac(ids, att, pos, tgt, p.temperature, values=False, hidden=hidden)[0]
    h = ref.get_decoder()(input_ids=ids, attention_mask=att).last_hidden_state
    logits = ref.get_output_embeddings()(h.gather(1, pos[..., None].expand(-1, -1, h.shape[-1]))).float()
    return torch.log_softmax(logits / p.temperature, -1).gather(-1, tgt[..., None]).squeeze(-1)

def compute_dtype(engine_dtype: str, device: str):
    """The joint trainer's compute precision: the engine's on CUDA (as before), bf16 on the CPU when asked
    (`cpu_bf16`), else float32 (fp16 has no fast CPU kernels)."""
    import torch

    if str(device).startswith("cpu"):
        return torch.bfloat16 if cpu_bf16(engine_dtype, "cpu") else torch.float32
    return torch.float32 if engine_dtype in ("auto", "float32") else getattr(torch, engine_dtype)
