"""Summarise one recipe of studies/rl_signal/run.sh over its RL seeds (issue 25 §3), where the seeds may come from
more than one run of the script (e.g. seed 0 in `<tag>/`, seeds 1 and 2 in `<tag>-seeds12/`).

For every seed: its held-out scores and the paired bootstrap difference from the warm-up on the same questions (EM,
F1, no answer, format-error questions), with its training curve (team reward, KL to the start model). Over the seeds:
mean, sd and a t-interval of the F1 and EM differences, and the pooled difference (each question's mean over the
seeds against the warm-up, paired bootstrap over questions). Every run's `<system>_warmup` records must be the same
greedy answers, or the seeds are not paired with one warm-up: that is checked, and a mismatch is an error naming the
question.

    python studies/rl_signal/summarize.py <system> <run dir> [<run dir> ...] --out <dir>
        -> <dir>/summary.json and <dir>/summary.md
    python studies/rl_signal/summarize.py pair <base records.jsonl> <records.jsonl> --out <file.json>
        one row against another on their shared questions (e.g. a longer warm-up against the default one)
"""
import argparse
import json
import sys
from pathlib import Path

from ragteam.eval import stats
from ragteam.records import read_episodes

KEYS = ("f1", "em", "no_answer", "format_error_questions")


def records(path: Path) -> dict[str, dict]:
    """question id -> the evaluate record's metrics (ragteam.records' Episodes: a bad row fails naming file:line)."""
    return {e.question_id: e.metrics for e in read_episodes(path)}


