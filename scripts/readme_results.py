"""The README's generated parts, from committed files, so that no score or run time there is typed by hand.

- `results`: one table, each system's base and trained EM / F1 with 95 % intervals and the paired gain, on the
  default data (`metrics/eval.json`: rows and their bootstrap intervals; `metrics/eval_compare.json`: paired
  differences), plus MAPS on held-out real questions over training seeds (`<study>/maps_mirror_team/seeds.json`).
- `runtime`: the committed run's `make repro` wall time, from the time-stamped log of that run
  (a `*stages.log` under `<study>/default_repro`, the newest by its `start` line).

    python scripts/readme_results.py            # print both blocks
    python scripts/readme_results.py --write    # rewrite README.md between <!-- NAME:start --> / <!-- NAME:end -->
    python scripts/readme_results.py --check    # exit 1 when README.md differs (tests/test_readme.py does the same)

Scores are rounded to whole points (half up): with 40 questions one question moves EM by 2.5 points, and
`reports/eval.md` keeps two decimals. Studies live in `studies/`.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
STUDY_DIRS = ("studies",)

# (label, base row, trained row) of metrics/eval.json; a baseline has no trained row.
ROWS = [
    ("no retrieval", "native", None),
    ("standard RAG", "standard_rag", None),
    ("MAPS", "maps_untrained", "maps"),
    ("M-ASK", "mask", "mask_trained"),
    ("JADE", "jade", "jade_trained"),
    ("DECOR", "decor", "decor_trained"),
    ("QAgent", "qagent", "qagent_trained"),
]
BENCH = "avg"      # the unweighted mean over benchmarks; on the default data the one synthetic benchmark


def whole(x: float) -> int:
    return int(Decimal(str(x)).quantize(Decimal("1"), rounding=ROUND_HALF_UP)) or 0


def score(x: float, lo: float | None = None, hi: float | None = None) -> str:
    return f"{whole(x)}" if lo is None else f"{whole(x)} [{whole(lo)}, {whole(hi)}]"


def gain(d: dict) -> str:
    v = whole(d["diff"])
    cell = f"{'+' if v > 0 else ''}{v} [{whole(d['lo'])}, {whole(d['hi'])}]"
    return f"**{cell}**" if d["significant"] else cell


def find_study(*parts: str) -> Path:
    for top in STUDY_DIRS:
        p = ROOT.joinpath(top, *parts)
        if p.exists():
            return p
    raise FileNotFoundError(f"{'/'.join(parts)} under none of {', '.join(STUDY_DIRS)}")


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def results_block() -> str:
    rows = load(ROOT / "metrics/eval.json")
    pairs = load(ROOT / "metrics/eval_compare.json")
    seeds_path = find_study("maps_mirror_team", "seeds.json")
    held = load(seeds_path)
    out = ["| system | base EM | base F1 | trained EM | trained F1 | gain EM | gain F1 |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    ns = set()
    for label, base, trained in ROWS:
        b = rows[base][BENCH]
        ns.add(int(b["n"]))
        cells = [score(b["em"], *b["em_ci"]), score(b["f1"], *b["f1_ci"])]
        if trained is None:
            cells += ["–"] * 4
        else:
            t = rows[trained][BENCH]
            ns.add(int(t["n"]))
            d = pairs[f"{trained} vs {base}"][BENCH]
            cells += [score(t["em"], *t["em_ci"]), score(t["f1"], *t["f1_ci"]), gain(d["em"]), gain(d["f1"])]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    em, f1 = held[BENCH]["em"], held[BENCH]["f1"]
    n_held, n_seeds = held["questions"][BENCH][0], len(held["runs"])
    benches = [k for k in held["questions"] if k != BENCH]
    names = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki", "musique": "MuSiQue", "bamboogle": "Bamboogle"}
    fixed_base = em["b"]["sd"] == 0 and f1["b"]["sd"] == 0      # untrained: nothing a training seed changes

    def mean(s: dict, row: str) -> str:
        return score(s[row]["mean"]) if row == "b" and fixed_base else score(s[row]["mean"], s[row]["lo"], s[row]["hi"])

    out.append(f"| MAPS, held-out ({n_held} real questions, {n_seeds} seeds) | {mean(em, 'b')} | {mean(f1, 'b')} | "
               f"{mean(em, 'a')} | {mean(f1, 'a')} | {gain(em['pooled'])} | {gain(f1['pooled'])} |")
    seeds_note = ("the untrained team scores the same in each, trained is the seed mean with its t-interval"
                  if fixed_base else "base and trained are seed means with their t-intervals")
    default_benches = " and ".join(k for k in rows[ROWS[0][1]] if k != BENCH)
    if len(ns) != 1:
        raise ValueError(f"rows answer different numbers of questions: {sorted(ns)}")
    level = round(held.get("level", 0.95) * 100)
    # the link is for people: the study's page (README.md, else its seeds table); the numbers are the JSON's
    readable = [p for p in (seeds_path.parent / "README.md", seeds_path.with_suffix(".md")) if p.exists()]
    rel_md = (readable[0] if readable else seeds_path).relative_to(ROOT).as_posix()
    out += ["", textwrap.fill(f"Default data: the committed run on {ns.pop()} {default_benches} dev questions per row "
            f"([reports/eval.md](reports/eval.md) has every row, its cost and two decimals). Whole points, "
            f"{level} % bootstrap intervals over questions; a gain is paired (the same questions) and **bold** where "
            f"its interval excludes 0. Trained: MAPS's three agents in turn; the other four warm up on oracle traces "
            f"(SFT), then RL. Held-out: {' and '.join(names.get(b, b) for b in benches)} (`mirror:` data), "
            f"{n_seeds} MAPS training seeds; {seeds_note}, the gain a pooled paired bootstrap ([{rel_md}]({rel_md})). "
            f"Generated by `scripts/readme_results.py`.", width=116, break_on_hyphens=False, break_long_words=False)]
    return "\n".join(out)


def runtime_block() -> str:
    logs = [p for top in STUDY_DIRS for p in (ROOT / top).glob("**/*stages.log") if "default_repro" in p.as_posix()]
    if not logs:
        raise FileNotFoundError("no default_repro ... stages.log under studies/")

    def started(p: Path) -> str:
        m = re.match(r"start (\S+)", p.read_text(encoding="utf-8").splitlines()[0])
        return m.group(1) if m else ""

    log = max(logs, key=started)
    m = re.search(r"^end \S+ rc 0 elapsed (\d+) s", log.read_text(encoding="utf-8"), re.M)
    if not m:
        raise ValueError(f"{log}: no 'end ... rc 0 elapsed N s' line")
    rel = log.relative_to(ROOT).as_posix()
    return f"the committed `make repro` took {round(int(m.group(1)) / 60)} min ([log]({rel}))"


BLOCKS = {"results": results_block, "runtime": runtime_block}


def span(text: str, name: str) -> tuple[int, int]:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"README.md has no {start} ... {end} pair")
    return i + len(start), j


def current(text: str, name: str) -> str:
    i, j = span(text, name)
    return text[i:j].strip("\n")


def rewrite(text: str) -> str:
    for name, make in BLOCKS.items():
        i, j = span(text, name)
        body = make()
        inline = "\n" not in text[i:j]            # an inline block stays on its line
        text = text[:i] + (body if inline else f"\n{body}\n") + text[j:]
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite README.md between the markers")
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md's blocks are stale")
    args = ap.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    if args.write or args.check:
        new = rewrite(text)
        if args.check:
            if new != text:
                print("README.md's generated blocks are stale: python scripts/readme_results.py --write",
                      file=sys.stderr)
                return 1
            return 0
        if new != text:
            README.write_text(new, encoding="utf-8")
        return 0
    for name, make in BLOCKS.items():
        print(f"<!-- {name} -->\n{make()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
