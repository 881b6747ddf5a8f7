"""Each trained MAPS agent against its base model, alone, on held-out questions: a hand-run wrapper around the
`evaluate_agents` stage (`ragteam.eval.agents`), for runs outside the DAG (other n, a subset of agents, another
output path). README figures come from the stage (`dvc repro evaluate_agents`), not from this script.

    .venv/bin/python studies/agents_heldout/agents_heldout.py --n 50 --out studies/agents_heldout/agents_heldout_<profile>.json

writes the stage's metrics to --out, its per-question scores to <out>.questions.json and its report to <out>.md.
(The JSON files of earlier runs in studies/ predate the stage: no intervals, per-benchmark loops.)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ragteam.agents.maps_workflow import MapsConfig  # noqa: E402
from ragteam.config import load_params, parse_section  # noqa: E402
from ragteam.eval.agents import ROLE, EvalAgentsConfig  # noqa: E402
from ragteam.eval.evaluate import EvalConfig  # noqa: E402
from ragteam.llm import LLMConfig  # noqa: E402


def config(params: dict, n: int | None, agents: str | None) -> EvalAgentsConfig:
    """params.yaml's eval_agents section with --n / --agents applied (validated like the params)."""
    cfg = parse_section(params, "eval_agents", EvalAgentsConfig).model_dump()
    if n is not None:
        cfg["n_questions"] = n
    if agents is not None:
        cfg["agents"] = [x.strip() for x in agents.split(",") if x.strip()]
        unknown = sorted(set(cfg["agents"]) - set(ROLE))
        if unknown:
            raise SystemExit(f"--agents: unknown {unknown}; choose from {sorted(ROLE)}")
    return EvalAgentsConfig.model_validate(cfg)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="questions per benchmark (default: eval_agents.n_questions)")
    ap.add_argument("--agents", default=None, help="comma-separated subset of answer,query,judge")
    ap.add_argument("--out", required=True, help="metrics JSON path (the report and questions go beside it)")
    a = ap.parse_args(argv)
    from stages.evaluate_agents import run, trained_checkpoints

    params = load_params()
    out = Path(a.out)
    run(parse_section(params, "llm", LLMConfig), parse_section(params, "maps", MapsConfig),
        config(params, a.n, a.agents), trained_checkpoints(parse_section(params, "eval", EvalConfig)),
        metrics=out, questions=out.with_suffix(".questions.json"), report=out.with_suffix(".md"))


if __name__ == "__main__":
    main()
