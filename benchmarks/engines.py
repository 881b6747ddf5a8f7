"""Engine benchmark: the same work through the HF engine and the vLLM engine, side by side in one run, with ratios.

Five workloads, each the shape of a pipeline stage's generation at the default profile's settings (`params.yaml`),
each on a freshly started engine, so every stage pays its engine start-up once (reported apart and in the total):

  eval_pass      stage evaluate: the untrained MAPS team (greedy) on `--questions` dev questions
  debate         stage synthesize: DRAG debates (greedy, `maps.debate`) on `--questions` training questions
  judge_labels   stage label_judge: `label_judge.n_samples` answers per candidate at its temperature
  grpo_group     stages train_answer / train_query: one group of `train_answer.stage1.num_generations` samples per
                 answer prompt at the rollout temperature (the generation half of a GRPO step; the loss is the
                 same torch code whatever engine sampled)
  joint_rollout  stage train_joint@mask: `joint.ppo.steps` rollout steps of M-ASK, each starting with the policy's
                 LoRA handed to the engine (`PolicyEngine.sync`: nothing for hf's live policy, an adapter save + load
                 for vLLM), `joint.ppo.questions_per_step` questions per step

Needs the worker environment (vLLM) and the outputs of `dvc repro prepare_models prepare_data index_bm25@bm25s`:

    .venv-worker/bin/python -m benchmarks.engines [--questions 16] [--only judge_labels ...] [--engines hf vllm]

Writes benchmarks/results/engines.json and engines.md (the table the README quotes). `--engines vllm vllm_ray2
--name ray_engines` compares one vLLM engine on every core with 2 engines as Ray actors, one core each
(`llm.vllm.ray`, issue 24 §4): benchmarks/results/ray_engines.md. Wall-clock seconds on whatever
the machine is doing: the JSON records the load average before and after, so a table from a busy machine says so.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"
WORKLOADS = ("eval_pass", "debate", "judge_labels", "grpo_group", "joint_rollout")


def _rows(path: Path, n: int) -> list[dict]:
    from ragteam.data.formats import load_qa

    if not path.is_file():
        sys.exit(f"benchmarks.engines: {path} is missing: run `dvc repro prepare_models prepare_data "
                 "index_bm25@bm25s` first")
    return load_qa(path)[:n]


# vllm_ray2: 2 vLLM engines as Ray actors on a local cluster, 1 core each; <engine>_bf16: that engine computing in
# bfloat16 (`llm.dtype`, profiles/cpu-bf16.yaml), the others in the params' dtype
ENGINES = ("hf", "vllm", "vllm_ray2", "hf_bf16", "vllm_bf16")


def _llm(params: dict, backend: str):
    from ragteam.config import parse_section
    from ragteam.llm import LLMConfig

    llm = parse_section(params, "llm", LLMConfig)
    if backend.endswith("_bf16"):
        backend = backend.removesuffix("_bf16")
        llm = llm.model_copy(update={"dtype": "bfloat16"})
    # vLLM without torch.compile: a stage-sized job amortises none of its ~30 s extra start-up (notes/stack.md §11)
    vllm = llm.vllm.model_copy(update={"enforce_eager": True})
    if backend == "vllm_ray2":
        vllm = vllm.model_copy(update={"ray": vllm.ray.model_copy(update={
            "engines": 2, "threads_per_engine": 1, "temp_dir": str(REPO / ".ray" / "bench")})})
    return llm.model_copy(update={"backend": "hf" if backend == "hf" else "vllm", "vllm": vllm})


def _tokens(episodes) -> int:
    return sum(c.completion_tokens for ep in episodes for c in ep.calls)


def workload(name: str, params: dict, n: int) -> tuple[Callable, Callable, Callable]:
    """(start(backend) -> state, run(state) -> {"items", "sequences", "tokens"}, close(state)) of workload `name`."""
    from ragteam.config import parse_section
    from ragteam.retrieval import open_retriever

    retriever = open_retriever(params["synthesize"]["retriever"])
    pool = REPO / "data/prepared/train/pool.jsonl"

    if name in ("eval_pass", "debate", "judge_labels", "grpo_group"):
        from ragteam.llm import EnginePool

        def start(backend):
            llm = _llm(params, backend)
            engines = EnginePool(llm)
            engines.get(llm.model)          # load now: start-up is timed apart from the work
            return engines, llm

        def close(state):
            state[0].close()

    if name == "eval_pass":
        from ragteam.agents.maps_workflow import MapsConfig, run_maps

        bench = sorted((REPO / "data/prepared/benchmarks").glob("*.jsonl"))[0]
        rows = _rows(bench, n)
        cfg = parse_section(params, "maps", MapsConfig)

        def run(state):
            engines, llm = state
            eps = run_maps(rows, engines.team({}, llm.model, llm.sampling), retriever, cfg, system="maps_untrained")
            return {"items": len(rows), "sequences": sum(len(e.calls) for e in eps), "tokens": _tokens(eps)}
    elif name == "debate":
        from ragteam.agents.debate import DebateConfig
        from ragteam.train.synthesis import debate_samples

        rows = _rows(pool, n)
        cfg = DebateConfig(**params["maps"]["debate"])

        def run(state):
            engines, llm = state
            _, eps = debate_samples(rows, engines.team({}, llm.model, llm.sampling), retriever, cfg,
                                    first_n_top3=len(rows))
            return {"items": len(rows), "sequences": sum(len(e.calls) for e in eps), "tokens": _tokens(eps)}
    elif name in ("judge_labels", "grpo_group"):
        from ragteam.llm import SamplingConfig
        from ragteam.train import synthesis

        rows = _rows(pool, n)
        cands = synthesis.query_samples(rows, retriever, params["synthesize"].get("t2_top_k", 3))
        pools = [synthesis.QueryPool.from_dict(c["pool"]) for c in cands]
        words = params["maps"]["passage_words"]
        if name == "judge_labels":
            lj = params["label_judge"]
            s = SamplingConfig(n=lj["n_samples"], temperature=lj["temperature"], max_new_tokens=lj["max_new_tokens"],
                               seed=lj["seed"])
        else:
            g = params["train_answer"]["stage1"]
            s = SamplingConfig(n=g["num_generations"], temperature=g["temperature"],
                               max_new_tokens=g["max_completion_length"], seed=g["seed"])

        def run(state):
            engines, llm = state
            team = engines.team({}, llm.model, llm.sampling)
            answers = synthesis.sample_answers(team, "answer_agent", cands, pools, s, words)
            return {"items": len(cands), "sequences": sum(len(a) for a in answers), "tokens": None}
    elif name == "joint_rollout":
        return _joint(params, retriever, pool, n)
    else:
        raise SystemExit(f"benchmarks.engines: unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    return start, run, close


def _joint(params: dict, retriever, pool: Path, n: int):
    import tempfile

    from ragteam.config import parse_section
    from ragteam.llm import LLMConfig
    from ragteam.llm.policy import Rollouts, policy_engine
    from ragteam.systems.registry import build_joint
    from ragteam.systems.params import load_joint

    ppo, _, _ = load_joint(params, "mask")
    system = build_joint("mask", params, retriever)
    rows = _rows(pool, max(n, ppo.steps * ppo.questions_per_step))
    llm = parse_section(params, "llm", LLMConfig)

    def start(backend):
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = _llm(params, backend)
        tok = AutoTokenizer.from_pretrained(llm.model)
        model = AutoModelForCausalLM.from_pretrained(llm.model, dtype=torch.float32)
        lora = LoraConfig(r=ppo.lora.rank, lora_alpha=ppo.lora.alpha, target_modules=["q_proj", "v_proj"],
                          init_lora_weights=False)   # a non-zero adapter: what a policy looks like after a step
        policy = get_peft_model(model, lora).eval()
        work = tempfile.mkdtemp(prefix="bench-sync-", dir=REPO / ".vllm-cache")
        engine = policy_engine("live" if backend == "hf" else "vllm", policy, tok, llm.model, cfg, work)
        rollouts = Rollouts(engine, dict(llm.sampling), system.roles, system.frozen_roles, cfg,
                            temperature=ppo.temperature, top_p=ppo.top_p, seed=ppo.seed)
        return rollouts, policy

    def run(state):
        rollouts, policy = state
        eps_all = []
        for step in range(ppo.steps):
            qs = rows[step * ppo.questions_per_step:(step + 1) * ppo.questions_per_step]
            eps_all += system.rollout(qs, rollouts.team(step, policy))
        return {"items": len(eps_all), "sequences": sum(len(e.calls) for e in eps_all), "tokens": _tokens(eps_all)}

    def close(state):
        state[0].close()

    return start, run, close


def measure(name: str, backend: str, params: dict, n: int) -> dict:
    start, run, close = workload(name, params, n)
    t0 = time.perf_counter()
    state = start(backend)
    t1 = time.perf_counter()
    out = run(state)
    t2 = time.perf_counter()
    close(state)
    return {"workload": name, "engine": backend, "start_s": round(t1 - t0, 2), "work_s": round(t2 - t1, 2),
            "total_s": round(t2 - t0, 2), **out}


def table(results: list[dict], engines: list[str]) -> str:
    if len(engines) != 2:
        return ""
    a, b = engines
    lines = [f"| workload | work: {a} s | {b} s | {a}/{b} | with start-up: {a} s | {b} s | {a}/{b} |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for w in dict.fromkeys(r["workload"] for r in results):
        ra = next((r for r in results if r["workload"] == w and r["engine"] == a), None)
        rb = next((r for r in results if r["workload"] == w and r["engine"] == b), None)
        if ra is None or rb is None:
            continue
        lines.append(f"| {w} ({ra['items']} × {ra['sequences'] // max(ra['items'], 1)}) | {ra['work_s']:.1f} | "
                     f"{rb['work_s']:.1f} | **{ra['work_s'] / rb['work_s']:.2f}×** | {ra['total_s']:.1f} | "
                     f"{rb['total_s']:.1f} | **{ra['total_s'] / rb['total_s']:.2f}×** |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=["hf", "vllm"])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--name", default="engines", help="the results' file name: <out>/<name>.json and .md")
    args = ap.parse_args(argv)
    if "joint_rollout" in args.only and any(e.endswith("_bf16") for e in args.engines):
        ap.error("joint_rollout has no _bf16 engines (its live policy is built in fp32 here); time bf16 joint "
                 "training as a stage: python -m benchmarks.train_stages ... 'train_joint@<s>:bf16:llm.dtype=bfloat16'")
    os.chdir(REPO)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    for var, sub in (("VLLM_CACHE_ROOT", "cache"), ("VLLM_CONFIG_ROOT", "config")):
        os.environ.setdefault(var, str(REPO / ".vllm-cache" / "bench" / sub))
    (REPO / ".vllm-cache").mkdir(exist_ok=True)
    from ragteam.config import load_params
    from ragteam.environment import runtime_environment

    params = load_params(REPO / "params.yaml")
    load_before = os.getloadavg()
    results = []
    for name in args.only:
        for backend in args.engines:
            r = measure(name, backend, params, args.questions)
            print(json.dumps(r), flush=True)
            results.append(r)
    from ragteam.train.common import cpu_bf16_native

    meta = {"questions": args.questions, "cpus": os.cpu_count(), "machine": platform.machine(),
            "cpu_bf16_native": cpu_bf16_native(),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            "environment": {k: v for k, v in runtime_environment().items() if k not in ("interpreter", "prefix")},
            "command": "python -m benchmarks.engines " + " ".join(argv if argv is not None else sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    md = table(results, args.engines)
    (args.out / f"{args.name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
