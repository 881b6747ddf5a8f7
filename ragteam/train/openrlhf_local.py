"""`openrlhf.runner: local`: the judge's SFT here, in .venv-openrlhf, one process (on the CPU through
scripts/openrlhf_cpu.py), and its checkpoint read back as the judge. The job files and the Ray path are in
`ragteam.train.openrlhf`."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

from ragteam.io import atomic_file
from ragteam.train.checkpoints import TrainResult
from ragteam.train.openrlhf import OpenRLHFJob, write_sft_dataset
from ragteam.train.sft import SFTParams, SFTSample

INPUT_KEY, LABEL_KEY, OUTPUT_KEY = "input", "label", "output"


OPENRLHF_VENV = ".venv-openrlhf"            # scripts/setup_openrlhf.sh (make setup-openrlhf)
LAUNCHER = "scripts/openrlhf_cpu.py"        # the CPU shims where CUDA is absent; runs the module unchanged on CUDA
SFT_LOG = "openrlhf_sft_log.jsonl"          # what the launcher records per optimiser step (RAGTEAM_OPENRLHF_LOG)


class OpenRLHFFailed(RuntimeError):
    """A local OpenRLHF run that could not start or exited non-zero: the message names the command, the exit
    status and the log's last lines."""


def openrlhf_python(project_dir: str | Path = ".") -> Path:
    """.venv-openrlhf's python under `project_dir`; a missing environment says how to build it."""
    py = Path(project_dir) / OPENRLHF_VENV / "bin" / "python"
    if not py.is_file():
        raise OpenRLHFFailed(f"{py} is missing: the OpenRLHF environment is built only when asked, "
                             f"run `make setup-openrlhf` (scripts/setup_openrlhf.sh)")
    return py


def openrlhf_versions(project_dir: str | Path = ".") -> dict[str, str]:
    """{package: version} of openrlhf, deepspeed, transformers and torch in .venv-openrlhf (from its dist-info
    directory names: nothing is imported), for the stage's record of the environment that trained."""
    out = {}
    for site in (Path(project_dir) / OPENRLHF_VENV).glob("lib/python3*/site-packages"):
        for info in site.glob("*.dist-info"):
            name, _, version = info.name[:-len(".dist-info")].partition("-")
            if name.lower() in ("openrlhf", "deepspeed", "transformers", "torch"):
                out[name.lower()] = version
    return dict(sorted(out.items()))


_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)\.")


def lora_target_names(model_path: str, lora) -> list[str]:
    """`--ds.lora.target_modules` for OpenRLHF: the projection names themselves, or, with `lora.top_layers`, the full
    module names of those projections in the top N decoder layers (what the TRL backend's `layers_to_transform`
    selects: peft matches a listed name exactly or as a dotted suffix). The names come from the model built on the
    meta device: no weights are read."""
    if lora.top_layers is None:
        return list(lora.target_modules)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_path)
    n = cfg.get_text_config().num_hidden_layers
    keep = set(range(max(n - lora.top_layers, 0), n))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    names = [name for name, _ in model.named_modules()
             if name.rsplit(".", 1)[-1] in lora.target_modules
             and (m := _LAYER_INDEX.search(name)) is not None and int(m.group(1)) in keep]
    if not names:
        raise ValueError(f"lora: no module named {lora.target_modules} in the top {lora.top_layers} layers of "
                         f"{model_path}")
    return names


def local_sft_command(*, python: str | Path, model_path: str, dataset: str, output_dir: str, ckpt_path: str,
                      params: SFTParams, lora_targets: Sequence[str] = ()) -> list[str]:
    """`python scripts/openrlhf_cpu.py openrlhf.cli.train_sft ...` for one process: the TRL judge's batch, lr,
    schedule (no warm-up) and Adam betas, ZeRO stage 0 and eager attention (one rank, no flash-attn), bf16
    parameters (OpenRLHF's SFT offers bf16 or fp16 only); LoRA on `lora_targets` (`lora_target_names`)."""
    if params.steps != -1:
        raise ValueError("OpenRLHF SFT runs whole epochs: set sft steps to -1 and use epochs")
    lora = params.lora
    return [
        str(python), LAUNCHER, "openrlhf.cli.train_sft",
        "--model.model_name_or_path", model_path,
        "--data.dataset", dataset, "--data.input_key", INPUT_KEY, "--data.output_key", OUTPUT_KEY,
        "--data.apply_chat_template", "--data.max_len", str(params.max_length),
        "--data.dataloader_num_workers", "0",
        "--train.batch_size", str(params.batch_size * params.grad_accum),
        "--train.micro_batch_size", str(params.batch_size),
        "--train.max_epochs", str(math.ceil(params.epochs)), "--train.seed", str(params.seed),
        "--adam.lr", str(params.lr), "--adam.betas", "0.9", "0.999",
        "--lr_scheduler", params.lr_scheduler, "--lr_warmup_ratio", "0",
        "--ds.zero_stage", "0", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "eager",
        "--ckpt.output_dir", output_dir, "--ckpt.path", ckpt_path, "--ckpt.save_steps", str(params.save_steps),
        "--ckpt.max_num", str(params.save_total_limit), "--ckpt.load_enable", "--logger.logging_steps", "1",
        *(["--model.gradient_checkpointing_enable"] if params.gradient_checkpointing else []),
        *(["--ds.lora.rank", str(lora.rank), "--ds.lora.alpha", str(lora.alpha), "--ds.lora.dropout",
           str(lora.dropout), "--ds.lora.target_modules", *lora_targets] if lora.enabled else []),
    ]


