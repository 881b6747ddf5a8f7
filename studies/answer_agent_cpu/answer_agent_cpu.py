"""CPU study: can GRPO move SmolLM2-135M's answer agent (EM/F1 on held-out questions) in a CPU budget?

Data: HotpotQA dev sample (gold passages by metadata.supporting_titles from mini_wiki + 1 distractor) and the
synthetic world (gold passages by metadata.supporting_ids + 1 distractor), passages cut to `--words` words, the
MAPS answer-agent prompt (Appendix A layout). Held-out: the last `--eval-n` questions of each source.
Usage: see studies/answer_agent_cpu/notes.md. Results are appended to studies/answer_agent_cpu/runs.jsonl.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: 3-6x faster on shared cores (see the .md)

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ragteam.agents.core import QueryPool  # noqa: E402
from ragteam.agents.maps import answer_messages  # noqa: E402
from ragteam.data.formats import iter_corpus, load_qa  # noqa: E402
from ragteam.data.synthetic import generate  # noqa: E402
from ragteam.metrics import answer_metrics  # noqa: E402
from ragteam.retrieval.base import Hit  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
OUT = ROOT / "studies" / "answer_agent_cpu"
PROMPT_VERSION = "agents.maps.answer_messages/1"


def answer_prompt(question: str, docs: list[dict], words: int) -> list[dict]:
    """The pipeline's MAPS answer-agent prompt: a one-query pool (the question) with its docs cut to `words`."""
    pool = QueryPool()
    pool.add(question, [Hit(d["id"], d["contents"], 0.0) for d in docs])
    return answer_messages(question, pool.render(passage_words=words))


def hotpot_samples(words: int, distractors: int, seed: int) -> list[dict]:
    by_title = {}
    for p in iter_corpus(SHARED / "corpus" / "mini_wiki.jsonl"):
        by_title.setdefault(p["title"], p)
    titles = sorted(by_title)
    out = []
    for q in load_qa(SHARED / "benchmarks" / "hotpotqa" / "dev.jsonl"):
        gold = [t for t in q["metadata"].get("supporting_titles", []) if t in by_title]
        if len(gold) < len(q["metadata"].get("supporting_titles", [])) or not gold:
            continue
        r = random.Random(f"{seed}:{q['id']}")
        extra = [t for t in r.sample(titles, distractors + len(gold)) if t not in gold][:distractors]
        docs = [by_title[t] for t in gold + extra]
        r.shuffle(docs)
        out.append({"id": q["id"], "meta": {"source": "hotpotqa"}, "prompt": answer_prompt(q["question"], docs, words),
                    "golden_answers": q["golden_answers"]})
    return out


def synthetic_samples(n: int, words: int, distractors: int, seed: int, max_hops: int) -> list[dict]:
    world, _, train, dev = generate(n_passages=2000, n_train=n, n_dev=0, seed=13)
    out = []
    for q in train:
        gold = q["metadata"]["supporting_ids"]
        if len(gold) > max_hops:
            continue
        r = random.Random(f"{seed}:{q['id']}")
        kind = gold[0].rsplit("-", 1)[0]
        extra = [f"{kind}-{r.randrange(world.counts[kind])}" for _ in range(distractors)]
        docs = [world.passage(pid.rsplit("-", 1)[0], int(pid.rsplit("-", 1)[1]))
                for pid in gold + [e for e in extra if e not in gold]]
        r.shuffle(docs)
        out.append({"id": q["id"], "meta": {"source": "synthetic"}, "prompt": answer_prompt(q["question"], docs, words),
                    "golden_answers": q["golden_answers"]})
    return out


def build(args) -> tuple[list[dict], dict[str, list[dict]]]:
    hp = hotpot_samples(args.words, args.distractors, args.seed)
    sy = synthetic_samples(args.synthetic_n, args.words, args.distractors, args.seed, args.max_hops)
    evals = {"hotpotqa": hp[-args.eval_n:], "synthetic": sy[-args.eval_n:]}
    train_hp, train_sy = hp[:-args.eval_n], sy[:-args.eval_n]
    train = {"hotpotqa": train_hp, "synthetic": train_sy, "mix": train_hp + train_sy}[args.train_on]
    random.Random(args.seed).shuffle(train)
    return train, evals


