"""Print the README's replication table from `python -m studies summarize` JSON (studies/replicate_mirror)."""
import json
import sys

d = json.load(open(sys.argv[1]))
NAMES = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki", "musique": "MuSiQue", "bamboogle": "Bamboogle", "avg": "Avg"}
ROWS = [("answer", "em", "answer EM"), ("answer", "f1", "answer F1"), ("query", "mean_delta_f1", "query mean ΔF1 ×100"),
        ("judge", "balanced_accuracy", "judge balanced acc.")]
print("| agent, metric | benchmark | base | trained (mean ± sd) | gain per seed | pooled gain [95 % CI] |")
print("|---|---|---:|---:|---|---:|")
for agent, metric, label in ROWS:
    for b in ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "avg"):
        m = d[b][agent][metric]
        p = m["pooled"]
        cell = f"{p['diff']:+.2f} [{p['lo']:.2f}, {p['hi']:.2f}]"
        cell = f"**{cell}** †" if p["significant"] else cell
        seeds = ", ".join(f"{x:+.2f}" for x in m["per_seed"])
        print(f"| {label} | {NAMES[b]} | {m['base']['mean']:.2f} | {m['trained']['mean']:.2f} ± {m['trained']['sd']:.2f} "
              f"| {seeds} | {cell} |")
