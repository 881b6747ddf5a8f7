"""Each trained MAPS agent against its base model, alone, on held-out questions (the `evaluate_agents` stage).

Every question gets one retrieval with the question as the query (top-k of the retriever, the pool rendered as MAPS
inference renders it). Then, with greedy decoding and one batched engine call per agent and model over all
benchmarks' questions together:

- answer agent: EM / F1 / Acc and answer length of the base and the trained answer agent over that pool;
- query agent: the base and the trained query agent each propose one new query, scored by the training reward
  ΔF1 = F1(y_{n+1}) - F1(y_n) of the frozen trained answer agent with and without the query's chunks
  (`ragteam.train.maps.AnswerPairs`, the code train_query scores with); mean ΔF1 and the shares of positive / zero /
  negative rewards, malformed queries and queries that added no chunk;
- judge agent: the base and the trained judge decide Sufficient / Insufficient over the pool; the reference is
  whether the trained answer agent's greedy answer over that pool is correct (Acc, label_judge's default metric).
  A greedy answer stands in for label_judge's 16-sample unanimity (16x the generations); a malformed verdict counts
  as wrong. Accuracy, balanced accuracy, the share of Sufficient verdicts.

This isolates each agent from the other two, on more questions than the evaluate stage. Every tested metric
(`TESTED`) gets a percentile bootstrap interval per model and a paired bootstrap of trained - base over the same
questions; "avg" resamples each benchmark within itself and averages benchmarks unweighted. The per-question
scores are returned too, so seed replicates can be pooled (`studies.replicate`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from ragteam.agents import maps
from ragteam.agents.maps_workflow import MapsConfig
from ragteam.config import Strict
from ragteam.train.synthesis import sample_answers, single_retrieval_pools
from ragteam.eval import stats
from ragteam.metrics import accuracy, exact_match, f1_score, has_answer
from ragteam.eval.stats import BootstrapConfig
from ragteam.llm import EnginePool, SamplingConfig
from ragteam.retrieval.base import Retriever
from ragteam.rewards.maps import delta_f1
from ragteam.train.maps import AnswerPairs

Agent = Literal["answer", "query", "judge"]
ROLE = {"answer": "answer_agent", "query": "query_agent", "judge": "judge_agent"}
MODELS = ("base", "trained")
# metrics with intervals and a paired trained - base test; the other reported rates are descriptive
TESTED = {"answer": ("em", "f1", "acc", "no_answer"), "query": ("mean_delta_f1",),
          "judge": ("accuracy", "balanced_accuracy")}


class EvalAgentsConfig(Strict):
    """The `eval_agents` section of params.yaml (the trained checkpoints come from eval.agents)."""

    benchmarks: list[str] | Literal["all"] = "all"  # names under data/prepared/benchmarks; "all": every file there
    n_questions: int = Field(100, ge=1)             # first n questions of each benchmark
    retriever: str = "data/indexes/bm25/bm25s"       # the single retrieval every agent sees
    agents: list[Agent] = Field(default_factory=lambda: ["answer", "query", "judge"], min_length=1)
    bootstrap: BootstrapConfig = BootstrapConfig()


def _pct(x: float, n: int) -> float:
    return round(100 * x / max(n, 1), 2) + 0.0


# ---- per-question scores (what the bootstrap resamples) and their plain summaries --------------------------------

def answer_questions(answers: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, list[float]]:
    return {"em": [exact_match(y, g) for y, g in zip(answers, golds)],
            "f1": [f1_score(y, g) for y, g in zip(answers, golds)],
            "acc": [accuracy(y, g) for y, g in zip(answers, golds)],
            "no_answer": [float(not has_answer(y)) for y in answers],   # unparsable outputs are "" (sample_answers)
            "words": [float(len(y.split())) for y in answers]}


def answer_scores(answers: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """EM / F1 / Acc and the share of questions without an answer in percent, and mean answer length in words."""
    return _plain("answer", answer_questions(answers, golds))


def query_questions(texts: Sequence[str], rows: Sequence[dict], pools, pairs: AnswerPairs) -> dict[str, list]:
    """ΔF1 of the frozen answer agent per proposed query (0 for a malformed one), whether the query was malformed,
    whether it added no chunk, and the F1 after it."""
    before = pairs.stats["no_new_chunks"]
    metas = [{"question": r["question"], "pool": p.to_dict()} for r, p in zip(rows, pools)]
    y_next, y_prev = pairs(list(texts), metas)
    added = pairs.stats["no_new_chunks"] - before
    malformed = [not (isinstance(q, str) and q.strip()) for q in map(maps.parse_query, texts)]
    return {"delta_f1": [delta_f1(a, b, r["golden_answers"]) for a, b, r in zip(y_next, y_prev, rows)],
            "malformed": [float(m) for m in malformed],
            "f1_after": [f1_score(y, r["golden_answers"]) for y, r in zip(y_next, rows)],
            "no_new_chunks": float(added)}


def query_scores(q: Mapping[str, list]) -> dict[str, float]:
    d, n = q["delta_f1"], len(q["delta_f1"])
    return {"mean_delta_f1": _pct(sum(d), n), "positive": _pct(sum(x > 0 for x in d), n),
            "zero": _pct(sum(x == 0 for x in d), n), "negative": _pct(sum(x < 0 for x in d), n),
            "malformed": _pct(sum(q["malformed"]), n), "no_new_chunks": _pct(q["no_new_chunks"], n),
            "f1_after": _pct(sum(q["f1_after"]), n)}


def judge_questions(texts: Sequence[str], reference: Sequence[bool]) -> dict[str, list[float]]:
    said = [v if isinstance(v, str) else None for v in map(maps.parse_judge, texts)]
    return {"right": [float(s is not None and (s == maps.SUFFICIENT) == bool(ref)) for s, ref in zip(said, reference)],
            "sufficient": [float(s == maps.SUFFICIENT) for s in said],
            "malformed": [float(s is None) for s in said],
            "reference": [float(bool(r)) for r in reference]}


def judge_scores(texts: Sequence[str], reference: Sequence[bool]) -> dict[str, float]:
    """Accuracy, balanced accuracy (mean recall over the reference classes present), share of Sufficient verdicts,
    malformed verdicts (counted wrong) and Sufficient references, in percent."""
    return _judge_summary(judge_questions(texts, reference))


def _judge_summary(q: Mapping[str, list[float]]) -> dict[str, float]:
    n = len(q["right"])
    bal = stats.balanced_accuracy_statistic(q["right"], q["reference"])
    everyone = stats.np.arange(n)[None, :]  # every question once: the data as drawn
    return {"accuracy": _pct(sum(q["right"]), n), "balanced_accuracy": round(100 * float(bal(everyone)[0]), 2) + 0.0,
            "said_sufficient": _pct(sum(q["sufficient"]), n), "malformed": _pct(sum(q["malformed"]), n),
            "reference_sufficient": _pct(sum(q["reference"]), n)}


def metric_statistic(agent: str, metric: str, q: Mapping[str, list], sizes: Sequence[int]) -> stats.Statistic:
    """The bootstrap statistic of one tested metric over one model's per-question scores (groups = benchmarks)."""
    if agent == "answer":
        return stats.mean_statistic(q[metric], sizes)
    if agent == "query":
        return stats.mean_statistic(q["delta_f1"], sizes)
    if metric == "accuracy":
        return stats.mean_statistic(q["right"], sizes)
    return stats.balanced_accuracy_statistic(q["right"], q["reference"], sizes)


