"""QAgent's RL over seeds against its warm-up (studies/qagent_rl/run.sh): every row of the given result
folders paired with qagent_warmup on its 40 questions (each folder's metrics/eval_compare.json, a paired bootstrap
over questions; a folder's rows are paired with that folder's own warm-up row), and per variant (rows qagent_<variant>_seed<k>) the mean ± sd over seeds with the t-interval of
`ragteam.eval.stats.seed_summary`. Writes <out>.md and <out>.json.

    .venv/bin/python studies/qagent_rl/summarize.py <out> <result folder> [<result folder> ...]
"""
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from ragteam.eval.stats import seed_summary

METRICS = ("em", "f1", "no_answer", "format_error_questions")


def main(argv: list[str]) -> None:
    out, folders = Path(argv[0]), [Path(a) for a in argv[1:]]
    rows: dict[str, dict] = {}
    warm: dict[str, dict] = {}
    for folder in folders:
        scores = json.loads((folder / "eval.json").read_text())
        compare = json.loads((folder / "eval_compare.json").read_text())
        warm[folder.name] = {m: scores["qagent_warmup"]["avg"][m] for m in METRICS}
        for key, c in compare.items():
            name = c["a"]
            rows[name] = {"folder": folder.name, **{m: scores[name]["avg"][m] for m in METRICS},
                          **{f"{m}_diff": c["avg"][m] for m in METRICS}}
    variants: dict[str, list[str]] = defaultdict(list)
    for name in rows:
        m = re.fullmatch(r"qagent_(.+)_seed(\d+)", name)
        if m is None:
            sys.exit(f"summarize.py: row {name!r} is not qagent_<variant>_seed<k>")
        variants[m.group(1)].append(name)
    summary = {v: {m: seed_summary([rows[n][f"{m}_diff"]["diff"] for n in names]).to_dict() for m in METRICS}
               for v, names in variants.items()}
    out.with_suffix(".json").write_text(json.dumps({"warmup": warm, "rows": rows, "over_seeds": summary},
                                                   indent=1) + "\n")
    lines = ["| row | EM | F1 | no answer % | format error q % | F1 − warm-up, paired [95 %] |",
             "|---|---:|---:|---:|---:|---|"]
    for folder, w in warm.items():
        lines.append(f"| qagent_warmup ({folder}) | {w['em']:.2f} | {w['f1']:.2f} | {w['no_answer']:.1f} | "
                     f"{w['format_error_questions']:.1f} | |")
    for name, r in rows.items():
        d = r["f1_diff"]
        lines.append(f"| {name} | {r['em']:.2f} | {r['f1']:.2f} | {r['no_answer']:.1f} | "
                     f"{r['format_error_questions']:.1f} | {d['diff']:+.2f} [{d['lo']:.2f}, {d['hi']:.2f}] |")
    lines += ["", "| variant | seeds | EM − warm-up, mean ± sd [t-interval] | F1 − warm-up | no answer − warm-up |",
              "|---|---:|---|---|---|"]
    fmt = lambda s: (f"{s['mean']:+.2f} ± {s['sd']:.2f} [{s['lo']:.2f}, {s['hi']:.2f}]" if s["sd"] is not None  # noqa: E731
                     else f"{s['mean']:+.2f}")
    for v, s in summary.items():
        lines.append(f"| {v} | {s['f1']['n']} | {fmt(s['em'])} | {fmt(s['f1'])} | {fmt(s['no_answer'])} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
