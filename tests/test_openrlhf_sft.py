"""OpenRLHF executes: `openrlhf.cli.train_sft` 0.11.2 runs for real in .venv-openrlhf (DeepSpeed 0.19.6, on the CPU
through scripts/openrlhf_cpu.py) on a tiny random Llama with SmolLM2's tokenizer, and its checkpoint is read back as
the judge and scored by the evaluation's own judge scorer. Needs `make setup-openrlhf` (`make test` builds it); under
CI a missing environment fails the test instead of skipping it."""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from conftest import require_openrlhf_env

from ragteam.agents import maps
from ragteam.eval.agents import judge_scores
from ragteam.train.common import LoraParams
from ragteam.train.openrlhf_local import (
    LAUNCHER,
    OPENRLHF_VENV,
    SFT_LOG,
    OpenRLHFFailed,
    load_local_sft,
    lora_target_names,
    prepare_local_sft_job,
    run_local_sft,
)
from ragteam.train.sft import SFTParams, SFTSample

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / OPENRLHF_VENV / "bin" / "python"


def _need_env():
    require_openrlhf_env()


def _judge_samples(n: int) -> list[SFTSample]:
    """Judge prompts in the pipeline's format; the pool holds the answer ("Paris") exactly for Sufficient rows."""
    out = []
    for i in range(n):
        ok = i % 2 == 0
        pool = (f"Doc 1(Title: \"City {i}\"): The capital is Paris." if ok else
                f"Doc 1(Title: \"City {i}\"): No capital is named here.")
        out.append(SFTSample(id=f"j{i}", prompt=maps.judge_messages(f"What is the capital of country {i}?", pool),
                             completion=maps.SUFFICIENT if ok else maps.INSUFFICIENT))
    return out


def test_lora_top_layers_become_the_full_names_of_the_top_layers_projections(tiny_llama):
    names = lora_target_names(str(tiny_llama), LoraParams(enabled=True, top_layers=1))
    assert names and all(".layers.1." in n for n in names)   # 2 layers: only the top one
    assert {n.rsplit(".", 1)[-1] for n in names} == set(LoraParams().target_modules)
    assert lora_target_names(str(tiny_llama), LoraParams(enabled=True)) == LoraParams().target_modules


def test_a_missing_environment_is_named(tmp_path):
    job = prepare_local_sft_job(_judge_samples(4), tmp_path / "job", model_path="/m", output_dir=str(tmp_path / "o"),
                                params=SFTParams(batch_size=2, lr=1e-3, max_length=64, save_steps=5),
                                project_dir=tmp_path)
    with pytest.raises(OpenRLHFFailed, match=r"\.venv-openrlhf/bin/python is missing.*make setup-openrlhf"):
        run_local_sft(job)