# ---- the run --------------------------------------------------------------------------------------------------------

def _greedy(sampling: Mapping[str, SamplingConfig], role: str) -> SamplingConfig:
    base = sampling.get(role) or sampling.get("default") or SamplingConfig()
    return SamplingConfig(max_new_tokens=base.max_new_tokens, temperature=0.0)


def run_agents(qa: Mapping[str, Sequence[dict]], engines: EnginePool, base_model: str, trained: Mapping[str, str],
               retriever: Retriever, maps_cfg: MapsConfig, sampling: Mapping[str, SamplingConfig],
               agents: Sequence[str] = ("answer", "query", "judge")) -> dict[str, dict]:
    """Per-question scores {benchmark: {"ids", "examples", agent: {base|trained: {...}}}} of each agent's base and
    trained model.

    `trained` maps an agent (answer / query / judge) to its checkpoint; the trained answer agent is needed for the
    query agent's reward and the judge's reference, whichever agents are evaluated. Every generation step is one
    engine call over all benchmarks' questions; the query agent's ΔF1 is one batched search and one engine call per
    benchmark (so that its no-new-chunk count is known per benchmark).
    """
    missing = sorted({*agents, "answer"} - set(trained))
    if missing:
        raise ValueError(f"no trained checkpoint for {missing} (eval.agents)")
    rows = [r for b in qa for r in qa[b]]
    golds = [r["golden_answers"] for r in rows]
    slices, start = {}, 0
    for b in qa:
        slices[b], start = slice(start, start + len(qa[b])), start + len(qa[b])
    pools = single_retrieval_pools(rows, retriever, maps_cfg.top_k)
    rendered = [p.render(maps_cfg.passage_words) for p in pools]
    frozen = engines.team({"answer_agent": trained["answer"]}, base_model, {})
    trained_answers = [a[0] for a in sample_answers(frozen, "answer_agent", rows, pools,
                                                    _greedy(sampling, "answer_agent"), maps_cfg.passage_words)]
    reference = [bool(accuracy(y, g)) for y, g in zip(trained_answers, golds)]
    pairs = AnswerPairs(frozen, retriever, maps_cfg.top_k, maps_cfg.passage_words, maps_cfg.max_chunks)
    per: dict[str, dict] = {b: {"ids": [str(r.get("id", i)) for i, r in enumerate(qa[b])],
                                "examples": {"golds": golds[sl][:2]}} for b, sl in slices.items()}
    for agent in agents:
        role = ROLE[agent]
        for b in per:
            per[b][agent], per[b]["examples"][agent] = {}, {}
        for name in MODELS:
            team = engines.team({role: trained[agent]} if name == "trained" else {}, base_model, {})
            if agent == "answer":
                out = trained_answers if name == "trained" else [
                    a[0] for a in sample_answers(team, role, rows, pools, _greedy(sampling, role),
                                                 maps_cfg.passage_words)]
            else:
                build = maps.query_messages if agent == "query" else maps.judge_messages
                gens = team.generate(role, [build(r["question"], s) for r, s in zip(rows, rendered)],
                                     _greedy(sampling, role))
                out = [g[0].text for g in gens]
            for b, sl in slices.items():
                per[b][agent][name] = (answer_questions(out[sl], golds[sl]) if agent == "answer" else
                                       query_questions(out[sl], rows[sl], pools[sl], pairs) if agent == "query" else
                                       judge_questions(out[sl], reference[sl]))
                per[b]["examples"][agent][name] = out[sl][:2]
    return per


