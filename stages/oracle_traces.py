"""Stage oracle_traces@<system> (issue 25 §1): the oracle team plays every role of a joint system from the gold hops
of the first `warmup.questions` training-pool questions, through the rollouts' own workflow and rewards, and
writes the complete episodes as validated SFT rows (`ragteam.warmup.traces`).

Usage: python -m stages.oracle_traces <system> (dvc.yaml: `foreach: ${joint.systems}`). Writes
data/warmup/<system>/traces.jsonl and summary.json (yield, rows per role, longest output per role against its
budget). Evaluation questions are refused by id and text. No LLM runs: the tokenizer counts the tokens.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ragteam.config import ParamsError, load_params, parse_section
from ragteam.environment import run_record
from ragteam.io import DataError, write_json
from ragteam.llm import LLMConfig

POOL = Path("data/prepared/train/pool.jsonl")
CORPUS = Path("data/prepared/corpus.jsonl")
BENCHMARKS = Path("data/prepared/benchmarks")
TRACES = Path("data/warmup")
# the run's record beside the cached traces (its counts and the environment that ran it, which `ragteam lineage`
# shows): a plain output, so recording it leaves data/warmup/<system>, which the warm-up and RL read, as it was
RUN_RECORD = "metrics/oracle_traces_{system}.json"


def run(system_name: str, params: dict) -> dict:
    from transformers import AutoTokenizer

    from ragteam.retrieval import open_retriever
    from ragteam.systems.registry import oracle_system
    from ragteam.warmup.traces import write_system_traces

    questions = (params.get("warmup") or {}).get("questions")   # the whole section is warmup_joint's (WarmupParams)
    if not isinstance(questions, int) or isinstance(questions, bool) or questions < 0:
        raise ParamsError(f"params.yaml: warmup.questions must be an integer >= 0 (0 = the whole pool), got "
                          f"{questions!r}")
    llm = parse_section(params, "llm", LLMConfig)
    system = oracle_system(system_name, params)   # an unknown system fails here, before the tokenizer and index load
    for path, stage in ((POOL, "prepare_data"), (CORPUS, "prepare_data"), (BENCHMARKS, "prepare_data")):
        if not path.exists():
            raise DataError(f"{path}: missing; run stage {stage} first (dvc repro)")
    retriever = open_retriever(params["joint"]["retriever"], corpus=CORPUS)
    return write_system_traces(system, POOL, CORPUS, retriever, BENCHMARKS,
                               AutoTokenizer.from_pretrained(llm.model), params, TRACES / system_name,
                               questions)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m stages.oracle_traces <system>   (a name in joint.systems)")
    name = sys.argv[1]
    try:
        summary = run(name, load_params())
    except (ParamsError, DataError, ValueError, OSError) as e:
        sys.exit(f"oracle_traces@{name} FAILED ({TRACES / name} left untouched): {e}")
    write_json(RUN_RECORD.format(system=name), {
        **{k: summary[k] for k in ("questions", "complete", "yield", "rows", "rows_per_role", "dropped")
           if k in summary}, **run_record()})
    print(f"oracle_traces@{name}: {summary['complete']}/{summary['questions']} questions traced (yield "
          f"{summary['yield']}), {summary['rows']} rows {summary['rows_per_role']}; dropped "
          f"{summary['dropped'] or 'none'}", flush=True)


if __name__ == "__main__":
    main()
