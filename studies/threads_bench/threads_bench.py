"""1 vs 2 torch threads for the HF engine on CPU: 16 RAG-sized prompts (507 tokens) with 24 greedy new tokens, then
4 forward+backward passes of 4 x 200 tokens. Run each thread count in its own process (torch fixes the pool at
first use), with OMP_WAIT_POLICY=PASSIVE as the stages set it:

    OMP_WAIT_POLICY=PASSIVE python studies/threads_bench/threads_bench.py models/llm 1
    OMP_WAIT_POLICY=PASSIVE python studies/threads_bench/threads_bench.py models/llm 2
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ragteam.llm import EngineConfig, SamplingConfig  # noqa: E402
from ragteam.llm.hf import HFEngine  # noqa: E402

th = int(sys.argv[2])
eng = HFEngine(sys.argv[1], EngineConfig(threads=th, batch_size=16, prefix_cache_tokens=0))
passage = " ".join(["The film festival was held in the city of Varno, which lies on the river Ost and was founded by"] * 20)
prompts = [[{"role": "user", "content": f"Doc {i}: {passage}\nQuestion: who directed film number {i}? Answer briefly."}] for i in range(16)]
print("prompt tokens", len(eng.encode(prompts[0])))
s = SamplingConfig(max_new_tokens=24, temperature=0)
eng.generate(prompts[:2], s)
t = time.perf_counter(); eng.generate(prompts, s); g = time.perf_counter() - t
# train-like: 4 x forward+backward on 4 x 200 tokens
m = eng.model; m.train()
x = torch.randint(0, 1000, (4, 200))
t = time.perf_counter()
for _ in range(4):
    out = m(input_ids=x, labels=x); out.loss.backward()
b = time.perf_counter() - t
print(f"threads={th} generate16={g:.1f}s fwd+bwd(16x200)={b:.1f}s")