@pytest.mark.slow
def test_the_cpu_shims_apply_only_without_cuda_and_leave_a_gpu_alone():
    _need_env()
    code = ("import sys, importlib; sys.path.insert(0, 'scripts'); import openrlhf_cpu, torch;"
            "openrlhf_cpu.install();"
            "import flash_attn.bert_padding as b; x = torch.arange(6.).reshape(1, 3, 2);"
            "m = torch.tensor([[1, 1, 0]]); u, idx, cu, mx, _ = b.unpad_input(x, m);"
            "assert u.shape == (2, 2) and cu.tolist() == [0, 2] and mx == 2;"
            "assert torch.equal(b.pad_input(u, idx, 1, 3)[0, :2], x[0, :2]);"
            "assert torch.cuda.current_device() == 'cpu';"
            "assert importlib.import_module('deepspeed.comm.torch').build_shm_op() is None;"
            "print('|'.join(openrlhf_cpu.APPLIED))")
    done = subprocess.run([str(PYTHON), "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "flash_attn stand-in" in done.stdout and "torch.optim.AdamW" in done.stdout
    # with CUDA "available" nothing is patched
    fake = ("import torch; torch.cuda.is_available = lambda: True; import sys; sys.path.insert(0, 'scripts');"
            "import openrlhf_cpu; assert openrlhf_cpu.install() == [] and 'flash_attn' not in sys.modules;"
            "assert torch.cuda.set_device.__module__ != 'openrlhf_cpu'; print('untouched')")
    done = subprocess.run([str(PYTHON), "-c", fake], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "untouched" in done.stdout, done.stderr[-3000:]


def _generate(result, prompts) -> list[str]:
    import torch

    tok, model = result.tokenizer, result.model.eval()
    texts = []
    for p in prompts:
        ids = tok.apply_chat_template(p, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        texts.append(tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    return texts


def test_openrlhf_train_sft_runs_and_its_checkpoint_is_the_judge(tiny_llama, tmp_path):
    """The real thing: 16 labelled judge prompts, 16 epochs of 4 steps, full fine-tuning, DeepSpeed ZeRO 0 in bf16;
    the model read back answers every prompt with one of the two labels, as the evaluation parses them."""
    _need_env()
    samples = _judge_samples(16)
    params = SFTParams(epochs=16, batch_size=4, lr=2e-2, lr_scheduler="constant", max_length=512, save_steps=100)
    out = tmp_path / "openrlhf_model"
    job = prepare_local_sft_job(samples, tmp_path / "job", model_path=str(tiny_llama), output_dir=str(out),
                                params=params, project_dir=REPO)
    assert job.command[:3] == [str(REPO / OPENRLHF_VENV / "bin" / "python"), LAUNCHER, "openrlhf.cli.train_sft"]
    lines: list[str] = []
    rows, seconds = run_local_sft(job, log=lines.append, timeout=280)

    assert any("openrlhf_cpu: openrlhf.cli.train_sft on CPU" in s for s in lines)
    assert not (REPO / ".torch_extensions").exists()        # DeepSpeed compiled nothing
    assert [r["step"] for r in rows] == list(range(1, 65))  # 16 samples / 4 per step x 16 epochs
    losses = [r["loss_mean"] for r in rows]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4, losses   # it learned the labels' tokens
    assert (out / "config.json").is_file() and (tmp_path / "job" / SFT_LOG).is_file()

    result = load_local_sft(out, str(tiny_llama), log_rows=rows, seconds=seconds, samples=len(samples))
    assert result.global_step == 64 and [h["step"] for h in result.log_history] == list(range(1, 65))
    assert result.log_history[0]["loss"] == losses[0] and result.log_history[0]["step_time"] > 0
    texts = _generate(result, [s.prompt for s in samples[:8]])
    scores = judge_scores(texts, [s.completion == maps.SUFFICIENT for s in samples[:8]])
    assert scores["malformed"] == 0.0, texts       # every verdict is one of the two labels
    print(json.dumps({"seconds": round(seconds, 1), "loss_first": losses[0], "loss_last": losses[-1], **scores}))


def test_openrlhf_lora_on_the_top_layers_is_merged_back(tiny_llama, tmp_path):
    """The stage's default shape (LoRA on the top layers): OpenRLHF saves only the adapter, on the layers asked for,
    and `load_local_sft` merges it into the base model; the merged weights differ from the base there only."""
    _need_env()
    import torch
    from transformers import AutoModelForCausalLM

    params = SFTParams(epochs=1, batch_size=4, lr=5e-2, lr_scheduler="constant", max_length=512, save_steps=100,
                       lora=LoraParams(enabled=True, rank=4, alpha=8, top_layers=1))
    out = tmp_path / "openrlhf_model"
    job = prepare_local_sft_job(_judge_samples(8), tmp_path / "job", model_path=str(tiny_llama),
                                output_dir=str(out), params=params, project_dir=REPO)
    assert job.command[job.command.index("--ds.lora.target_modules") + 1] == "model.layers.1.self_attn.q_proj"
    rows, seconds = run_local_sft(job, log=lambda _: None, timeout=280)
    assert [r["step"] for r in rows] == [1, 2]
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == sorted(lora_target_names(str(tiny_llama), params.lora))
    result = load_local_sft(out, str(tiny_llama), log_rows=rows, seconds=seconds, samples=8)
    assert not [n for n, _ in result.model.named_modules() if "lora" in n.lower()]
    base = AutoModelForCausalLM.from_pretrained(tiny_llama).state_dict()
    merged = result.model.state_dict()
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(".layers.1." in k for k in changed), sorted(changed)


def test_train_judge_stage_with_the_local_runner_writes_its_job_and_a_dry_run_stops(smollm2_dir, tmp_path,
                                                                                  monkeypatch):
    """`train_judge.backend: openrlhf` + `openrlhf.runner: local`: the stage writes jobs/openrlhf/train_judge/ (the
    SFT rows and the launcher command, LoRA on the top layers' projections by name); dry_run true stops before
    training."""
    from ragteam.io import DataError, write_jsonl
    from ragteam.llm import LLMConfig
    from stages import train_judge
    from stages.common import OpenRLHFParams, TrainJudgeParams

    monkeypatch.chdir(tmp_path)
    rows = [{"id": s.id, "label": s.completion, "messages": [*s.prompt, {"role": "assistant", "content": s.completion}]}
            for s in _judge_samples(6)[:5]]   # 3 Sufficient, 2 Insufficient: oversampling adds one
    write_jsonl(tmp_path / "data/judge/t3_judge.jsonl", rows)
    tp = TrainJudgeParams(backend="openrlhf", balance="oversample",
                          sft=SFTParams(batch_size=2, lr=5e-4, max_length=512, save_steps=10,
                                        lora=LoraParams(enabled=True, top_layers=2)))
    orl = OpenRLHFParams(project_dir="/unused", runner="local")
    with pytest.raises(DataError, match="openrlhf.dry_run is true: the local job is in jobs/openrlhf/train_judge"):
        train_judge.run(tp, LLMConfig(model=str(smollm2_dir)), orl)
    cmd = (tmp_path / "jobs/openrlhf/train_judge/command.sh").read_text().splitlines()[1]
    assert cmd.startswith(f"{OPENRLHF_VENV}/bin/python {LAUNCHER} openrlhf.cli.train_sft ")
    assert "--ckpt.output_dir checkpoints/train_judge/openrlhf_model" in cmd and "--ds.zero_stage 0" in cmd
    targets = cmd.split("--ds.lora.target_modules ", 1)[1].split()
    assert len(targets) == 2 * 7 and all(t.startswith(("model.layers.28.", "model.layers.29.")) for t in targets)
    data = [json.loads(line) for line in (tmp_path / "jobs/openrlhf/train_judge/sft.jsonl").read_text().splitlines()]
    assert len(data) == 6 and {d["output"][0]["content"] for d in data} == {maps.SUFFICIENT, maps.INSUFFICIENT}
    assert not (tmp_path / "models/agents/judge").exists()
