"""Two LLM stages at once with one thread each against one stage with both threads, side by side on this machine.

`make repro` runs its stages one after another (`dvc repro`), each with `llm.threads` (2) torch threads. On 2 cores
that leaves throughput behind if a stage's work scales less than linearly with threads (README: 1.38x generation,
1.59x training for 2 threads against 1): two independent stages of the DAG (the four joint systems' branches, the
MAPS chain) could instead run at once with one thread each (the Prefect flow with `prefect.max_parallel_stages: 2`,
`llm.threads: 1`). This measures that trade on the real backbone before anyone changes a default: the same units of
work (a LoRA forward and backward pass over a training batch, as the warm-ups and RL updates do; a greedy HF
`generate` batch, as the rollouts and probes do), run

  - `sequential`: one process with `--threads` (2) threads does 2 x N units;
  - `concurrent`: two processes with `--threads` / 2 threads each do N units each, started together;

and reports each variant's wall seconds and the throughput ratio (sequential seconds / concurrent seconds).

    python -m benchmarks.concurrent_stages --model ~/.cache/ragteam-tests/llm --units 2

Writes benchmarks/results/concurrent_stages.json and .md (or --out). The machine should be otherwise idle. Measured:
studies/default_repro/notes.md ("two stages at once"), benchmarks/results/concurrent_stages_units{2,3}.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = ("train", "generate")


def work(model_dir: str, workload: str, units: int, threads: int, seed: int = 0) -> dict:
    """`units` units of `workload` on the model in `model_dir` with `threads` torch threads; seconds of the units
    alone (the model load is timed apart)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(seed)
    if workload == "train":   # one optimiser step's forward + backward: 4 sequences of 256 tokens, LoRA r 16
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, tok.vocab_size, (4, 256), generator=g)
        t0 = time.perf_counter()
        for _ in range(units):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    else:                     # one greedy rollout batch: 8 prompts of 192 tokens, 32 new tokens each
        model.eval()
        ids = torch.randint(0, tok.vocab_size, (8, 192), generator=g)
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(units):
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                               min_new_tokens=32, do_sample=False, pad_token_id=tok.eos_token_id)
    return {"workload": workload, "units": units, "threads": threads, "seconds": round(time.perf_counter() - t0, 2),
            "load_seconds": round(load_s, 2)}


def _child(model: str, workload: str, units: int, threads: int) -> subprocess.Popen:
    code = ("import json, sys; from benchmarks.concurrent_stages import work; "
            f"print(json.dumps(work({model!r}, {workload!r}, {units}, {threads})))")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode:
        sys.exit(f"a benchmark process failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def compare(model: str, workload: str, units: int, threads: int) -> dict:
    """Sequential (one process, `threads`, 2 x units) against concurrent (two processes, threads // 2, units each).
    Each variant's seconds are its units' wall time: the longest of the two concurrent processes' unit times (they
    start together; model loads are outside the timed span)."""
    seq = _result(_child(model, workload, 2 * units, threads))
    procs = [_child(model, workload, units, max(1, threads // 2)) for _ in range(2)]
    conc = [_result(p) for p in procs]
    conc_s = max(r["seconds"] for r in conc)
    return {"workload": workload, "units_total": 2 * units, "sequential": seq, "concurrent": conc,
            "sequential_seconds": seq["seconds"], "concurrent_seconds": conc_s,
            "ratio": round(seq["seconds"] / conc_s, 3)}


def main(argv: list[str] | None = None) -> None:
    from benchmarks.ppo_update import cpu_name

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a SmolLM2 checkpoint directory (models/llm, or the tests' cache)")
    ap.add_argument("--units", type=int, default=2, help="units of work per concurrent process (sequential: 2x)")
    ap.add_argument("--threads", type=int, default=2, help="the sequential process's threads (concurrent: half each)")
    ap.add_argument("--workload", choices=WORKLOADS, action="append", help="default: both")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/concurrent_stages")
    a = ap.parse_args(argv)
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"--model {a.model}: no config.json (run `dvc repro prepare_models`, or the tests once)")
    rows = [compare(a.model, w, a.units, a.threads) for w in (a.workload or WORKLOADS)]
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": a.threads, "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    md = ["# Two stages at once, one thread each, against one stage with both threads", "",
          f"`python -m benchmarks.concurrent_stages --units {a.units} --threads {a.threads}` on {result['cpu']}, "
          f"{result['cores']} cores. Sequential: one process, {a.threads} threads, all the units; concurrent: two "
          f"processes started together, {max(1, a.threads // 2)} thread(s) each, half the units each. Seconds of the "
          "units alone (model loads apart); ratio = sequential / concurrent (> 1: running two stages at once pays).",
          "", "| workload | units | sequential s | concurrent s (slower process) | ratio |", "|---|---:|---:|---:|---:|"]
    md += [f"| {r['workload']} | {r['units_total']} | {r['sequential_seconds']} | {r['concurrent_seconds']} | "
           f"**{r['ratio']}×** |" for r in rows]
    a.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
