"""Resumable training runs: checkpoint fingerprints, resume from the last checkpoint, the final agent save.

A trainer writes `checkpoint-<step>/` dirs under a checkpoint dir that is NOT a DVC out (DVC deletes outs before a
stage runs). `fingerprint.json` there records what the checkpoints were trained on; a run with other params,
data or base model starts from scratch instead of resuming someone else's optimiser state.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragteam.io import atomic_dir, write_json
from ragteam.models import save_tokenizer
from ragteam.timing import timed

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a training run hands back: the trained model (LoRA merged), its tokenizer and the log history."""

    model: Any
    tokenizer: Any
    log_history: list[dict]
    global_step: int
    seconds: float
    resumed_from: int | None = None          # step of the checkpoint the run resumed from
    extra: dict[str, Any] = field(default_factory=dict)


class TrainingDiverged(ValueError):
    """Training cannot go on (a non-finite loss, or non-finite gradients step after step): it stops, and the last good
    checkpoint stays for a rerun to resume from."""


def diverged(name: str, what: str, ckpt_dir: str | Path | None) -> TrainingDiverged:
    """The error that stops a run, naming what went wrong and the checkpoint that is kept."""
    last = checkpoint_steps(ckpt_dir) if ckpt_dir is not None else []
    return TrainingDiverged(f"{name}: {what}; training stopped, the last good checkpoint "
                            f"{'checkpoint-' + str(last[-1]) if last else '(none yet)'} in {ckpt_dir} is kept")


TRAIN_INFO = "ragteam-train.json"  # written into each saved agent: the fingerprint of the run that made it


def fingerprint(**parts: Any) -> str:
    """sha256 of the JSON of `parts` (params, data rows, base model, reward): identifies a training run."""
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()


def model_identity(model_path: str | Path) -> Any:
    """What a base model *is*, cheaply: the fingerprint of the run that trained it, else the file hashes in the
    prepare_models manifest, else its path. A retrained stage-1 agent thus invalidates stage-2 checkpoints."""
    p = Path(model_path)
    if (p / TRAIN_INFO).exists():
        return json.loads((p / TRAIN_INFO).read_text())["fingerprint"]
    from ragteam.models import read_manifest

    return read_manifest(p).get("files") or str(model_path)


def checkpoint_steps(ckpt_dir: str | Path) -> list[int]:
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    steps = []
    for p in ckpt_dir.glob("checkpoint-*"):
        # a checkpoint is complete once trainer_state.json is written (HF writes it last)
        if p.name.split("-", 1)[1].isdigit() and (p / "trainer_state.json").exists():
            steps.append(int(p.name.split("-", 1)[1]))
    return sorted(steps)


