"""Summarise a device run of studies/rl_signal/gpu/run.sh (issue 25 §3): per recipe, each RL seed's paired
bootstrap difference from the warm-up on the same questions (EM, F1, no-answer, format-error questions), the seeds'
mean with sd and a t-interval, and each seed's training curve (team reward, KL to the start model, format error rate).

    python studies/rl_signal/gpu/summarize.py <res dir> [--out summary]   -> <out>.json and <out>.md in <res dir>
"""
import argparse
import importlib.util
import json
from pathlib import Path

from ragteam.eval import stats

# The pairing of a seed with the warm-up is the CPU runs' (studies/rl_signal/summarize.py): one implementation.
_SPEC = importlib.util.spec_from_file_location("rl_signal_summarize", Path(__file__).resolve().parents[1] / "summarize.py")
_common = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_common)
KEYS, _records = _common.KEYS, _common.records


def _curve(seed_dir: Path) -> list[dict]:
    f = seed_dir / "curves" / "metrics.jsonl"
    if not f.exists():
        return []
    by_step: dict[int, dict] = {}
    for line in f.read_text().splitlines():
        m = json.loads(line)
        by_step.setdefault(m["step"], {"step": m["step"]})[m["name"]] = m["value"]
    return [by_step[k] for k in sorted(by_step)]


def summarize(res: Path) -> dict:
    out: dict = {"recipes": {}}
    for ev in sorted(res.glob("eval-*/")):
        rec = ev.name.removeprefix("eval-")
        warm_file = ev / "mask_warmup" / "synthetic.jsonl"
        if not warm_file.exists():
            continue
        warm = _records(warm_file)
        r: dict = {"warmup": _common.percent(warm, list(warm)), "n_questions": len(warm), "seeds": {}}
        for seed_dir in sorted(ev.glob("mask_rl_seed*/")):
            f = seed_dir / "synthetic.jsonl"
            if not f.exists():
                continue
            s = _common.seed_row(warm, _records(f))
            seed = seed_dir.name.removeprefix("mask_rl_seed")
            s["curve"] = _curve(res / f"{rec}-seed{seed}")
            r["seeds"][seed] = s
        if r["seeds"]:
            r["over_seeds"] = {k: stats.seed_summary([s[k]["diff"] for s in r["seeds"].values()]).to_dict()
                               for k in ("f1", "em")}
        out["recipes"][rec] = r
    return out


def markdown(s: dict) -> str:
    lines = []
    for rec, r in s["recipes"].items():
        w = r["warmup"]
        lines += [f"### Recipe {rec}: {r['n_questions']} synthetic dev questions", "",
                  f"warm-up only: F1 {w['f1']}, EM {w['em']}, no answer {w['no_answer']} %, "
                  f"format-error questions {w['format_error_questions']} %", "",
                  "| RL seed | F1 | RL − warm-up F1 [95 % CI] | EM | RL − warm-up EM [95 % CI] | no answer | format-error q |"
                  " reward step 1 → last | KL to start, last |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for seed, x in r["seeds"].items():
            c = x["curve"]
            rew = f"{c[0].get('reward', float('nan')):.3f} → {c[-1].get('reward', float('nan')):.3f}" if c else "-"
            kl = f"{c[-1].get('kl_start', float('nan')):.4f}" if c else "-"
            lines.append(f"| {seed} | {x['rl']['f1']} | {_common._iv(x['f1'])}"
                         f" | {x['rl']['em']} | {_common._iv(x['em'])}"
                         f" | {x['rl']['no_answer']} | {x['rl']['format_error_questions']} | {rew} | {kl} |")
        if "over_seeds" in r:
            o = r["over_seeds"]["f1"]
            lines += ["", f"over seeds, F1 gain: mean {o['mean']:+.2f}, sd {o['sd']}, 95 % t-interval "
                      f"[{o['lo']}, {o['hi']}] (n = {o['n']})"]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("res", type=Path)
    ap.add_argument("--out", default="summary")
    a = ap.parse_args()
    s = summarize(a.res)
    (a.res / f"{a.out}.json").write_text(json.dumps(s, indent=1) + "\n")
    md = markdown(s)
    (a.res / f"{a.out}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
