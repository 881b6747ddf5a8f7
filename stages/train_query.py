"""Stage train_query (MAPS Algorithm 1 step 5): GRPO for the query agent on T2 with R_q = ΔF1 (Eq. 7).

Each sampled query is sanitised (the MAPS query parser), retrieved, and the frozen trained answer agent
(models/agents/answer) answers with and without its chunks; both answers come from batched engine calls and are
cached per (question, pool) (`ragteam.train.maps.AnswerPairs`). The share of zero rewards is reported.
Writes models/agents/query, the curves reports/training/train_query/ (DVCLive; + PNG), metrics/train_query.json.
"""
from __future__ import annotations

from ragteam.agents.maps_workflow import MapsConfig
from ragteam.systems.maps import config as maps_config
from ragteam.config import ParamsError, parse_section
from ragteam.io import DataError
from ragteam.llm import EnginePool, LLMConfig
from ragteam.train.curves import curve_rows
from ragteam.train.grpo import train_grpo
from ragteam.train.maps import AnswerPairs, query_reward_func, query_samples
from stages.common import (AGENTS, CHECKPOINTS, JOBS, SYNTHESIS, OpenRLHFParams, TrainQueryParams,
                                 finish_agent, load_rows, run_openrlhf, stage_main)

STAGE, AGENT = "train_query", "query"
T2 = SYNTHESIS / "t2_query.jsonl"
ANSWER_AGENT = AGENTS / "answer"


def run(tp: TrainQueryParams, llm: LLMConfig, maps_cfg: MapsConfig, retriever_path: str,
        orl: OpenRLHFParams | None = None, retriever=None) -> dict:
    rows = load_rows(T2, "query-agent data T2, stage synthesize")
    if tp.max_samples:
        rows = rows[: tp.max_samples]
    samples = query_samples(rows, maps_cfg.passage_words, where=str(T2))
    if not (ANSWER_AGENT / "config.json").is_file():
        raise DataError(f"{ANSWER_AGENT}: the trained answer agent is missing (stage train_answer)")
    print(f"{STAGE}: {len(samples)} T2 samples, frozen answer agent {ANSWER_AGENT}, backend {tp.backend}",
          flush=True)
    if tp.backend == "openrlhf":
        return run_openrlhf_backend(tp, llm, maps_cfg, retriever_path, samples, orl)
    if retriever is None:
        from ragteam.retrieval import open_retriever

        retriever = open_retriever(retriever_path)
    team = EnginePool(llm).team({"answer_agent": str(ANSWER_AGENT)}, llm.model, llm.sampling)
    pairs = AnswerPairs(team, retriever, maps_cfg.top_k, maps_cfg.passage_words, maps_cfg.max_chunks)
    result = train_grpo(samples, llm.model, str(CHECKPOINTS / STAGE), tp.grpo, query_reward_func(pairs),
                        run_tag={"reward": "Eq. 7 delta F1", "answer_agent": _identity(ANSWER_AGENT),
                                 "retriever": retriever_path, "top_k": maps_cfg.top_k,
                                 "passage_words": maps_cfg.passage_words}, engine_cfg=llm)
    curve = curve_rows(result.log_history)
    extra = {"samples": len(samples), **{f"{col}_rate": _mean_over_steps(curve, col) for col in
                                         ("delta_f1_zero", "delta_f1_positive", "query_malformed",
                                          "query_no_new_chunks")}}
    # engine-side counters of this process only (all 0 after a no-op resume); the rates above come from the
    # checkpointed log history and cover every step
    session = {f"answer_pairs_{k}": v for k, v in pairs.stats.items()}
    return finish_agent(
        result, curve, stage=STAGE, agent=AGENT, base_model=llm.model, backend=f"trl/{tp.grpo.trainer}",
        data={"t2_query": T2, "answer_agent": ANSWER_AGENT / "model.safetensors"},
        params={**tp.model_dump(), "retriever": retriever_path, "top_k": maps_cfg.top_k,
                "passage_words": maps_cfg.passage_words},
        reward="R_q = F1(y_{n+1}, y*) - F1(y_n, y*) (Eq. 7): the frozen answer agent (greedy) with and without "
               "the chunks the sanitised query retrieves; a malformed query retrieves nothing (reward 0)",
        extra_metrics=extra, session_metrics=session, title="query agent (ΔF1 reward)",
        notes=f"ΔF1 was zero for {extra['delta_f1_zero_rate']} of the sampled queries (mean over steps).")


def _mean_over_steps(curve: list[dict], col: str) -> float | None:
    ys = [r[col] for r in curve if col in r]
    return round(sum(ys) / len(ys), 4) if ys else None


def _identity(path) -> str:
    from ragteam.io import sha256_file

    return sha256_file(path / "model.safetensors")


def run_openrlhf_backend(tp, llm, maps_cfg, retriever_path, samples, orl) -> dict:
    from transformers import AutoTokenizer

    from ragteam.train.openrlhf import prepare_query_grpo_job

    if orl is None:
        raise ParamsError("train_query.backend is openrlhf but params.yaml has no `openrlhf` section")
    job = prepare_query_grpo_job(
        samples, JOBS / STAGE, model_path=llm.model, output_dir=str(AGENTS / AGENT), params=tp.grpo,
        answer_model=str(ANSWER_AGENT), retriever=retriever_path, top_k=maps_cfg.top_k,
        passage_words=maps_cfg.passage_words, max_chunks=maps_cfg.max_chunks,
        special_tokens=AutoTokenizer.from_pretrained(llm.model).all_special_tokens, cluster=orl)
    run_openrlhf([job], STAGE, orl)
    return {"backend": "openrlhf", "samples": len(samples)}


def from_params(params: dict) -> dict:
    tp = parse_section(params, STAGE, TrainQueryParams)
    orl = parse_section(params, "openrlhf", OpenRLHFParams) if tp.backend == "openrlhf" else None
    return run(tp, parse_section(params, "llm", LLMConfig).for_stage(STAGE), maps_config(params),
               tp.retriever, orl)


def main() -> None:
    stage_main(STAGE, AGENT, from_params, engines=True)


if __name__ == "__main__":
    main()