BROKEN_PREFIX = ".broken-"   # a checkpoint that does not load is moved aside to .broken-checkpoint-<step>


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """Flush every file under `root`, then the directories (deepest first), to disk: a rename that publishes the
    tree afterwards cannot outlive its contents in a crash (a renamed dir of empty or truncated files)."""
    root = Path(root)
    dirs = [root]
    for p in sorted(root.rglob("*")):
        if p.is_dir():
            dirs.append(p)
        elif p.is_file():
            _fsync(p)
    for d in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        _fsync(d)


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path.name}: {size} bytes, shorter than a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"{path.name}: its header claims {n} bytes, the file has {size}"
        try:
            meta = json.loads(f.read(n))
        except ValueError as e:
            return f"{path.name}: unreadable safetensors header ({e})"
    end = max((int(v["data_offsets"][1]) for k, v in meta.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        return f"{path.name}: {size} bytes where its header describes {8 + n + end} (truncated or overwritten)"
    return None


def _torch_file_problem(path: Path) -> str | None:
    """A torch.save file (a zip archive since torch 1.6; HF's optimizer.pt, scheduler.pt, rng_state.pth too)."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"{path.name}: member {info.filename} runs past the end of the file ({size} bytes)"
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        return f"{path.name}: not a complete torch.save archive ({size} bytes: {e})"
    return None


def checkpoint_problem(path: str | Path) -> str | None:
    """Why checkpoint dir `path` would not load, or None. Checks what a crash or a full disk leaves behind, without
    loading tensors: trainer_state.json parses, each safetensors file is as long as its header says, each torch
    file (.pt/.pth/.bin) is a complete zip archive."""
    path = Path(path)
    try:
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"trainer_state.json: {type(e).__name__}: {e}"
    for p in sorted(path.iterdir()):
        if not p.is_file():
            continue
        try:
            why = (_safetensors_problem(p) if p.suffix == ".safetensors"
                   else _torch_file_problem(p) if p.suffix in (".pt", ".pth", ".bin") else None)
        except OSError as e:
            why = f"{p.name}: {e}"
        if why:
            return why
    return None


def prepare_resume(ckpt_dir: str | Path, fp: str) -> str | None:
    """Return the newest checkpoint that loads, or None; stale checkpoints (other fingerprint) are wiped. A newer
    checkpoint that would not load (`checkpoint_problem`: truncated by a crash or a full disk) is logged and moved
    aside to `.broken-checkpoint-<step>`, so the run resumes from the one before it and saves that step again."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    fp_file = ckpt_dir / "fingerprint.json"
    old = json.loads(fp_file.read_text())["fingerprint"] if fp_file.exists() else None
    if old != fp:
        stale = [p for p in ckpt_dir.glob("checkpoint-*")]
        if stale:
            log.warning("%s: %d checkpoint(s) from another run (params/data/model changed); starting over",
                        ckpt_dir, len(stale))
        for p in [*stale, *ckpt_dir.glob(BROKEN_PREFIX + "checkpoint-*")]:
            shutil.rmtree(p)
        write_json(fp_file, {"fingerprint": fp, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
        return None
    for step in reversed(checkpoint_steps(ckpt_dir)):
        path = ckpt_dir / f"checkpoint-{step}"
        why = checkpoint_problem(path)
        if why is None:
            return str(path)
        aside = ckpt_dir / f"{BROKEN_PREFIX}checkpoint-{step}"
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
        log.warning("%s: checkpoint-%d does not load (%s); skipped, moved aside to %s; resuming from an earlier "
                    "checkpoint", ckpt_dir, step, why, aside.name)
    return None


def save_train_state(ckpt_dir: str | Path, step: int, trainable: dict, opt, sched, history: list[dict],
                     keep: int, device=None) -> None:
    """A checkpoint of a hand-written trainer (shared-prefix GRPO, the joint loop): trainable tensors, optimiser,
    scheduler and RNG states in `checkpoint-<step>/state.pt`, the log history in `trainer_state.json` (written last:
    the completeness marker). Written to a temp dir, fsynced, renamed (the directory fsynced too); only the last
    `keep` checkpoints stay."""
    import random

    import torch

    ckpt_dir = Path(ckpt_dir)
    d, tmp = ckpt_dir / f"checkpoint-{step}", ckpt_dir / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cuda = {"cuda_rng": torch.cuda.get_rng_state(device)} if device is not None and device.type == "cuda" else {}
    torch.save({"trainable": trainable, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "torch_rng": torch.get_rng_state(), "py_rng": random.getstate(), **cuda}, tmp / "state.pt")
    write_json(tmp / "trainer_state.json", {"global_step": step, "log_history": history})
    fsync_tree(tmp)                 # the contents reach the disk before the rename publishes them
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    _fsync(ckpt_dir)                # and the rename itself
    for old in checkpoint_steps(ckpt_dir)[:-keep]:
        shutil.rmtree(ckpt_dir / f"checkpoint-{old}", ignore_errors=True)


def load_train_state(path: str | Path, named_params: dict, opt, sched, device=None) -> tuple[int, list[dict]]:
    """Restore a `save_train_state` checkpoint into `named_params` (name -> parameter), the optimiser, the scheduler
    and the RNGs; returns (global step, log history). Loads with `weights_only=True`: tensors and plain containers,
    no code."""
    import random

    import torch

    path = Path(path)
    state = torch.load(path / "state.pt", weights_only=True, map_location=device)
    with torch.no_grad():
        for n, t in state["trainable"].items():
            named_params[n].copy_(t)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"].cpu())
    if "cuda_rng" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device)
    random.setstate(state["py_rng"])
    meta = json.loads((path / "trainer_state.json").read_text())
    return int(meta["global_step"]), list(meta["log_history"])


def step_timer():
    """A transformers TrainerCallback that adds `step_time` (seconds) to each step's log_history entry.

    The history is saved in every checkpoint (trainer_state.json), so the training time of a run survives a
    resume (the shared-prefix trainer logs `step_time` itself).
    """
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.t0, self.last = None, None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.last = time.perf_counter() - self.t0 if self.t0 is not None else None

        def on_log(self, args, state, control, logs=None, **kw):
            entry = state.log_history[-1] if state.log_history else None
            if entry is not None and self.last is not None and "train_runtime" not in entry:
                entry["step_time"] = self.last
                self.last = None

    return StepTimer()


@timed("training")
def run_resumable(trainer: Any, resume_from: str | None) -> tuple[list[dict], int, float]:
    """trainer.train() from `resume_from` (or scratch); returns (log_history, global_step, seconds).

    A checkpoint at the trainer's `max_steps` is a finished run: its weights are loaded and nothing more is trained
    (seconds 0). transformers' Trainer, resumed there, trains one step past `max_steps` (it checks the cap after a
    step, not before), so a stage rerun after its last save (a crash while writing its outputs, or a DVC stage rerun
    whose checkpoints survive) would give another model than the run it resumes."""
    max_steps = int(getattr(trainer.args, "max_steps", 0) or 0)
    if resume_from and max_steps > 0:
        state = json.loads((Path(resume_from) / "trainer_state.json").read_text(encoding="utf-8"))
        if int(state["global_step"]) >= max_steps:
            load_checkpoint(trainer.model, resume_from)
            return list(state["log_history"]), int(state["global_step"]), 0.0
    t0 = time.perf_counter()
    trainer.add_callback(step_timer())
    trainer.train(resume_from_checkpoint=resume_from)
    return list(trainer.state.log_history), int(trainer.state.global_step), time.perf_counter() - t0


def load_checkpoint(model, checkpoint: str | Path) -> None:
    """The weights a trainer saved in `checkpoint` into `model` (its LoRA adapter, or the whole model)."""
    from safetensors.torch import load_file

    ckpt = Path(checkpoint)
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(ckpt / "adapter_model.safetensors"))
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{ckpt}: adapter weights that the model lacks: {result.unexpected_keys[:3]}")
    else:
        # a tied output layer is saved once, as the input embeddings: the only key the checkpoint may lack
        result = model.load_state_dict(load_file(ckpt / "model.safetensors"), strict=False)
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        missing = [k for k in result.missing_keys if k not in tied]
        if result.unexpected_keys or missing:
            raise ValueError(f"{ckpt}: weights that do not fit the model: unexpected {result.unexpected_keys[:3]}, "
                             f"missing {missing[:3]}")


def unwrap_model(model: Any) -> Any:
    """A plain transformers model: LoRA adapters merged into the weights (so the agent loads without peft).

    A LoRA policy trained over a bf16 copy of its base (`llm.dtype: bfloat16`) is merged into the base's float32
    weights, read again from the checkpoint peft names: merged in bf16, W + ΔW would lose the small ΔW to rounding
    (and the base its own precision), and the saved agent is float32 like every other."""
    if not hasattr(model, "merge_and_unload"):
        return model
    import torch

    frozen = [t for t in model.parameters() if not t.requires_grad]
    # on the CPU only: a CUDA run (the paper profile's 8B model) keeps merging in its own dtype, as before, rather
    # than load a second, fp32 copy of its base
    if frozen and frozen[0].device.type == "cpu" and any(t.dtype != torch.float32 for t in frozen):
        model = _over_fp32_base(model)
    return model.merge_and_unload()


def _over_fp32_base(model: Any) -> Any:
    """The peft `model`'s adapters (float32) on a float32 copy of its base checkpoint."""
    import torch
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    if list(model.peft_config) != ["default"]:
        raise RuntimeError(f"merging LoRA over a float32 base: one adapter named 'default' expected, got "
                           f"{list(model.peft_config)}")
    config = model.peft_config["default"]
    path = config.base_model_name_or_path
    if not path or not Path(path).is_dir():
        raise RuntimeError(f"merging LoRA over a float32 base: the base checkpoint {path!r} that peft names is not a "
                           "directory here (the trainer loads its base from a local directory)")
    fresh = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), config)
    state = {k: v.float() for k, v in get_peft_model_state_dict(model).items()}
    result = set_peft_model_state_dict(fresh, state)
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if getattr(result, "unexpected_keys", None) or missing:
        raise RuntimeError(f"merging LoRA over the float32 base {path}: adapter keys unexpected "
                           f"{list(getattr(result, 'unexpected_keys', []))[:3]}, missing {missing[:3]}")
    return fresh


def save_agent(result: TrainResult, out_dir: str | Path, card: str | None = None) -> Path:
    """save_pretrained (safetensors) + tokenizer (+ README.md model card), atomically: all or nothing.

    Everything written describes the weights, not a session (no wall time: that goes to the stage's metrics),
    so training or re-saving the same model gives the same bytes and DVC sees an unchanged output.
    """
    with atomic_dir(out_dir) as tmp:
        model = unwrap_model(result.model)
        model.save_pretrained(tmp, safe_serialization=True)
        save_tokenizer(result.tokenizer, tmp)
        write_json(tmp / TRAIN_INFO, {"fingerprint": result.extra.get("fingerprint"),
                                      "global_step": result.global_step})
        if card is not None:
            (tmp / "README.md").write_text(card, encoding="utf-8")
    return Path(out_dir)