def evaluate(model, tok, samples: list[dict], max_new: int, batch: int = 16) -> dict:
    import torch

    tok.padding_side = "left"
    preds = []
    model.eval()
    for i in range(0, len(samples), batch):
        chunk = samples[i:i + batch]
        enc = tok.apply_chat_template([s["prompt"] for s in chunk], add_generation_prompt=True, padding=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
        preds += tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    ms = [answer_metrics(p.strip(), s["golden_answers"]) for p, s in zip(preds, samples)]
    agg = {k: round(100 * sum(m[k] for m in ms) / len(ms), 2) for k in ("em", "f1", "acc")}
    agg["words"] = round(sum(len(p.split()) for p in preds) / len(preds), 2)
    agg["examples"] = [(s["golden_answers"][0], p.strip()) for s, p in zip(samples[:6], preds[:6])]
    return agg


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", default=str(ROOT / "models" / "llm") if (ROOT / "models" / "llm").exists()
                    else "/tmp/smollm2-hf")
    ap.add_argument("--words", type=int, default=40)
    ap.add_argument("--distractors", type=int, default=1)
    ap.add_argument("--synthetic-n", type=int, default=300)
    ap.add_argument("--max-hops", type=int, default=3)
    ap.add_argument("--eval-n", type=int, default=64)
    ap.add_argument("--eval-max-new", type=int, default=16)
    ap.add_argument("--train-on", choices=["hotpotqa", "synthetic", "mix"], default="mix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stats", action="store_true", help="print prompt-length / coverage stats and exit")
    ap.add_argument("--no-eval", action="store_true", help="train only (timing runs)")
    ap.add_argument("--steps", type=int, default=0, help="0 = evaluate the base model only")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--scheduler", choices=["constant", "linear", "cosine"], default="constant")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--stage", default="stage1")
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--max-words", type=int, default=6)
    ap.add_argument("--min-words", type=int, default=0)
    ap.add_argument("--lora-rank", type=int, default=0, help="0 = full fine-tuning")
    ap.add_argument("--lora-top", type=int, default=None)
    ap.add_argument("--trainer", choices=["trl", "shared_prefix"], default="trl")
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    train, evals = build(args)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    if args.stats:
        for name, rows in [("train", train)] + list(evals.items()):
            lens = [len(tok.apply_chat_template(s["prompt"], add_generation_prompt=True)["input_ids"]) for s in rows]
            cover = [answer_metrics(s["prompt"][0]["content"], s["golden_answers"])["acc"] for s in rows]
            print(f"{name}: n={len(rows)} prompt tokens mean={sum(lens)/len(lens):.0f} max={max(lens)} "
                  f"gold-in-prompt={100*sum(cover)/len(cover):.0f}%")
        print(json.dumps(train[0]["prompt"], indent=1))
        return

    import torch
    from transformers import AutoModelForCausalLM

    OUT.mkdir(parents=True, exist_ok=True)
    data_key = hashlib.sha256(json.dumps([PROMPT_VERSION, args.model, args.words, args.distractors,
                                          args.synthetic_n, args.max_hops,
                                          args.eval_n, args.eval_max_new, args.seed]).encode()).hexdigest()[:12]
    base_file = OUT / f"base_{data_key}.json"
    if args.no_eval:
        base = {}
    elif base_file.exists():
        base = json.loads(base_file.read_text())
    else:
        t = time.perf_counter()
        m = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        base = {k: evaluate(m, tok, v, args.eval_max_new) for k, v in evals.items()}
        base["eval_seconds"] = round(time.perf_counter() - t, 1)
        base_file.write_text(json.dumps(base, indent=1))
        del m
    print("base", json.dumps(base))
    if args.steps == 0:
        return

    from ragteam.train.curves import curve_rows, summarize, write_curves
    from ragteam.rewards.maps import AnswerReward
    from ragteam.train.grpo import GRPOParams, answer_reward_func, train_grpo
    from ragteam.train.grpo_prefix import train_grpo_shared_prefix

    params = GRPOParams(steps=args.steps, prompts_per_step=args.prompts, num_generations=args.gens,
                        micro_batch_size=args.micro, lr=args.lr, lr_scheduler=args.scheduler, kl_beta=args.beta,
                        temperature=args.temperature,
                        max_completion_length=args.max_new, seed=args.seed, save_steps=10_000,
                        lora={"enabled": args.lora_rank > 0, "rank": max(args.lora_rank, 1),
                              "alpha": 2 * max(args.lora_rank, 1), "top_layers": args.lora_top})
    t0 = time.perf_counter()
    trainer = {"trl": train_grpo, "shared_prefix": train_grpo_shared_prefix}[args.trainer]
    res = trainer(train, args.model, f"/tmp/answer_agent_cpu_ckpt/{args.name}", params,
                     answer_reward_func(AnswerReward(args.stage, args.alpha, args.max_words, args.min_words)),
                     run_tag={"study": args.name, "alpha": args.alpha, "l": args.max_words, "stage": args.stage,
                              "min_words": args.min_words})
    train_s = time.perf_counter() - t0
    rows = curve_rows(res.log_history)
    write_curves(rows, OUT / args.name, png_path=OUT / f"{args.name}.png", title=args.name)
    model = res.model.merge_and_unload() if hasattr(res.model, "merge_and_unload") else res.model
    t = time.perf_counter()
    after = {} if args.no_eval else {k: evaluate(model, tok, v, args.eval_max_new) for k, v in evals.items()}
    eval_s = time.perf_counter() - t
    rec = {"name": args.name, "args": vars(args), "train_seconds": round(train_s, 1),
           "seconds_per_step": round(train_s / args.steps, 1), "eval_seconds": round(eval_s, 1),
           "summary": summarize(rows, res.seconds, res.global_step), "base": base, "after": after}
    with (OUT / "runs.jsonl").open("a") as f:
        f.write(json.dumps(rec) + "\n")
    print("after", json.dumps(after))
    print("summary", json.dumps(rec["summary"]), "train_s", round(train_s), "eval_s", round(eval_s))


if __name__ == "__main__":
    main()
