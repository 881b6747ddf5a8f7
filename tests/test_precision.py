"""bf16 compute on the CPU (`llm.dtype: bfloat16`): the SFT and PPO trainers train under it there too, over fp32
trainable weights, and a run's fingerprint says its precision without changing any fp32 run's."""
from __future__ import annotations

import math

import pytest
import torch

from ragteam.train.common import cpu_bf16_native, device_args, precision_tag
from ragteam.train.sft import SFTParams, sft_rows, sft_trainer, train_sft


def test_cpu_bf16_native_reads_the_cpu_flags(tmp_path):
    amx, avx512bf16, avx2 = (tmp_path / n for n in ("amx", "avx512bf16", "avx2"))
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 amx_tile\n")
    avx512bf16.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert cpu_bf16_native(str(amx)) and cpu_bf16_native(str(avx512bf16))
    assert not cpu_bf16_native(str(avx2))
    assert not cpu_bf16_native(str(tmp_path / "no-such-file"))


def test_device_args_train_the_cpu_in_bf16_only_when_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_args() == {"use_cpu": True, "bf16": False}
    assert device_args("float32") == {"use_cpu": True, "bf16": False}
    assert device_args("bfloat16") == {"use_cpu": True, "bf16": True}


def test_precision_tag_marks_cpu_bf16_alone_so_every_other_fingerprint_stays_as_it_was():
    assert precision_tag("float32", "cpu") == {} and precision_tag("auto", "cpu") == {}
    assert precision_tag("float16", "cpu") == {}                     # computes in fp32 there
    assert precision_tag("bfloat16", "cpu") == {"dtype": "bfloat16"}
    assert precision_tag("bfloat16", "cuda") == {}                   # CUDA's precision rules did not change


def test_the_joint_trainer_computes_bf16_on_the_cpu_only_when_asked_and_cuda_as_before():
    from ragteam.train.joint.actor_critic import compute_dtype

    assert compute_dtype("bfloat16", "cpu") == torch.bfloat16
    assert compute_dtype("float32", "cpu") == compute_dtype("auto", "cpu") == torch.float32
    assert compute_dtype("float16", "cpu") == torch.float32
    assert compute_dtype("bfloat16", "cuda:0") == torch.bfloat16 and compute_dtype("float16", "cuda") == torch.float16
    assert compute_dtype("auto", "cuda") == torch.float32


