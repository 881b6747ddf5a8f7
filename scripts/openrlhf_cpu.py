"""Run an OpenRLHF entry point in .venv-openrlhf; where CUDA is absent, first make OpenRLHF 0.11.2 and DeepSpeed
0.19.6 run on the CPU (../shared/notes/stack.md section 12).

    .venv-openrlhf/bin/python scripts/openrlhf_cpu.py openrlhf.cli.train_sft --model.model_name_or_path ... [flags]

With a CUDA device (`torch.cuda.is_available()`) no shim is applied: the module runs as under `deepspeed --module`
(the one exception is asked for by name: RAGTEAM_FLASH_ATTN_STANDIN=1 on a GPU machine without flash-attn installed
gives it shim 1 alone, for eager / sdpa attention; scripts/gpu_check.sh sets it).
Without one, `install()` applies three shims before OpenRLHF is imported, and nothing else:

1. `flash_attn` stand-in. `openrlhf/models/ring_attn_utils.py:3-4` imports `flash_attn.bert_padding` and
   `flash_attn.utils.distributed.all_gather` at module level (flash-attn is a CUDA source build). The stand-in holds
   pure-torch versions of those five names (flash-attn 2.8.3's semantics); they are used only by packed samples /
   ring attention, which the CPU path (eager attention, no packing) does not take.
2. Harmless CUDA calls: `torch.cuda.set_device`, `synchronize`, `empty_cache` do nothing; `current_device()` is
   "cpu"; `Tensor.cuda` / `Module.cuda` return the object unchanged (on the CPU); `init_device_mesh("cuda", ...)`
   builds a "cpu" mesh.
3. No DeepSpeed run-time C++ builds (about 7 of the 8-10 minutes a run took with them):
   `deepspeed.comm.torch.build_shm_op` returns None (the gloo backend's shared-memory comm op, only a speed-up for
   several ranks on one host), and every DeepSpeed optimiser is `torch.optim.AdamW` (DeepSpeed's own `torch_adam`
   switch, instead of the CPU FusedAdam that would be compiled; AdamW's update is the same as FusedAdam's
   adam_w_mode).

On either device, RAGTEAM_OPENRLHF_LOG=<file.jsonl> records what SFT logs (OpenRLHF's logs_dict: gpt_loss, lr,
grad_norm, loss_mean) with the optimiser step and its wall time, one JSON line per step, for the stage's curves
(OpenRLHF itself logs only to wandb or TensorBoard, neither installed); it observes and changes nothing.

Single process: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT are set here when absent (a free port),
`DS_ACCELERATOR=cpu` (DeepSpeed then picks gloo), and TORCH_EXTENSIONS_DIR points into the workspace should a build
still be attempted. The script imports nothing of this project: it is no DVC dependency of any stage.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import runpy
import socket
import sys
import types

APPLIED: list[str] = []     # what install() changed, in order (tests and the logs read it)


# ---- 1. the flash_attn stand-in (pure torch; flash-attn 2.8.3 bert_padding / utils.distributed semantics) --------

def _rearrange(tensor, pattern: str):
    """The two einops patterns OpenRLHF passes: "b s ... -> (b s) ..." (flatten the first two axes)."""
    if pattern.replace(" ", "") != "bs...->(bs)...":
        raise NotImplementedError(f"openrlhf_cpu: flash_attn stand-in rearrange supports 'b s ... -> (b s) ...' "
                                  f"only, not {pattern!r}")
    return tensor.reshape(tensor.shape[0] * tensor.shape[1], *tensor.shape[2:])


def _index_first_axis(tensor, indices):
    return tensor.reshape(tensor.shape[0], -1)[indices].reshape(-1, *tensor.shape[1:])


def _unpad_input(hidden_states, attention_mask, unused_mask=None):
    """(unpadded hidden states, indices, cu_seqlens, max_seqlen, seqlens) as flash_attn 2.8's unpad_input."""
    import torch
    import torch.nn.functional as F

    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens_in_batch = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens_in_batch.max().item())
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, max_seqlen_in_batch, used_seqlens_in_batch


