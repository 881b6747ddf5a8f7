"""Issue 71, finding 5: a truncated newest checkpoint failed every resume with OSError although the one before it
was intact, and checkpoints were renamed into place without an fsync. Resume now falls back to the newest checkpoint
that loads (naming the one it skipped and why), and a checkpoint's files and directories are flushed around the
rename."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from ragteam.train import checkpoints as C


def _train_state(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched


def _step(model, opt, sched):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    sched.step()


def _two_checkpoints(ckpt: Path):
    assert C.prepare_resume(ckpt, "fp") is None
    model, opt, sched = _train_state(0)
    weights = {}
    for step in (1, 2):
        _step(model, opt, sched)
        weights[step] = {n: t.detach().clone() for n, t in model.named_parameters()}
        C.save_train_state(ckpt, step, dict(model.named_parameters()), opt, sched, [{"step": step}], keep=3)
    return weights


def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    weights = _two_checkpoints(ckpt)
    state = ckpt / "checkpoint-2" / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])     # a crash / full disk mid-write
    with caplog.at_level(logging.WARNING, logger=C.__name__):
        resume = C.prepare_resume(ckpt, "fp")
    assert resume == str(ckpt / "checkpoint-1")
    assert "checkpoint-2 does not load (state.pt" in caplog.text and "skipped" in caplog.text
    assert C.checkpoint_steps(ckpt) == [1]              # what a trainer reading the dir directly sees (ppo)
    assert (ckpt / ".broken-checkpoint-2" / "state.pt").exists()   # kept aside for a look, out of the way
    model, opt, sched = _train_state(1)
    step, history = C.load_train_state(resume, dict(model.named_parameters()), opt, sched)
    assert (step, history) == (1, [{"step": 1}])
    for n, t in model.named_parameters():
        assert torch.equal(t, weights[1][n])
    # a fingerprint change wipes the broken one too
    assert C.prepare_resume(ckpt, "other") is None and not list(ckpt.glob("*checkpoint-*"))


def test_a_truncated_trainer_weight_file_is_skipped_too(tmp_path, caplog):
    """transformers' Trainer checkpoints: model.safetensors shorter than its header says."""
    from safetensors.torch import save_file

    ckpt = tmp_path / "ckpt"
    assert C.prepare_resume(ckpt, "fp") is None
    for step in (1, 2):
        d = ckpt / f"checkpoint-{step}"
        d.mkdir()
        save_file({"w": torch.full((64, 64), float(step))}, str(d / "model.safetensors"))
        torch.save({"lr": 0.1}, d / "optimizer.pt")
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    assert C.prepare_resume(ckpt, "fp") == str(ckpt / "checkpoint-2")       # both intact: the newest
    w = ckpt / "checkpoint-2" / "model.safetensors"
    os.truncate(w, w.stat().st_size - 100)
    with caplog.at_level(logging.WARNING, logger=C.__name__):
        assert C.prepare_resume(ckpt, "fp") == str(ckpt / "checkpoint-1")
    assert "checkpoint-2 does not load (model.safetensors" in caplog.text
    os.truncate(ckpt / "checkpoint-1" / "optimizer.pt", 10)
    assert C.prepare_resume(ckpt, "fp") is None                              # none loads: from scratch


def test_a_checkpoint_is_flushed_to_disk_before_and_after_its_rename(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    model, opt, sched = _train_state(0)
    C.prepare_resume(ckpt, "fp")
    _step(model, opt, sched)
    synced.clear()
    C.save_train_state(ckpt, 1, dict(model.named_parameters()), opt, sched, [], keep=2)
    tmp = str(ckpt / ".checkpoint-1.tmp")
    assert tmp + "/state.pt" in synced and tmp + "/trainer_state.json" in synced
    assert synced.index(tmp) > synced.index(tmp + "/state.pt")            # the files, then their directory
    assert synced[-1] == str(ckpt)                                         # the rename, last