# ---- summaries: scores, intervals, paired differences --------------------------------------------------------------

def _plain(agent: str, q: Mapping[str, list]) -> dict[str, float]:
    if agent == "answer":
        n = len(q["em"])
        return {**{k: _pct(sum(q[k]), n) for k in ("em", "f1", "acc") + (("no_answer",) if "no_answer" in q else ())},
                "words": round(sum(q["words"]) / max(n, 1), 2)}
    return query_scores(q) if agent == "query" else _judge_summary(q)


def _concat(qs: Sequence[Mapping[str, object]]) -> dict[str, list]:
    return {k: [x for q in qs for x in q[k]] for k, v in qs[0].items() if isinstance(v, list)}


def _block(agent: str, q: Mapping[str, Mapping[str, list]], plain: Mapping[str, dict], sizes: Sequence[int],
           cfg: BootstrapConfig) -> dict:
    """{base, trained: plain scores + <metric>_ci, diff: {metric: trained - base, paired}} for one agent."""
    out: dict = {name: dict(plain[name]) for name in MODELS}
    out["diff"] = {}
    kw = {"resamples": cfg.resamples, "seed": cfg.seed, "level": cfg.level}
    for metric in TESTED[agent]:
        if agent == "answer" and metric not in q["base"]:   # per-question files written before the metric existed
            continue
        st = {name: metric_statistic(agent, metric, q[name], sizes) for name in MODELS}
        for name in MODELS:
            iv = stats.statistic_interval(st[name], sizes, **kw)
            out[name][metric] = iv.estimate  # exact also for "avg" (the plain avg averages rounded values)
            out[name][f"{metric}_ci"] = [iv.lo, iv.hi]
        out["diff"][metric] = stats.difference(st["trained"], st["base"], sizes, **kw).to_dict()
    return out


def summarize_agents(per: Mapping[str, Mapping], cfg: BootstrapConfig) -> dict[str, dict]:
    """metrics/eval_agents.json: {benchmark | "avg": {"n", agent: {base, trained, diff}}}; "avg" resamples each
    benchmark within itself and averages benchmarks unweighted (descriptive rates: the mean over benchmarks)."""
    benches = list(per)
    agents = [a for a in ROLE if a in per[benches[0]]]
    out: dict[str, dict] = {}
    for b in benches:
        out[b] = {"n": len(per[b]["ids"])}
        for agent in agents:
            q = per[b][agent]
            out[b][agent] = _block(agent, q, {name: _plain(agent, q[name]) for name in MODELS}, [out[b]["n"]], cfg)
    sizes = [out[b]["n"] for b in benches]
    out["avg"] = {"n": sum(sizes)}
    for agent in agents:
        q = {name: _concat([per[b][agent][name] for b in benches]) for name in MODELS}
        plain = {name: {k: round(sum(out[b][agent][name][k] for b in benches) / len(benches), 2) + 0.0
                        for k in _plain(agent, per[benches[0]][agent][name])} for name in MODELS}
        out["avg"][agent] = _block(agent, q, plain, sizes, cfg)
    return out


