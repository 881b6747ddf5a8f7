"""TRL's fused LM head projects only the positions a loss uses on the CPU, with the numbers of projecting them all.

`trl_lm_head_labelled_only` (SFT, TRL's GRPO) skips the rows of the vocabulary projection that no loss term reads.
The test runs the full and the reduced computation on one random model, compares the loss terms and the gradients,
and checks that the rows are really skipped (so the speed-up is not a no-op).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def TRL_OWN():
    """TRL's own `_use_triton`, which `trl.trainer.utils` imports from its kernel module."""
    from trl.kernels.chunked_logprob import _use_triton

    return _use_triton


def _tiny(vocab=300, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=True)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _batch(vocab=300, prompt=(14, 9), completion=(4, 6)):
    """Two right-padded rows: prompt tokens at label -100 (as TRL's completion-only loss masks them), padding too."""
    T = max(p + c for p, c in zip(prompt, completion))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (2, T), generator=g)
    att = torch.zeros(2, T, dtype=torch.long)
    labels = torch.full((2, T), -100)
    for i, (p, c) in enumerate(zip(prompt, completion)):
        att[i, :p + c] = 1
        labels[i, p:p + c] = ids[i, p:p + c]
    return ids, att, labels


def _fused_pass(model, ids, att, labels, rows_seen):
    import trl.trainer.utils as tu

    apply = tu._ChunkedLogProbFunction.apply

    def counting(hidden, *a):
        rows_seen.append(hidden.shape[0])
        return apply(hidden, *a)

    tu._ChunkedLogProbFunction.apply = counting
    try:
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=att, labels=labels, fused_lm_head=True)
        out.loss.backward()
    finally:
        tu._ChunkedLogProbFunction.apply = apply
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_trl_fused_head_projects_only_labelled_positions_on_cpu_with_the_same_loss_and_gradients(monkeypatch):
    import trl.trainer.utils as tu
    from trl.trainer.utils import add_fused_lm_head

    from ragteam.train.common import trl_lm_head_labelled_only

    monkeypatch.setattr(tu, "_use_triton", TRL_OWN())                # TRL's own (another test may have wrapped it)
    model = _tiny()
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))   # what SFTTrainer adds
    ids, att, labels = _batch()
    n_labelled = int((labels[:, 1:] != -100).sum())                  # next-token labels after the shift

    full_rows: list[int] = []
    full, full_grads = _fused_pass(model, ids, att, labels, full_rows)
    assert full_rows == [ids.shape[0] * (ids.shape[1] - 1)]          # TRL on the CPU: every position projected

    assert trl_lm_head_labelled_only() is True
    assert trl_lm_head_labelled_only() is True                       # idempotent: one wrapper, not a chain
    assert not getattr(tu._use_triton.__closure__[0].cell_contents, "_ragteam_cpu_labelled_only", False)
    kept_rows: list[int] = []
    kept, kept_grads = _fused_pass(model, ids, att, labels, kept_rows)
    assert kept_rows == [n_labelled]                                 # only the completion's positions

    torch.testing.assert_close(kept.loss, full.loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(kept.log_probs, full.log_probs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(kept.entropy, full.entropy, rtol=1e-6, atol=1e-7)
    assert torch.equal(kept.is_top1, full.is_top1)
    assert kept_grads.keys() == full_grads.keys() and kept_grads
    for name, g in full_grads.items():
        torch.testing.assert_close(kept_grads[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_trl_hook_is_looked_up_where_the_fused_head_reads_it():
    """The wrapper acts only while `add_fused_lm_head`'s forward reads `_use_triton` from its module at call time;
    a TRL that binds it elsewhere must fail this test (the pinned one passes), not silently lose the speed-up."""
    import inspect

    import trl.trainer.utils as tu

    src = inspect.getsource(tu.add_fused_lm_head)
    assert "compact = _use_triton(hidden_states.device)" in src


def test_sft_trainer_turns_the_labelled_only_head_on(tiny_llama, tmp_path, monkeypatch):
    import trl.trainer.utils as tu

    from ragteam.train.sft import SFTParams, sft_trainer

    monkeypatch.setattr(tu, "_use_triton", TRL_OWN())
    assert tu._use_triton(torch.device("cpu")) is False               # TRL's own answer on the CPU
    rows = [{"prompt": [{"role": "user", "content": "q?"}], "completion": [{"role": "assistant", "content": "a"}],
             "id": "0"}]
    sft_trainer(rows, str(tiny_llama), str(tmp_path / "ckpt"),
                SFTParams(steps=1, batch_size=1, lr=1e-3, max_length=64, save_steps=1))
    assert tu._use_triton(torch.device("cpu")) is True