def prepare_local_sft_job(samples: Sequence[SFTSample | dict], job_dir: str | Path, *, model_path: str,
                          output_dir: str, params: SFTParams, project_dir: str | Path = ".") -> OpenRLHFJob:
    """Write `<job_dir>/sft.jsonl` and command.sh for a local run (`run_local_sft`); the LoRA targets are resolved
    against `model_path` here."""
    job_dir = Path(job_dir)
    dataset = job_dir / "sft.jsonl"
    write_sft_dataset(dataset, samples)
    targets = lora_target_names(model_path, params.lora) if params.lora.enabled else []
    python = Path(project_dir) / OPENRLHF_VENV / "bin" / "python"
    job = OpenRLHFJob(dataset=dataset, command=local_sft_command(
        python=python, model_path=model_path, dataset=str(dataset), output_dir=output_dir,
        ckpt_path=str(job_dir / "ckpt"), params=params, lora_targets=targets),
        runtime_env={}, project_dir=str(project_dir), output_dir=output_dir)
    with atomic_file(job_dir / "command.sh") as f:
        f.write("#!/bin/sh\n" + job.dry_run() + "\n")
    # OpenRLHF resumes from <job_dir>/ckpt (--ckpt.load_enable) after a kill: only a run of this very job may
    keep = job_dir / "ckpt" / "ragteam-job.json"
    fp = {"job": job.submission_id("local-sft")}
    if not keep.is_file() or json.loads(keep.read_text()) != fp:
        import shutil

        shutil.rmtree(job_dir / "ckpt", ignore_errors=True)
        (job_dir / SFT_LOG).unlink(missing_ok=True)
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.write_text(json.dumps(fp))
    return job


def run_local_sft(job: OpenRLHFJob, *, log=print, timeout: float | None = None,
                  env: dict[str, str] | None = None) -> tuple[list[dict], float]:
    """Run a local SFT job (`prepare_local_sft_job`) in `job.project_dir`, its output streamed to `log` and kept
    in <job dir>/train_sft.log; returns (the per-step log rows the launcher recorded, wall seconds). A failure
    raises OpenRLHFFailed naming the command, its exit status and the log's last lines."""
    import os
    import subprocess
    import time

    openrlhf_python(job.project_dir)
    job_dir = job.dataset.parent
    log_rows, out_log = job_dir / SFT_LOG, job_dir / "train_sft.log"   # rows survive a resume (same job only)
    run_env = {**os.environ, **(env or {}), "RAGTEAM_OPENRLHF_LOG": str(log_rows.resolve()),
               "PYTHONUNBUFFERED": "1"}
    run_env.pop("PYTHONPATH", None)       # the main environment's paths must not leak into .venv-openrlhf
    t0 = time.perf_counter()
    tail: list[str] = []
    with open(out_log, "w", encoding="utf-8") as keep:
        proc = subprocess.Popen(job.command, cwd=job.project_dir, env=run_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        try:
            for line in proc.stdout:
                keep.write(line)
                tail = (tail + [line.rstrip()])[-30:]
                if not line.startswith(("Map", "Filter", "Generating")) and "it/s]" not in line:
                    log(line.rstrip())
            rc = proc.wait(timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    seconds = time.perf_counter() - t0
    if rc != 0:
        shown = "\n".join(tail[-15:])
        raise OpenRLHFFailed(f"openrlhf.cli.train_sft exited {rc} after {seconds:.0f} s ({out_log}; command in "
                             f"{job_dir / 'command.sh'}); last lines:\n{shown}")
    by_step = {}     # a step logged before a kill and again after the resume: the later row
    for line in (log_rows.read_text().splitlines() if log_rows.is_file() else []):
        row = json.loads(line)
        by_step[row["step"]] = row
    rows = [by_step[k] for k in sorted(by_step)]
    if not rows:
        raise OpenRLHFFailed(f"openrlhf.cli.train_sft exited 0 but logged no optimiser step ({log_rows} is "
                             f"empty): no sample fit --data.max_len, or too few samples for one batch? ({out_log})")
    return rows, seconds


def sft_log_history(rows: Sequence[dict]) -> list[dict]:
    """The launcher's rows as a TRL-style log history (`ragteam.train.curves.curve_rows` reads it): loss = the
    step's token-mean loss (OpenRLHF's loss_mean over the step's micro-batches), lr, grad_norm, step_time."""
    return [{"step": r["step"], "loss": r.get("loss_mean", r.get("gpt_loss")), "learning_rate": r.get("lr"),
             "grad_norm": r.get("grad_norm"), "step_time": r.get("seconds")} for r in rows]


def load_local_sft(output_dir: str | Path, base_model: str, *, log_rows: Sequence[dict], seconds: float,
                   samples: int, dtype: str = "float32") -> TrainResult:
    """OpenRLHF's saved model as a `TrainResult`: a LoRA adapter (adapter_config.json) is merged into `base_model`
    loaded in `dtype` (float32 unless bfloat16), full weights are loaded as they are; the tokenizer is the one
    OpenRLHF saved with them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(output_dir)
    if not (out / "config.json").is_file() and not (out / "adapter_config.json").is_file():
        raise OpenRLHFFailed(f"{out}: OpenRLHF saved no model there (no config.json / adapter_config.json)")
    torch_dtype = torch.bfloat16 if dtype in ("bfloat16", "bf16") else torch.float32
    if (out / "adapter_config.json").is_file():
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch_dtype)
        model = PeftModel.from_pretrained(base, str(out)).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch_dtype)
    history = sft_log_history(log_rows)
    return TrainResult(model=model, tokenizer=AutoTokenizer.from_pretrained(str(out)), log_history=history,
                       global_step=int(history[-1]["step"]) if history else 0, seconds=seconds,
                       extra={"samples": samples})
