#!/bin/bash
# First device call: keep the model's first half, install the carried wheels, and check that the stages import.
set -uo pipefail
G=$(cd "$(dirname "$0")" && pwd); R=$(dirname "$G")
mkdir -p /root/keep && cp "$G/smol.xz.a" /root/keep/ && ls -la /root/keep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site "$G"/whl/*.whl 2>&1 | tail -3
# datasets 5.2 (the lock's) wants pyarrow >= 24; with an older pyarrow there, datasets 5.0 (pyarrow >= 21) instead
pa=$(python3 -c "import pyarrow; print(pyarrow.__version__.split('.')[0])")
if (( pa < 24 )); then echo "pyarrow $pa: datasets 5.0.0"; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site "$G"/alt/datasets-5.0.0-py3-none-any.whl 2>&1 | tail -3; fi
export PYTHONPATH=/root/site:$R/.gpu2/stub:$R HF_HUB_OFFLINE=1
cd "$R" && python3 - <<'PY'
import importlib, torch
for m in ["stages.warmup_joint", "stages.train_joint", "stages.evaluate", "ragteam.models", "trl", "peft", "bm25s", "Stemmer", "gguf", "datasets"]:
    try:
        importlib.import_module(m); print("ok", m)
    except Exception as e:
        print("FAIL", m, type(e).__name__, e)
import transformers, pyarrow, fsspec, huggingface_hub, accelerate, tokenizers
print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-",
      "transformers", transformers.__version__, "pyarrow", pyarrow.__version__, "fsspec", fsspec.__version__,
      "hf_hub", huggingface_hub.__version__, "accelerate", accelerate.__version__, "tokenizers", tokenizers.__version__)
PY
nproc; df -h /tmp | tail -1