LABELS = {"em": "EM", "f1": "F1", "acc": "Acc", "no_answer": "no answer %", "words": "words per answer", "mean_delta_f1": "mean ΔF1 ×100",
          "positive": "ΔF1 > 0 %", "zero": "ΔF1 = 0 %", "negative": "ΔF1 < 0 %", "malformed": "malformed %",
          "no_new_chunks": "no new chunk %", "f1_after": "answer F1 after the query",
          "accuracy": "accuracy", "balanced_accuracy": "balanced accuracy", "said_sufficient": "says Sufficient %",
          "reference_sufficient": "reference Sufficient %"}


def _md(x: object) -> str:
    """A model output inline in markdown: quoted, no table pipes or backticks."""
    return f"`{str(x)!r}`".replace("|", "/") if "`" not in str(x) else repr(str(x)).replace("|", "/")


def _ci(v: float, ci: Sequence[float] | None) -> str:
    return f"{v:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{v:.2f}"


def report_markdown(metrics: Mapping[str, Mapping], per: Mapping[str, Mapping], settings: Mapping[str, object],
                    cfg: BootstrapConfig) -> str:
    """reports/eval_agents.md: per agent, base vs trained with intervals and the paired difference; descriptive
    rates; a few example outputs; the settings."""
    from ragteam.eval.report import display

    cols = list(metrics)
    name = lambda b: "Avg" if b == "avg" else display(b)  # noqa: E731
    pct = f"{100 * cfg.level:g} %"
    parts = ["# Each MAPS agent alone: base model vs trained agent", "",
             "One retrieval with the question as the query, greedy decoding. Answer agent: scored against the golden "
             "answers. Query agent: ΔF1 of the frozen trained answer agent with and without the proposed query's "
             "chunks (the train_query reward). Judge: right when its verdict matches whether the trained answer "
             "agent's greedy answer is correct (Acc); a malformed verdict is wrong.", "",
             f"Intervals: percentile bootstrap over questions, {cfg.resamples:,} resamples, seed {cfg.seed}, "
             f"{pct}; trained − base is a paired bootstrap (the same resampled questions for both). **Bold †**: 0 "
             f"lies outside the interval. Avg: each benchmark resampled within itself, benchmarks averaged "
             f"unweighted.", "",
             "Questions: " + ", ".join(f"{name(b)} {metrics[b]['n']}" for b in cols if b != "avg") + ".", ""]
    for agent in (a for a in ROLE if a in metrics[cols[0]]):
        parts += [f"## {agent} agent", "", "| metric | benchmark | base | trained | trained − base |",
                  "|---|---|---:|---:|---:|"]
        for metric in (m for m in TESTED[agent] if m in metrics[cols[0]][agent]["diff"]):
            for b in cols:
                m = metrics[b][agent]
                d = m["diff"][metric]
                cell = f"{'+' if d['diff'] > 0 else ''}{d['diff']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"
                parts.append(f"| {LABELS[metric]} | {name(b)} | {_ci(m['base'][metric], m['base'][f'{metric}_ci'])} "
                             f"| {_ci(m['trained'][metric], m['trained'][f'{metric}_ci'])} | "
                             f"{f'**{cell}** †' if d['significant'] else cell} |")
        others = [k for k in metrics[cols[0]][agent]["base"] if k not in TESTED[agent] and not k.endswith("_ci")]
        if others:
            parts += ["", "| " + " | ".join(["benchmark", *(f"{LABELS[k]} (base → trained)" for k in others)])
                      + " |", "|---|" + "---:|" * len(others)]
            for b in cols:
                m = metrics[b][agent]
                parts.append("| " + " | ".join([name(b), *(f"{m['base'][k]:.2f} → {m['trained'][k]:.2f}"
                                                           for k in others)]) + " |")
        parts += ["", "Examples (first two questions of each benchmark, base | trained):", ""]
        for b in per:
            ex = per[b]["examples"]
            for i, gold in enumerate(ex["golds"]):
                parts.append(f"- {name(b)} (gold {_md(' / '.join(gold))}): {_md(ex[agent]['base'][i])} | "
                             f"{_md(ex[agent]['trained'][i])}")
        parts.append("")
    parts += ["| setting | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in settings.items()), ""]
    return "\n".join(parts)