def _pad_input(hidden_states, indices, batch, seqlen):
    import torch

    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], device=hidden_states.device,
                      dtype=hidden_states.dtype)
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def _all_gather(input_, process_group):
    """flash_attn.utils.distributed.all_gather: concatenate every rank's tensor along dim 0."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(process_group)
    out = torch.empty(world * input_.shape[0], *input_.shape[1:], dtype=input_.dtype, device=input_.device)
    dist.all_gather_into_tensor(out, input_.contiguous(), group=process_group)
    return out


def _flash_attn_standin() -> None:
    if "flash_attn" in sys.modules:
        return
    pkg = types.ModuleType("flash_attn")
    pkg.__path__ = []   # a package, so `import flash_attn.bert_padding` resolves through sys.modules
    pkg.__version__ = "0.0.0+ragteam-cpu-standin"
    bert = types.ModuleType("flash_attn.bert_padding")
    bert.index_first_axis, bert.pad_input, bert.unpad_input = _index_first_axis, _pad_input, _unpad_input
    bert.rearrange = _rearrange
    utils = types.ModuleType("flash_attn.utils")
    utils.__path__ = []
    dist = types.ModuleType("flash_attn.utils.distributed")
    dist.all_gather = _all_gather
    pkg.bert_padding, pkg.utils, utils.distributed = bert, utils, dist
    for module in (pkg, bert, utils, dist):
        # a spec, so importlib.util.find_spec works (transformers probes it); no distribution metadata, so
        # transformers still finds no flash-attn to use (is_flash_attn_2_available() stays False)
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None,
                                                         is_package=hasattr(module, "__path__"))
        sys.modules[module.__name__] = module
    APPLIED.append("flash_attn stand-in (bert_padding, utils.distributed.all_gather)")


# ---- 2. harmless CUDA calls ---------------------------------------------------------------------------------------

def _harmless_cuda() -> None:
    import torch
    import torch.distributed.device_mesh as device_mesh

    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    real_mesh = device_mesh.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return real_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    device_mesh.init_device_mesh = init_device_mesh
    # `from torch.distributed.device_mesh import init_device_mesh` in OpenRLHF binds the name at its import
    APPLIED.append("CUDA calls harmless (set_device, synchronize, empty_cache, current_device, .cuda(), "
                   "init_device_mesh)")


# ---- 3. no DeepSpeed run-time C++ builds -------------------------------------------------------------------------

def _no_runtime_builds() -> None:
    import importlib

    from deepspeed.runtime.engine import DeepSpeedEngine

    # not `import deepspeed.comm.torch as m`: deepspeed.comm's namespace binds `torch` to PyTorch itself
    ds_comm_torch = importlib.import_module("deepspeed.comm.torch")

    ds_comm_torch.build_shm_op = lambda: None
    real = DeepSpeedEngine.get_optimizer_configuration

    def get_optimizer_configuration(self, optimizer_parameters, *args, **kwargs):
        optimizer_parameters["torch_adam"] = True       # DeepSpeed's TORCH_ADAM_PARAM: torch.optim.AdamW
        return real(self, optimizer_parameters, *args, **kwargs)

    DeepSpeedEngine.get_optimizer_configuration = get_optimizer_configuration
    APPLIED.append("DeepSpeed: no shm comm op build, torch.optim.AdamW instead of FusedAdam")


def record_sft_logs(path: str) -> None:
    """Append {"step", "seconds", **logs_dict} to `path` each time SFTTrainer logs an optimiser step (rank 0)."""
    import json
    import time

    from openrlhf.trainer.sft_trainer import SFTTrainer

    real = SFTTrainer.save_logs_and_checkpoints
    last = [time.perf_counter()]

    def save_logs_and_checkpoints(self, args, global_step, step_bar, logs_dict=None, client_states=None):
        now = time.perf_counter()
        if logs_dict and self.strategy.is_rank_0():
            row = {"step": int(global_step), "seconds": round(now - last[0], 4),
                   **{k: float(v) for k, v in logs_dict.items()}}
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        result = real(self, args, global_step, step_bar, logs_dict, client_states)
        last[0] = time.perf_counter()     # a checkpoint save is not part of the next step's time
        return result

    SFTTrainer.save_logs_and_checkpoints = save_logs_and_checkpoints


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_process_env(env=os.environ) -> None:
    """One rank on this host (what the `deepspeed` launcher would set for --num_gpus 1), gloo via DS_ACCELERATOR."""
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        env.setdefault(key, value)
    env.setdefault("MASTER_PORT", str(_free_port()))


def install() -> list[str]:
    """Apply the CPU shims when CUDA is absent; returns what was applied (on a CUDA machine [], or the flash-attn
    stand-in alone when RAGTEAM_FLASH_ATTN_STANDIN=1 asks for it). Idempotent."""
    import torch

    if torch.cuda.is_available():
        # a GPU gets no shim; only a machine without flash-attn installed may ask for its stand-in explicitly
        # (scripts/gpu_check.sh does: flash-attn is a long CUDA build, and eager attention never calls it)
        if os.environ.get("RAGTEAM_FLASH_ATTN_STANDIN") == "1" and importlib.util.find_spec("flash_attn") is None:
            _flash_attn_standin()
        return list(APPLIED)
    if APPLIED:
        return APPLIED
    os.environ.setdefault("DS_ACCELERATOR", "cpu")      # before deepspeed is imported
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.getcwd(), ".torch_extensions"))
    _flash_attn_standin()
    _harmless_cuda()
    _no_runtime_builds()
    return APPLIED


def check() -> str:
    """Import OpenRLHF's SFT path as a run would (the setup's smoke test); returns the versions line."""
    import importlib
    from importlib.metadata import version

    applied = install()
    for module in ("deepspeed", "openrlhf.cli.train_sft", "openrlhf.trainer.sft_trainer", "openrlhf.models.actor"):
        importlib.import_module(module)
    return (f"openrlhf {version('openrlhf')}, deepspeed {version('deepspeed')}, transformers "
            f"{version('transformers')}, torch {version('torch')}; "
            f"{'CPU shims: ' + str(len(applied)) if applied else 'CUDA: no shims'}")


def main(argv: list[str]) -> None:
    if argv == ["--check"]:
        print(f"openrlhf_cpu: SFT path imports: {check()}", flush=True)
        return
    if not argv or argv[0].startswith("-"):
        sys.exit("usage: openrlhf_cpu.py MODULE [flags...]   (e.g. openrlhf.cli.train_sft) | --check")
    module, args = argv[0], argv[1:]
    single_process_env()
    applied = install()
    import torch

    where = "CUDA" if torch.cuda.is_available() else "CPU"
    print(f"openrlhf_cpu: {module} on {where}: {'; '.join(applied) if applied else 'no shims'}", flush=True)
    if os.environ.get("RAGTEAM_OPENRLHF_LOG") and module == "openrlhf.cli.train_sft":
        record_sft_logs(os.environ["RAGTEAM_OPENRLHF_LOG"])
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