def row(path: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """One evaluate row read once: its metrics per question (as `records`) and its calls per role (`roles`)."""
    episodes = read_episodes(path)
    return {e.question_id: e.metrics for e in episodes}, roles(episodes)


def roles(episodes) -> dict[str, dict]:
    """Per role of a row's calls: how many, how many broke the role's format, and the mean output tokens (where
    RL moves a role's formats or lengths, e.g. M-ASK's Update numbering or its plans shrinking)."""
    out: dict[str, dict] = {}
    for e in episodes:
        for c in e.calls:
            r = out.setdefault(c.role, {"calls": 0, "format_errors": 0, "tokens": 0})
            r["calls"] += 1
            r["format_errors"] += c.format_error is not None
            r["tokens"] += c.completion_tokens
    return {role: {"calls": r["calls"], "format_errors": r["format_errors"],
                   "mean_tokens": round(r["tokens"] / r["calls"], 1)} for role, r in sorted(out.items())}


def percent(recs: dict[str, dict], ids: list[str]) -> dict[str, float]:
    return {k: round(100 * sum(recs[q][k] for q in ids) / len(ids), 2) for k in KEYS}


def seed_row(warm: dict[str, dict], rl: dict[str, dict]) -> dict:
    """One RL seed against the warm-up on the questions both answered rows for (paired bootstrap per metric)."""
    ids = [q for q in warm if q in rl]
    if not ids:
        raise ValueError("an RL seed's records share no question with the warm-up's")
    row: dict = {"n": len(ids), "rl": percent(rl, ids)}
    for k in KEYS:
        row[k] = stats.paired_diff([rl[q][k] for q in ids], [warm[q][k] for q in ids]).to_dict()
    return row


def over_seeds(warm: dict[str, dict], seeds: dict[str, dict[str, dict]], rows: dict[str, dict]) -> dict:
    """t-interval of the per-seed differences, and the pooled paired difference on the questions every seed has."""
    out: dict = {k: stats.seed_summary([r[k]["diff"] for r in rows.values()]).to_dict() for k in ("f1", "em")}
    ids = [q for q in warm if all(q in s for s in seeds.values())]
    for k in ("f1", "em"):
        mean = [sum(s[q][k] for s in seeds.values()) / len(seeds) for q in ids]
        out[f"pooled_{k}"] = stats.paired_diff(mean, [warm[q][k] for q in ids]).to_dict()
    return out


def _curve(seed_dir: Path, names=("reward", "kl_start", "episode_f1")) -> dict[str, list[float]]:
    """The DVCLive curves train_joint wrote (copied by run.sh to <run>/seed<k>/curves)."""
    out = {}
    for name in names:
        f = seed_dir / "curves" / "plots" / "metrics" / f"{name}.tsv"
        if f.exists():
            rows = f.read_text().splitlines()[1:]
            out[name] = [round(float(r.split("\t")[-1]), 4) for r in rows if r.strip()]
    return out


def summarize(system: str, runs: list[Path]) -> dict:
    warm: dict[str, dict] | None = None
    warm_roles: dict[str, dict] = {}
    seeds: dict[str, dict[str, dict]] = {}
    curves: dict[str, dict] = {}
    seed_roles: dict[str, dict] = {}
    for run in runs:
        w, w_roles = row(run / "records" / f"{system}_warmup" / "synthetic.jsonl")
        if warm is None:
            warm, warm_roles = w, w_roles
        else:
            for q in warm.keys() & w.keys():
                if warm[q] != w[q]:
                    raise ValueError(f"{run}: the warm-up's record of {q} differs from {runs[0]}'s: the seeds are not "
                                     f"paired with one warm-up ({warm[q]} vs {w[q]})")
        for d in sorted((run / "records").glob(f"{system}_rl_seed*/")):
            seed = d.name.removeprefix(f"{system}_rl_seed")
            if seed in seeds:
                raise ValueError(f"{run}: RL seed {seed} appears in more than one run")
            seeds[seed], seed_roles[seed] = row(d / "synthetic.jsonl")
            curves[seed] = _curve(run / f"seed{seed}")
    if warm is None or not seeds:
        raise ValueError(f"no warm-up and RL seed records under {', '.join(map(str, runs))}")
    rows = {s: {**seed_row(warm, rl), "curve": curves[s], "roles": seed_roles[s]} for s, rl in sorted(seeds.items())}
    out = {"system": system, "runs": [str(r) for r in runs], "n_questions": len(warm),
           "warmup": percent(warm, list(warm)), "warmup_roles": warm_roles, "seeds": rows}
    if len(rows) > 1:
        out["over_seeds"] = over_seeds(warm, seeds, rows)
    return out


def _iv(d: dict) -> str:
    """A paired difference as +d [lo, hi] (also the GPU summary's)."""
    return f"{d['diff']:+.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"


def markdown(s: dict) -> str:
    w = s["warmup"]
    lines = [f"{s['system']}: {s['n_questions']} held-out synthetic dev questions; warm-up only: F1 {w['f1']}, EM {w['em']},"
             f" no answer {w['no_answer']} %, format-error questions {w['format_error_questions']} %", "",
             "| RL seed | F1 | F1 − warm-up [95 % CI] | EM | EM − warm-up [95 % CI] | no answer | format-error q |"
             " training reward by step | KL to start by step |",
             "| --- | ---: | --- | ---: | --- | ---: | ---: | --- | --- |"]
    for seed, x in s["seeds"].items():
        c = x["curve"]
        lines.append(f"| {seed} | {x['rl']['f1']} | {_iv(x['f1'])} | {x['rl']['em']} | {_iv(x['em'])} | "
                     f"{x['rl']['no_answer']} | {x['rl']['format_error_questions']} | "
                     f"{' '.join(f'{v:.2f}' for v in c.get('reward', []))} | "
                     f"{' '.join(f'{v:.3f}' for v in c.get('kl_start', []))} |")
    names = sorted({r for x in [s["warmup_roles"], *(x["roles"] for x in s["seeds"].values())] for r in x})
    if names:
        lines += ["", "Calls per role (format errors / calls, mean output tokens):", "",
                  "| row | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
        for label, rs in [("warm-up", s["warmup_roles"])] + [(f"RL seed {k}", x["roles"]) for k, x in s["seeds"].items()]:
            cells = [f"{rs[n]['format_errors']} / {rs[n]['calls']}, {rs[n]['mean_tokens']}" if n in rs else "–"
                     for n in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "over_seeds" in s:
        o = s["over_seeds"]
        for k in ("f1", "em"):
            t = o[k]
            lines += ["", f"over seeds, {k.upper()} gain: mean {t['mean']:+.2f}, sd {t['sd']}, 95 % t-interval "
                      f"[{t['lo']}, {t['hi']}] (n = {t['n']}); pooled (seed-mean per question, paired bootstrap) "
                      f"{_iv(o['pooled_' + k])}"]
    return "\n".join(lines) + "\n"


def pair(base: Path, other: Path) -> dict:
    b = records(base)
    return {"base": str(base), "other": str(other), "base_scores": percent(b, list(b)), **seed_row(b, records(other))}


def main() -> None:
    if sys.argv[1:2] == ["pair"]:
        ap = argparse.ArgumentParser(description="one evaluate row against another, paired on their questions")
        ap.add_argument("base", type=Path)
        ap.add_argument("other", type=Path)
        ap.add_argument("--out", type=Path, required=True)
        a = ap.parse_args(sys.argv[2:])
        r = pair(a.base, a.other)
        a.out.write_text(json.dumps(r, indent=1) + "\n")
        print(f"{a.other} against {a.base} on {r['n']} questions: F1 {r['base_scores']['f1']} -> {r['rl']['f1']}, "
              f"paired {_iv(r['f1'])}; EM {r['base_scores']['em']} -> {r['rl']['em']}, paired {_iv(r['em'])}")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("system")
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    s = summarize(a.system, a.runs)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    md = markdown(s)
    (a.out / "summary.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