def test_bf16_on_a_cpu_without_native_bf16_warns(monkeypatch):
    import ragteam.train.common as common

    monkeypatch.setattr(common, "cpu_bf16_native", lambda cpuinfo="/proc/cpuinfo": False)
    with pytest.warns(RuntimeWarning, match="emulated"):
        assert common.cpu_bf16("bfloat16", "cpu")
    monkeypatch.setattr(common, "cpu_bf16_native", lambda cpuinfo="/proc/cpuinfo": True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert common.cpu_bf16("bfloat16", "cpu") and not common.cpu_bf16("float32", "cpu")


SAMPLES = [{"id": f"s{i}", "prompt": [{"role": "user", "content": f"Is {w} enough evidence?"}],
            "completion": label}
           for i, (w, label) in enumerate(zip(["this", "that", "one", "none"],
                                               ["Sufficient Information", "Insufficient Information"] * 2))]


def test_sft_trains_under_bf16_autocast_on_the_cpu_with_fp32_weights(tiny_llama, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    params = SFTParams(steps=2, batch_size=2, lr=1e-3, max_length=96, save_steps=1)
    rows, _ = sft_rows(SAMPLES, AutoTokenizer.from_pretrained(tiny_llama), params.max_length)
    fp32_trainer = sft_trainer(rows, str(tiny_llama), str(tmp_path / "a"), params)
    assert fp32_trainer.args.bf16 is False and fp32_trainer.accelerator.mixed_precision == "no"
    trainer = sft_trainer(rows, str(tiny_llama), str(tmp_path / "b"), params, dtype="bfloat16")
    assert trainer.args.bf16 is True and trainer.args.use_cpu is True
    assert trainer.accelerator.mixed_precision == "bf16"             # the forward runs under CPU bf16 autocast
    # the master weights stay fp32: an lr-sized step must not round away
    assert all(t.dtype == torch.float32 for t in trainer.model.parameters() if t.requires_grad)

    fp32 = train_sft(SAMPLES, str(tiny_llama), str(tmp_path / "c32"), params)
    default = train_sft(SAMPLES, str(tiny_llama), str(tmp_path / "cdef"), params, dtype="float32")
    bf16 = train_sft(SAMPLES, str(tiny_llama), str(tmp_path / "c16"), params, dtype="bfloat16")
    assert fp32.extra["fingerprint"] == default.extra["fingerprint"] != bf16.extra["fingerprint"]
    losses = [h["loss"] for h in bf16.log_history if "loss" in h]
    assert bf16.global_step == 2 and len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    # bf16 computes something else than fp32, but the same thing within bf16's precision
    first32 = next(h["loss"] for h in fp32.log_history if "loss" in h)
    assert losses[0] == pytest.approx(first32, rel=0.05)


def test_a_ppo_update_runs_in_bf16_on_the_cpu_over_fp32_adapters(tiny_llama):
    from types import SimpleNamespace

    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.batch import Sample
    from ragteam.train.joint.actor_critic import _build_actor_critic, make_optimizer, start_logp
    from ragteam.train.joint.update import _update
    from ragteam.systems.mask import mask_system

    from tests.test_train_ppo import PPO

    p = PPOParams(**{**PPO, "lora": {"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1}})
    torch.manual_seed(0)
    ac = _build_actor_critic(str(tiny_llama), p, "cpu", torch.bfloat16)
    trainable = {n: t for n, t in ac.named_parameters() if t.requires_grad}
    frozen = [t for t in ac.policy.parameters() if not t.requires_grad]
    assert trainable and all(t.dtype == torch.float32 for t in trainable.values())      # adapters + value head
    assert frozen and all(t.dtype == torch.bfloat16 for t in frozen)                    # the base computes in bf16
    assert ac.split == 1          # the frozen bottom layer's output is still reused: the split is exact in bf16
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in trainable.values():
            t.copy_(torch.randn(t.shape, generator=g) * 0.1)
    before = {n: t.detach().clone() for n, t in trainable.items()}
    samples = []
    for i, (lp, lr) in enumerate([(5, 3), (9, 2), (4, 6), (7, 4)]):
        ids = torch.randint(5, 200, (lp + lr,), generator=g).tolist()
        samples.append(Sample(i // 2, i % 2, "r", ids[:lp], ids[lp:], float(i % 3) - 1.0))
    system = mask_system({"mask": {"max_turns": 1, "top_k": 1, "passage_words": 8, "format_penalty": 1.0}}, None)
    accel = SimpleNamespace(backward=lambda loss: loss.backward(), clip_grad_norm_=torch.nn.utils.clip_grad_norm_)
    stats = _update(system, p, samples, [], ac, ac, make_optimizer(ac, p), accel,
                    lambda batch, hidden=None: start_logp(ac, None, p, batch, hidden), 0, "cpu", 0, None)
    assert all(math.isfinite(v) for vals in stats.values() for v in vals)
    assert any(not torch.equal(before[n], t) for n, t in trainable.items() if not n.startswith("value_head"))


def test_a_lora_policy_over_a_bf16_base_is_saved_merged_into_the_fp32_base(tiny_llama, tmp_path):
    """The saved agent of a bf16 run is the fp32 checkpoint + ΔW, bit for bit what an fp32 run with the same
    adapters saves; merged in bf16 the small ΔW would round away."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from ragteam.train.checkpoints import unwrap_model

    cfg = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(0)
    fp32 = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32), LoraConfig(**cfg))
    with torch.no_grad():       # a step-sized ΔW, far below bf16's resolution at the weights' scale
        for n, t in fp32.named_parameters():
            if "lora_B" in n:
                t.mul_(1e-3)
    bf16 = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16), LoraConfig(**cfg))
    set_peft_model_state_dict(bf16, get_peft_model_state_dict(fp32))
    assert all(t.dtype == torch.bfloat16 for t in bf16.parameters() if not t.requires_grad)

    want = unwrap_model(fp32).state_dict()
    got = unwrap_model(bf16).state_dict()
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == torch.float32 and torch.equal(got[k], want[k]), k
    base = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).state_dict()
    q = next(k for k in want if k.endswith("q_proj.weight"))
    assert not torch.equal(want[q], base[q])                                     # ΔW is in the saved weights


def test_the_engine_benchmark_names_bf16_engines_apart():
    from benchmarks.engines import _llm
    from ragteam.config import load_params
    from pathlib import Path

    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    assert params["llm"]["dtype"] == "float32"
    hf, vllm, vllm16, hf16 = (_llm(params, e) for e in ("hf", "vllm", "vllm_bf16", "hf_bf16"))
    assert (hf.backend, hf.dtype) == ("hf", "float32") and (vllm.backend, vllm.dtype) == ("vllm", "float32")
    assert (vllm16.backend, vllm16.dtype) == ("vllm", "bfloat16") and (hf16.backend, hf16.dtype) == ("hf", "bfloat16")
    with pytest.raises(SystemExit):
        from benchmarks.engines import main
        main(["--only", "joint_rollout", "--engines", "hf", "hf_bf16"])


def test_shared_prefix_grpo_trains_lora_over_a_bf16_base_and_saves_fp32(tiny_llama, tmp_path):
    from ragteam.llm import EngineConfig
    from ragteam.rewards.maps import AnswerReward
    from ragteam.train.checkpoints import save_agent
    from ragteam.train.grpo import GRPOParams, answer_reward_func
    from ragteam.train.grpo_prefix import train_grpo_shared_prefix

    samples = [{"id": f"q{i}", "golden_answers": [a], "prompt": [{"role": "user", "content": f"{d}\nQuestion: {q}"}]}
               for i, (d, q, a) in enumerate([("Paris is the capital of France.", "Capital of France?", "Paris"),
                                              ("Lima is the capital of Peru.", "Capital of Peru?", "Lima")])]
    lora = {"enabled": True, "rank": 2, "alpha": 4, "top_layers": 1}
    params = GRPOParams(steps=1, prompts_per_step=1, num_generations=4, micro_batch_size=4, lr=1e-2,
                        max_completion_length=4, save_steps=1, trainer="shared_prefix", lora=lora)
    reward = answer_reward_func(AnswerReward("stage2", 0.5, 2, 1))
    runs = {dt: train_grpo_shared_prefix(samples, str(tiny_llama), str(tmp_path / dt), params, reward,
                                         engine_cfg=EngineConfig(dtype=dt, threads=1))
            for dt in ("float32", "bfloat16")}
    no_cfg = train_grpo_shared_prefix(samples, str(tiny_llama), str(tmp_path / "none"), params, reward)
    assert runs["float32"].extra["fingerprint"] == no_cfg.extra["fingerprint"] != runs["bfloat16"].extra["fingerprint"]
    frozen = [t for t in runs["bfloat16"].model.parameters() if not t.requires_grad]
    assert frozen and all(t.dtype == torch.bfloat16 for t in frozen)
    assert all(t.dtype == torch.float32 for t in runs["float32"].model.parameters())
    assert all(math.isfinite(h["loss"]) for h in runs["bfloat16"].log_history if "loss" in h)
    # full fine-tuning keeps fp32 weights whatever the engine dtype (bf16 would round its small steps away)
    full = train_grpo_shared_prefix(samples, str(tiny_llama), str(tmp_path / "full"),
                                    params.model_copy(update={"lora": params.lora.model_copy(update={"enabled": False})}),
                                    reward, engine_cfg=EngineConfig(dtype="bfloat16", threads=1))
    assert all(t.dtype == torch.float32 for t in full.model.parameters())
    from safetensors.torch import load_file

    out = save_agent(runs["bfloat16"], tmp_path / "agent")
    assert all(t.dtype == torch.float32 for t in load_file(str(out / "model.safetensors")).values())
