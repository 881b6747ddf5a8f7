"""Where the answer agent's silence comes from (issue 27 §2): lead-in stubs under greedy decoding and under the
training sampler, before and after train_answer, on the training prompts of each GRPO stage and on the prompts the
answer agent gets at evaluation.

For every model (`--model name=path`, e.g. the base model, the stage-1 model and the trained answer agent) and
every prompt set it writes, side by side from one run:
- greedy: the share of prompts whose output has no answer (`maps.parse_answer` finds none), and of those the
  lead-in stubs ("The answer is:" and nothing after it);
- the training sampler (`--temperature`, `--samples` per prompt, `--max-new-tokens`: train_answer's settings):
  the same shares over every sample, the mean reward of the stubs and of the other samples under the stage's
  reward (`train_answer` params of the workspace), the share of GRPO groups where every sample has no answer (no
  reward variance: no gradient), and the share of prompts whose greedy output is a stub while fewer than half of
  their samples are (a mode the sampler rarely visits, so training rarely sees it).

Prompt sets: `top3` / `top5` are T1's stage-1 / stage-2 training prompts (data/synthesis/t1_answer.jsonl, the
prompts train_answer uses); `eval` are the answer-agent prompts of a MAPS system's evaluation episodes
(`--episodes results/eval/maps/*.jsonl`: the final answer call of each question).

    python studies/answer_silence/answer_silence.py --workspace . --model base=models/llm \\
        --model stage1=checkpoints/train_answer/stage1_model --model trained=models/agents/answer \\
        --episodes results/eval/maps/synthetic.jsonl --out studies/answer_silence/default
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ROLE = "answer_agent"


def is_stub(text: str) -> bool:
    """No answer because the output only announces one (the failure issue 27 reports): `maps.is_stub`."""
    from ragteam.agents.maps import is_stub as stub

    return stub(text)


def no_answer(text: str) -> bool:
    from ragteam.agents.core import FormatError
    from ragteam.agents.maps import parse_answer

    return isinstance(parse_answer(text), FormatError)


def prompt_sets(workspace: Path, episodes: list[Path], passage_words: int | None, limit: int) -> dict[str, list]:
    """{set: [(messages, golden answers)]}: T1's top-3 and top-5 training prompts, and evaluation's answer prompts."""
    from ragteam.io import read_jsonl
    from ragteam.records import read_episodes
    from ragteam.train.maps import answer_samples

    t1 = [row for _, row in read_jsonl(workspace / "data/synthesis/t1_answer.jsonl")]
    sets = {f"top{k}": [(s.prompt, s.golden_answers) for s in answer_samples(t1, k, passage_words)][: limit or None]
            for k in (3, 5)}   # stage 1 / stage 2 of train_answer (stage1_top_k, stage2_top_k)
    evals = []
    for path in episodes:
        for ep in read_episodes(path):
            calls = [c for c in ep.calls if c.role == "answer_agent"]
            if calls:
                evals.append((calls[-1].prompt, ep.golden_answers))
    if evals:
        sets["eval"] = evals[: limit or None]
    return sets


def measure(team, prompts: list, reward, samples: int, temperature: float, max_new: int, seed: int) -> dict:
    """The figures of one model on one prompt set (module docstring); rates in percent."""
    from ragteam.llm import SamplingConfig

    msgs, golds = [p for p, _ in prompts], [g for _, g in prompts]
    greedy = [c[0].text for c in team.generate("answer_agent", msgs,
                                               SamplingConfig(max_new_tokens=max_new, temperature=0.0))]
    drawn = team.generate("answer_agent", msgs, SamplingConfig(max_new_tokens=max_new, temperature=temperature,
                                                               n=samples, seed=seed))
    texts = [[c.text for c in group] for group in drawn]
    clipped = [[c.finish_reason == "length" for c in group] for group in drawn]
    scored = [[reward(t, g, cl)[0] for t, cl in zip(ts, cls)] for ts, cls, g in zip(texts, clipped, golds)]
    flat = [(t, r) for ts, rs in zip(texts, scored) for t, r in zip(ts, rs)]
    stub_r = [r for t, r in flat if is_stub(t)]
    other_r = [r for t, r in flat if not is_stub(t)]
    pct = lambda k, n: round(100 * k / max(n, 1), 2)  # noqa: E731
    n = len(prompts)
    return {
        "prompts": n,
        "greedy_no_answer": pct(sum(map(no_answer, greedy)), n),
        "greedy_stub": pct(sum(map(is_stub, greedy)), n),
        "sampled_no_answer": pct(sum(no_answer(t) for t, _ in flat), len(flat)),
        "sampled_stub": pct(len(stub_r), len(flat)),
        "reward_stub": round(sum(stub_r) / len(stub_r), 3) if stub_r else None,
        "reward_other": round(sum(other_r) / len(other_r), 3) if other_r else None,
        "groups_all_no_answer": pct(sum(all(no_answer(t) for t in ts) for ts in texts), n),
        "groups_zero_variance": pct(sum(max(rs) - min(rs) < 1e-9 for rs in scored), n),
        "greedy_stub_sampler_rare": pct(sum(is_stub(g) and sum(map(is_stub, ts)) < len(ts) / 2
                                            for g, ts in zip(greedy, texts)), n),
        "examples_greedy": greedy[:4],
    }


def continuation_probe(team, prompts: list, greedy: list, max_new: int, ks=(1, 2, 3), resamples: int = 4,
                       seed: int = 0) -> dict:
    """For the greedy stubs (`greedy`: the engine's Completions): continue each once inside its assistant turn, EOS
    forbidden for the first k new tokens, within the role's remaining budget; the share that then parses to an
    answer, and the F1 of those answers (percent). Then the pipeline's own rules, through the same Team:
    `repeat` is `agents.core.continue_lead_ins` (again while the text is still a stub, within the budget);
    `resample` is `agents.core.resample_no_answers` on the greedy stub (`resamples` fresh draws at T 0.8, seeded);
    `repeat+resample` is what an answering call does at inference (`llm_step`: the continuation, then the answer
    fallback for what is still no answer)."""
    from ragteam.agents.core import continue_lead_ins, resample_no_answers
    from ragteam.agents.maps import parse_answer
    from ragteam.llm import AnswerFallback, SamplingConfig, Team

    stubs = [(m, g, c) for (m, g), c in zip(prompts, greedy) if is_stub(c.text)]
    if not stubs:
        return {}
    msgs = [m for m, _, _ in stubs]
    out: dict = {"stubs": len(stubs)}
    for k in ks:
        more = [team.complete(ROLE, [[*m, {"role": "assistant", "content": c.text}]], SamplingConfig(
            max_new_tokens=max(k, max_new - c.completion_tokens), min_new_tokens=k, temperature=0.0))[0]
            for m, _, c in stubs]
        out[f"min{k}"] = _scored(stubs, [c.text + x.text for (_, _, c), x in zip(stubs, more)])
    greedy_s = SamplingConfig(max_new_tokens=max_new, temperature=0.0)
    repeated = [g[0] for g in continue_lead_ins(team, ROLE, msgs, [[c] for _, _, c in stubs], is_stub, greedy_s)]
    out["repeat"] = _scored(stubs, [c.text for c in repeated])
    drawing = Team(lambda role: team.engine(role), {ROLE: greedy_s},
                   fallback=AnswerFallback(samples=resamples, temperature=0.8, seed=seed))
    parsers = [parse_answer] * len(stubs)
    fresh, _ = resample_no_answers(drawing, ROLE, msgs, [c for _, _, c in stubs], parsers)
    out["resample"] = _scored(stubs, [c.text for c in fresh])
    both, _ = resample_no_answers(drawing, ROLE, msgs, repeated, parsers)
    out["repeat+resample"] = _scored(stubs, [c.text for c in both])
    return out


def _scored(stubs: list, texts: list[str]) -> dict:
    """Answered share of the stubs and F1 of the answers (percent) when each stub's text becomes `texts[i]`."""
    from ragteam.agents.maps import parse_answer
    from ragteam.metrics import f1_score

    got, f1s = 0, []
    for (_, golds, _), full in zip(stubs, texts):
        y = parse_answer(full)
        if isinstance(y, str):
            got += 1
            f1s.append(f1_score(y, golds))
    return {"answered": round(100 * got / len(stubs), 2),
            "f1_of_answered": round(100 * sum(f1s) / max(len(f1s), 1), 2), "examples": texts[:4]}


def table(result: dict) -> str:
    cols = [("greedy_no_answer", "greedy: no answer %"), ("greedy_stub", "greedy: stub %"),
            ("sampled_no_answer", "sampled: no answer %"), ("sampled_stub", "sampled: stub %"),
            ("reward_stub", "reward of stubs"), ("reward_other", "reward of the rest"),
            ("groups_all_no_answer", "groups all no answer %"), ("groups_zero_variance", "groups zero variance %"),
            ("greedy_stub_sampler_rare", "greedy stub, sampler < 50 % %")]
    lines = ["| model | prompts | n | " + " | ".join(c for _, c in cols) + " |",
             "|---|---|---:|" + "---:|" * len(cols)]
    for model, sets in result["models"].items():
        for name, m in sets.items():
            cells = ["–" if m[k] is None else f"{m[k]:g}" for k, _ in cols]
            lines.append(f"| {model} | {name} | {m['prompts']} | " + " | ".join(cells) + " |")
    probes = [(model, name, m["continuation"]) for model, sets in result["models"].items()
              for name, m in sets.items() if m.get("continuation")]
    if probes:
        rules = [k for k in probes[0][2] if k != "stubs"]
        lines += ["", "Greedy stubs and what each inference rule makes of them: answered % / F1 of the answered",
                  "", "| model | prompts | greedy stubs | " + " | ".join(rules) + " |",
                  "|---|---|---:|" + "---:|" * len(rules)]
        for model, name, c in probes:
            cells = [f"{c[r]['answered']:g} / {c[r]['f1_of_answered']:g}" for r in rules]
            lines.append(f"| {model} | {name} | {c['stubs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workspace", type=Path, default=Path("."), help="a repo checkout with the pipeline's outputs")
    ap.add_argument("--model", action="append", required=True, help="name=path (repeat)")
    ap.add_argument("--episodes", type=Path, nargs="*", default=[], help="evaluation episodes of a MAPS system")
    ap.add_argument("--samples", type=int, default=None, help="per prompt (default: train_answer's num_generations)")
    ap.add_argument("--limit", type=int, default=0, help="first n prompts of each set (0 = all)")
    ap.add_argument("--probe-continuation", action="store_true",
                    help="what each inference rule makes of the greedy stubs (continuation_probe)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import yaml

    from ragteam.llm import EngineConfig, EnginePool, LLMConfig, SamplingConfig
    from ragteam.config import parse_section
    from stages.common import TrainAnswerParams

    params = yaml.safe_load((a.workspace / "params.yaml").read_text())
    tp = parse_section(params, "train_answer", TrainAnswerParams)
    llm = parse_section(params, "llm", LLMConfig)
    g = tp.stage1
    samples = a.samples or g.num_generations
    sets = prompt_sets(a.workspace, [a.workspace / p if not p.is_absolute() else p for p in a.episodes],
                       params["maps"]["passage_words"], a.limit)
    rewards = {"top3": tp.reward("stage1"), "top5": tp.reward("stage2"), "eval": tp.reward("stage2")}
    result = {"settings": {"temperature": g.temperature, "samples": samples, "max_new_tokens":
                           g.max_completion_length, "seed": g.seed, "reward": {k: str(v) for k, v in rewards.items()}},
              "models": {}}
    for spec in a.model:
        name, path = spec.split("=", 1)
        path = str(a.workspace / path) if not Path(path).is_absolute() else path
        pool = EnginePool(EngineConfig(**{**llm.model_dump(exclude={"model", "sampling", "stages", "answer_fallback"}), "device": "cpu"}))
        team = pool.team({}, path, {})
        result["models"][name] = {}
        for set_name, prompts in sets.items():
            print(f"{name}: {set_name} ({len(prompts)} prompts) ...", flush=True)
            m = measure(team, prompts, rewards[set_name], samples, g.temperature, g.max_completion_length, g.seed)
            if a.probe_continuation:
                greedy = [c[0] for c in team.generate(ROLE, [p for p, _ in prompts], SamplingConfig(
                    max_new_tokens=llm.sampling[ROLE].max_new_tokens, temperature=0.0))]
                m["continuation"] = continuation_probe(team, prompts, greedy, llm.sampling[ROLE].max_new_tokens,
                                                       seed=llm.seed)
            result["models"][name][set_name] = m
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "silence.json").write_text(json.dumps(result, indent=1))
    (a.out / "silence.md").write_text(table(result))
    print(table(result))


if __name__ == "__main__":
    main()
