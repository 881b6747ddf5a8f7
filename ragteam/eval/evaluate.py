"""Evaluation: run configured systems on benchmark questions, score Episodes, aggregate accuracy and cost.

Scores are FlashRAG's (`ragteam.metrics`): EM, F1 and accuracy (gold contained in the prediction), each the
max over the golden answers; summaries report them in percent, like MAPS Table 1. DECOR systems (and every system
with `eval.lj: all`) also get LJ, DECOR's judged answer equivalence, from the judge of `decor.judge` (the registry's
one LJ judge, `ragteam.systems.registry.lj_judge`). Cost is per
question: LLM calls, prompt and completion tokens, retrieval calls and wall seconds (see `ragteam.agents.core`); the
judge's calls are not part of a system's cost.

Silence is a result: per question, `no_answer` (the final answer is empty after normalisation: nothing was
answered, so EM = F1 = 0 by construction) and `format_error_questions` (any call of the question broke its role's
format, whatever fallback the workflow then applied, the answer fallback's resampling included:
`resampled_questions` counts those, `resampled_answered` those where a draw answered); both are summarised in
percent with intervals and paired differences like EM and F1. `no_answer_reason` says why a question has no answer, so a zero score reads as what it
is (a workflow's documented fallback such as SuRe's "no candidate, empty answer", or a model that wrote nothing
parseable).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, create_model, field_validator, model_validator

from ragteam.agents.baselines import BaselineConfig
from ragteam.config import ParamsError, Strict
from ragteam.eval import stats
from ragteam.eval.stats import BootstrapConfig
from ragteam.llm import EnginePool, SamplingConfig, Team
from ragteam.metrics import answer_metrics, has_answer
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import set_team_rewards
from ragteam.systems.registry import agent_roles, config_sections, lj_judge, row_kinds as system_row_kinds, team_reward
from ragteam.systems.spec import RowKind


def _agent_role(role: str) -> str:
    if role not in agent_roles():
        raise ValueError(f"{role!r} is not a role with trained checkpoints (known: {', '.join(agent_roles())})")
    return role


# a role with trained checkpoints (eval.agents): one of the registered systems' `agent_roles`
AgentRole = Annotated[str, AfterValidator(_agent_role)]


def row_kinds() -> dict[str, RowKind]:
    """Every evaluation row kind (`SystemSpec.workflow`): the registered systems' (`System.rows`)."""
    return system_row_kinds()


def row_kind(workflow: str) -> RowKind:
    return row_kinds()[workflow]


ROLES = {k: r.roles for k, r in row_kinds().items()}
# helper roles that are never trained: a system's `model` does not move them (they run on the base model, or on
# their own checkpoint from DecorConfig.frozen_roles)
FROZEN_ROLES = tuple(dict.fromkeys(r for k in row_kinds().values() for r in k.frozen_roles))
SCORE_KEYS = ("em", "f1", "acc")
# per-question 0/1 flags, summarised in percent like the scores (module docstring)
SILENCE_KEYS = ("no_answer", "format_error_questions")
# summarised only where every episode has them: LJ (DECOR's judged accuracy); the joint systems' own training
# reward per question (`ragteam.rewards.team`), reported x100 like the scores so its intervals and paired
# differences come from the same bootstrap
OPTIONAL_SCORE_KEYS = ("lj", "team_reward")
COST_KEYS = ("llm_calls", "prompt_tokens", "completion_tokens", "tokens", "retrieval_calls", "seconds")


class SystemSpec(Strict):
    """One row of the results table."""

    workflow: str                             # a row kind (`row_kinds`)
    trained_agents: bool = False              # roles listed in eval.agents use those checkpoints
    base_roles: list[AgentRole] = Field(default_factory=list)  # ... except these, which use the base model (Table 2)
    fixed_rounds: int | None = Field(None, ge=1)  # maps: override maps.fixed_rounds (Table 3)
    model: str | None = None                  # every trained role of the workflow on this checkpoint (jointly trained
                                              # teams); the FROZEN_ROLES stay where they were
    n_questions: int | None = Field(None, ge=1)  # first n of each benchmark for this row; None = eval.n_questions
    # every role of the workflow decodes under its format's regex (guided decoding, `ragteam.agents.grammars`; the
    # vllm engine only): the "<system>_grammar" rows, what a system loses to formatting alone
    grammar: bool = False
    # mask rows: the Answer agent after every turn (Algorithm 1) instead of once at the end (§3.3), so the row gets
    # M-ASK's own training reward (Eq. 2-3) as its team reward; the final answer is the same call on the same last K.
    # It costs an Answer call a turn, which the row's cost columns count. None: the `mask` section's
    answer_every_turn: bool | None = None

    @field_validator("workflow")
    @classmethod
    def _known_workflow(cls, v: str) -> str:
        if v not in row_kinds():
            raise ValueError(f"unknown workflow {v!r} (known: {', '.join(row_kinds())})")
        return v

    @model_validator(mode="after")
    def _every_turn_is_mask(self):
        if self.answer_every_turn is not None and "answer_every_turn" not in row_kind(self.workflow).settings:
            raise ValueError(f"answer_every_turn is an M-ASK row setting (workflow mask), not {self.workflow!r}")
        return self

    @model_validator(mode="after")
    def _grammar_has_a_table(self):
        from ragteam.systems.registry import grammars

        if self.grammar and self.workflow not in grammars():
            raise ValueError(f"grammar: true needs output grammars for workflow {self.workflow!r}; there are some "
                             f"for {', '.join(sorted(grammars()))}")
        return self


class EvalConfig(Strict):
    """The `eval` section of params.yaml."""

    benchmarks: list[str] | Literal["all"] = "all"  # names under data/prepared/benchmarks; "all": every file there
    n_questions: int = Field(20, ge=1)              # first n questions of each benchmark (a system may set its own)
    retriever: str = "bm25"                          # which index the retrieval systems search
    systems: dict[str, SystemSpec]
    agents: dict[AgentRole, str] = Field(default_factory=dict)  # trained agent checkpoints (by role)
    baselines: BaselineConfig = BaselineConfig()
    # [a, b] pairs: paired bootstrap of a - b per benchmark and on the average; None: `comparison_pairs` derives them
    compare: list[tuple[str, str]] | None = None
    bootstrap: BootstrapConfig = BootstrapConfig()
    # which rows get the LJ score: the rows that judge themselves (`RowKind.judged`: DECOR's), or all (the
    # registry's LJ judge, decor.judge, scores the others)
    lj: Literal["judged", "all"] = "judged"

    @model_validator(mode="after")
    def _compare_names_systems(self):
        for i, pair in enumerate(self.compare or []):
            unknown = [x for x in pair if x not in self.systems]
            if unknown or pair[0] == pair[1]:
                raise ValueError(f"eval.compare[{i}] = {list(pair)}: " + (f"{unknown} not in eval.systems "
                                 f"({sorted(self.systems)})" if unknown else "a system compared with itself"))
        return self

    @model_validator(mode="after")
    def _trained_qagent_has_a_checkpoint(self):
        for name, spec in self.systems.items():
            check = row_kind(spec.workflow).check
            if check is not None and (why := check(name, spec, self.agents)):
                raise ValueError(why)
        return self

    def questions_for(self, name: str) -> int:
        """How many questions of each benchmark system `name` answers (its own n_questions, else eval's)."""
        return self.systems[name].n_questions or self.n_questions

    def max_questions(self) -> int:
        return max([self.n_questions, *(self.questions_for(n) for n in self.systems)])


def role_models(spec: SystemSpec, agents: Mapping[str, str]) -> dict[str, str]:
    """role -> checkpoint for the roles that do not use the base model."""
    if spec.model is not None:
        return dict.fromkeys((r for r in row_kind(spec.workflow).roles if r not in FROZEN_ROLES), spec.model)
    if not spec.trained_agents:
        return {}
    return {role: path for role, path in agents.items() if role not in spec.base_roles}


JOINT_CHECKPOINTS = ("models/agents", "models/warmup")   # train_joint@<system> / warmup_joint@<system> write <dir>/<system>


def rows_without_their_stage(ev: EvalConfig, joint: Mapping) -> dict[str, str]:
    """The rows of `ev.systems` that read a checkpoint of a joint system the pipeline does not train: row -> why.

    `joint` is params.yaml's `joint` section. Its systems are the sub-sections other than `ppo`; the ones listed in
    `joint.systems` get `train_joint@` / `warmup_joint@` stages (dvc.yaml foreach), the others none, so a row whose
    role model is `models/agents/<x>` or `models/warmup/<x>` for such an x has nothing to read: the stage leaves it
    out and says so (and `evaluate`'s deps, the whole `models/agents` and `models/warmup` directories, do not name
    it)."""
    listed = set(joint.get("systems") or [])
    known = {k for k, v in joint.items() if isinstance(v, dict) and k != "ppo"} | listed
    out: dict[str, str] = {}
    for name, spec in ev.systems.items():
        used = role_models(spec, ev.agents)
        for path in (used[r] for r in row_kind(spec.workflow).roles if r in used):   # maps never loads eval.agents.qagent
            parts = Path(path).parts
            root, system = "/".join(parts[:2]), parts[2] if len(parts) == 3 else None
            if root in JOINT_CHECKPOINTS and system in known - listed:
                stage = "train_joint" if root == "models/agents" else "warmup_joint"
                out[name] = (f"reads {path}, which {stage}@{system} would write, but {system} is not in "
                             f"joint.systems {sorted(listed)}")
                break
    return out


def without_rows(ev: EvalConfig, dropped: Iterable[str]) -> EvalConfig:
    """`ev` without the rows `dropped`; an explicit `eval.compare` pair naming one of them is an error."""
    dropped = set(dropped)
    for i, pair in enumerate(ev.compare or []):
        if dropped & set(pair):
            raise ParamsError(f"params.yaml: eval.compare[{i}] = {list(pair)}: {sorted(dropped & set(pair))} left out (a joint "
                             f"system not in joint.systems); remove the pair or add the system to joint.systems")
    return ev.model_copy(update={"systems": {n: s for n, s in ev.systems.items() if n not in dropped}})


def make_team(engines: EnginePool, spec: SystemSpec, agents: Mapping[str, str], base_model: str,
              sampling: Mapping[str, SamplingConfig], frozen_roles: Mapping[str, str] | None = None) -> Team:
    """`frozen_roles`: helper roles on their own checkpoints whatever the system (DecorConfig.frozen_roles).
    A checkpoint dir that records a warm-up that was off (`<system>_warmup` rows, `ragteam.warmup.sft.start_model`)
    is the base model: the system started from it."""
    from ragteam.warmup.start import WARMUP_OFF, start_model

    models = {role: start_model(path, base_model) if (Path(path) / WARMUP_OFF).is_file() else path
              for role, path in role_models(spec, agents).items()}
    if spec.grammar:
        from ragteam.systems.registry import grammar_sampling

        sampling = grammar_sampling(spec.workflow, sampling)
    return engines.team({**(frozen_roles or {}), **models}, base_model, sampling)


class _WorkflowConfigs(Strict):
    """The params sections the workflows read, one object: `eval.baselines`, every registered system's own section
    (one field each, `WorkflowConfigs` below builds them from the registry), and the `joint` section as written."""

    baselines: BaselineConfig = BaselineConfig()
    # params.yaml's `joint` section as written: the training params a row's team reward reads (QAgent's plug-in
    # rows: joint.qagent.hit_weight, Eq. 10), validated by the system that reads it
    joint: dict[str, Any] = Field(default_factory=dict)
    # section -> its parsed params, for the systems registered after this model was built (a study's or a test's own
    # system, `System.section` / `System.config`): what their rows' `run` reads
    sections: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_params(cls, params: Mapping, baselines: BaselineConfig | None = None) -> WorkflowConfigs:
        """Every workflow section present in params.yaml, validated (a bad key names its section)."""
        from ragteam.config import parse_section

        fields: dict[str, Any] = {name: parse_section(params, name, cls.model_fields[name].annotation)
                                  for name in cls.model_fields if name not in _OWN and name in params}
        own = {section: parse_section(params, section, config) for section, config in config_sections().items()
               if section not in cls.model_fields and section in params}
        if own:
            fields["sections"] = own
        if params.get("joint"):
            fields["joint"] = dict(params["joint"])
        return cls(**fields, **({"baselines": baselines} if baselines is not None else {}))

    def section(self, name: str, default: Any = None) -> Any:
        """System section `name`'s params, whether it is a field (registered when this model was built) or in
        `sections` (registered later); `default` where params.yaml has none."""
        if name in type(self).model_fields and name not in _OWN:
            return getattr(self, name)
        return self.sections.get(name, default)


_OWN = ("baselines", "joint", "sections")
# one field per registered system's params section (`maps`, `mask`, `jade`, `decor`, `qagent`...), its defaults
# where params.yaml has none: a new system adds its section to its own `System`, not a field here
WorkflowConfigs = create_model("WorkflowConfigs", __base__=_WorkflowConfigs, __module__=__name__,
                               **{section: (config, config()) for section, config in config_sections().items()})


def run_system(spec: SystemSpec, rows: Sequence[dict], team: Team, retriever: Retriever | None,
               cfgs: WorkflowConfigs, name: str, lj: bool = False) -> list[Episode]:
    """Run one system's workflow on `rows` (all questions batched together) and score the Episodes.

    JADE episodes with golden answers also get their rewards (Eq. 6-8, `jade.reward`), so R_global is reported, and
    DECOR's their Eq. 2-3 rewards (`decor.reward`, judge `decor.judge`); every JADE, DECOR and QAgent episode with
    golds gets its system's training reward as `metrics["team_reward"]` (`ragteam.rewards.team`), and so does every
    M-ASK episode of a row that answers after every turn (`SystemSpec.answer_every_turn`). LJ is scored for DECOR
    systems and, with `lj`, for any system (judge: the registry's LJ judge, `cfgs.decor.judge`, on
    `team`; for DECOR from the same verdicts as its rewards)."""
    kind = row_kind(spec.workflow)
    if kind.retrieves and retriever is None:
        raise ValueError(f"system {name!r} ({spec.workflow}) needs a retriever")
    eps = kind.run(rows, team, retriever, cfgs, spec, name)
    eps = score_episodes(eps, lj_judge(cfgs, team) if lj and not kind.judged else None)
    if kind.post_score is not None:
        kind.post_score([ep for ep in eps if ep.golden_answers], team, cfgs)
    if has_team_reward(spec, cfgs):
        set_team_rewards(eps, spec.workflow, team_reward(spec.workflow), cfgs)
    return eps


def has_team_reward(spec: SystemSpec, cfgs: WorkflowConfigs) -> bool:
    """Whether a row's episodes get `metrics["team_reward"]`: JADE, DECOR and QAgent rows always, M-ASK rows that
    answer after every turn (`ragteam.rewards.team`)."""
    own = row_kind(spec.workflow).has_team_reward
    if own is not None:
        return own(spec, cfgs)
    return team_reward(spec.workflow) is not None


def silence(ep: Episode) -> dict[str, float]:
    """The per-question silence flags (module docstring): no answer, and a format error in any call."""
    return {"no_answer": float(not has_answer(ep.final_answer)),
            "format_error_questions": float(any(c.format_error is not None or "resampled" in c.meta
                                                for c in ep.calls))}


def resampled(ep: Episode) -> bool:
    """Some answering call of `ep` gave no answer and went to the answer fallback (`llm.answer_fallback`,
    `agents.core.resample_no_answers`): its broken output counts as a format error, whatever the draws gave."""
    return any("resampled" in c.meta for c in ep.calls)


def _error_kind(reason: str) -> str:
    """A parser's FormatError reason without the quoted model output it cites: "a lead-in without an answer:
    'The answer is:'" -> "a lead-in without an answer"."""
    return re.split(r"[:'\"]", reason, maxsplit=1)[0].strip() or reason.strip()


def no_answer_reason(ep: Episode) -> str | None:
    """Why `ep` has no answer (None when it has one): the workflow's own reason (`meta["no_answer_reason"]`, set
    where an empty answer is a documented fallback), else the last malformed call ("<role>: <what was wrong>"), else
    the last call, which answered nothing."""
    if has_answer(ep.final_answer):
        return None
    if ep.meta.get("no_answer_reason"):
        return str(ep.meta["no_answer_reason"])
    bad = [c for c in ep.calls if c.format_error is not None]
    if bad:
        return f"{bad[-1].role}: {_error_kind(bad[-1].format_error)}"
    return f"{ep.calls[-1].role}: an empty answer" if ep.calls else "no call was made"


def score_episodes(episodes: Iterable[Episode], judge: Callable[[list[Episode]], None] | None = None
                   ) -> list[Episode]:
    """EM / F1 / Acc and the silence flags of every episode with golds; with a judge (`System.judge`: it sets
    `metrics["lj"]` on the episodes with golds) also LJ (one batched judge call)."""
    out = []
    for ep in episodes:
        if ep.golden_answers:  # questions without golds (e.g. `ragteam ask`) are not scored
            ep.metrics = {**answer_metrics(ep.final_answer or "", ep.golden_answers), **silence(ep)}
        out.append(ep)
    if judge is not None:
        judge(out)
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def summarize(episodes: Sequence[Episode]) -> dict[str, float]:
    """Scores in percent and cost per question, averaged over the episodes."""
    out: dict[str, float] = {"n": float(len(episodes))}
    for k in SCORE_KEYS:
        out[k] = round(100 * _mean([ep.metrics.get(k, 0.0) for ep in episodes]), 2)
    flags = [silence(ep) for ep in episodes]   # from the episode itself: also right for files scored before
    for k in SILENCE_KEYS:
        out[k] = round(100 * _mean([f[k] for f in flags]), 2)
    # questions whose answer came through the answer fallback, and those where a draw answered
    out["resampled_questions"] = round(100 * _mean([resampled(ep) for ep in episodes]), 2)
    out["resampled_answered"] = round(100 * _mean([any(c.meta.get("resampled", {}).get("draw", 0) > 0
                                                       for c in ep.calls) for ep in episodes]), 2)
    for k in OPTIONAL_SCORE_KEYS:
        if episodes and all(k in ep.metrics for ep in episodes):
            out[k] = round(100 * _mean([ep.metrics[k] for ep in episodes]), 2)
    for k in COST_KEYS:
        vals = [ep.cost.get("prompt_tokens", 0.0) + ep.cost.get("completion_tokens", 0.0) if k == "tokens"
                else ep.cost.get(k, 0.0) for ep in episodes]
        out[k] = round(_mean(vals), 3)
    with_passages = [ep.cost["passages"] for ep in episodes if "passages" in ep.cost]
    if with_passages:  # workflows that record it (QAgent: passages handed to the answering model)
        out["passages"] = round(_mean(with_passages), 3)
    calls = [c for ep in episodes for c in ep.calls]
    out["format_error_rate"] = round(_mean([c.format_error is not None for c in calls]), 4)
    # per-question workflow figures a system records in meta["workflow"] (JADE: rounds, retrievals, DS calls, plans,
    # decompositions, R_global; M-ASK: turns, searches), averaged where every episode has them; others lack them
    shared = set.intersection(*(set(ep.meta.get("workflow", {})) for ep in episodes)) if episodes else set()
    for k in sorted(shared):
        out[k] = round(_mean([float(ep.meta["workflow"][k]) for ep in episodes]), 4)
    return out


def with_average(per_benchmark: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Add "avg": the unweighted mean over benchmarks of every key (the paper averages datasets equally)."""
    out = {b: dict(v) for b, v in per_benchmark.items()}
    if per_benchmark:
        keys = next(iter(per_benchmark.values())).keys()
        out["avg"] = {k: round(_mean([v[k] for v in per_benchmark.values()]), 3) for k in keys}
        out["avg"]["n"] = sum(v["n"] for v in per_benchmark.values())
    return out


# ---- what the figures and the declared metrics show ---------------------------------------------------------------

# a row's family in the figures is its row kind's (`RowKind.family`): the paper it comes from (the FlashRAG
# baselines together)
MAX_SERIES = 8   # bars or markers per panel that a reader can still tell apart


def system_groups(systems: Mapping[str, SystemSpec], max_series: int = MAX_SERIES) -> dict[str, list[str]]:
    """{family: rows} in the order of eval.systems, a family of more than `max_series` rows split into
    "<family> (1/k)" parts: one figure panel each."""
    fam: dict[str, list[str]] = {}
    for name, spec in systems.items():
        fam.setdefault(row_kinds()[spec.workflow].family if spec.workflow in row_kinds() else spec.workflow,
                       []).append(name)
    out: dict[str, list[str]] = {}
    for f, names in fam.items():
        parts = [names[i: i + max_series] for i in range(0, len(names), max_series)]
        for k, part in enumerate(parts, 1):
            out[f if len(parts) == 1 else f"{f} ({k}/{len(parts)})"] = part
    return out


# the declared metrics of stage evaluate (metrics/summary/eval.json; `ragteam.io.compared_numbers` of
# {"systems": metrics/eval.json, "differences": metrics/eval_compare.json}): each row's average EM, F1 and no-answer
# rate over benchmarks (and team reward where it has one), and each compared pair's F1 difference with its 95 %
# paired interval (and team-reward difference); per-benchmark scores,
# intervals, costs and counts stay in the two records
COMPARED = ("systems.*.avg.em", "systems.*.avg.f1", "systems.*.avg.no_answer", "systems.*.avg.team_reward",
            "differences.*.avg.f1.diff", "differences.*.avg.f1.lo", "differences.*.avg.f1.hi",
            "differences.*.avg.team_reward.diff")


# ---- uncertainty: intervals per system x benchmark, paired differences between systems ---------------------------

INTERVAL_KEYS = ("em", "f1", *SILENCE_KEYS, "team_reward")   # team_reward: the rows of has_team_reward only


def comparison_pairs(systems: Mapping[str, SystemSpec], compare: Sequence[Sequence[str]] | None = None
                     ) -> list[tuple[str, str]]:
    """[a, b] pairs whose difference a - b the report tests; `compare` (eval.compare) wins when given.

    Derived rule, each pair oriented as (more trained, less trained): a row named as its kind vs the row its kind is
    compared with (`RowKind.compared_with`: standard_rag vs native, does retrieval help at all) when both are rows;
    X_trained vs X for every system name that has both, likewise X_warmup vs X and X_trained vs X_warmup (what RL adds
    to the format warm-up of a joint system), X_grammar vs X (what the base model loses to formatting alone: its roles
    decoded under their formats' regexes); for a row kind with ablations (`RowKind.ablations`: MAPS), every full
    trained row (trained_agents, no base_roles, no fixed_rounds) vs every untrained one (no trained_agents, no
    fixed_rounds) and vs each ablation (trained_agents with base_roles, same fixed_rounds), so a positive difference
    is what the ablated trained agent adds.
    """
    if compare is not None:
        return [(a, b) for a, b in compare]
    pairs = [(n, c) for n, s in systems.items()
             if n == s.workflow and (c := row_kind(s.workflow).compared_with) is not None and c in systems]
    pairs += [(f"{x}_trained", x) for x in systems if f"{x}_trained" in systems]
    pairs += [(f"{x}_warmup", x) for x in systems if f"{x}_warmup" in systems]
    pairs += [(f"{x}_trained", f"{x}_warmup") for x in systems if {f"{x}_trained", f"{x}_warmup"} <= set(systems)]
    # what the base model loses to formatting alone: its roles constrained to their formats vs unconstrained
    pairs += [(f"{x}_grammar", x) for x in systems if f"{x}_grammar" in systems]
    for kind in dict.fromkeys(s.workflow for s in systems.values() if row_kind(s.workflow).ablations):
        mine = {n: s for n, s in systems.items() if s.workflow == kind}
        full = [n for n, s in mine.items() if s.trained_agents and not s.base_roles and s.fixed_rounds is None]
        untrained = [n for n, s in mine.items() if not s.trained_agents and s.fixed_rounds is None]
        for f in full:
            pairs += [(f, u) for u in untrained]
            pairs += [(f, n) for n, s in mine.items() if s.trained_agents and s.base_roles and s.fixed_rounds is None]
    return list(dict.fromkeys(pairs))


def question_scores(episodes: Sequence[Episode]) -> dict[str, list[float]]:
    """Per-question scores in [0, 1] for the bootstrap, in episode order (unscored episodes count 0, as in
    `summarize`)."""
    out = {k: [ep.metrics.get(k, 0.0) for ep in episodes] for k in INTERVAL_KEYS
           if k not in SILENCE_KEYS and k not in OPTIONAL_SCORE_KEYS}
    for k in OPTIONAL_SCORE_KEYS:     # where every episode has it (a row without it has no interval for it)
        if k in INTERVAL_KEYS and episodes and all(k in ep.metrics for ep in episodes):
            out[k] = [ep.metrics[k] for ep in episodes]
    flags = [silence(ep) for ep in episodes]
    return {**out, **{k: [f[k] for f in flags] for k in SILENCE_KEYS}}


def no_answer_reasons(episodes: Sequence[Episode]) -> dict[str, int]:
    """How many questions have no answer, by reason (`no_answer_reason`), most frequent first."""
    counts: dict[str, int] = {}
    for ep in episodes:
        r = no_answer_reason(ep) if ep.golden_answers else None
        if r is not None:
            counts[r] = counts.get(r, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _flat(per_bench: Mapping[str, Mapping[str, list[float]]], key: str) -> tuple[list[float], list[int]]:
    xs = [per_bench[b][key] for b in per_bench]
    return [v for x in xs for v in x], [len(x) for x in xs]


def _keys(per: Mapping[str, object]) -> list[str]:
    """The INTERVAL_KEYS a per-question score dict has (older score files have EM and F1 only)."""
    return [k for k in INTERVAL_KEYS if k in per]


def add_intervals(summary: dict[str, dict], scores: Mapping[str, Mapping[str, list[float]]],
                  cfg: BootstrapConfig) -> dict[str, dict]:
    """Add `<key>_ci: [lo, hi]` (percent) to every benchmark summary and to "avg" (benchmarks resampled
    separately, unweighted mean of their means: the avg column's statistic)."""
    for b, per in scores.items():
        for k in _keys(per):
            iv = stats.mean_ci(per[k], resamples=cfg.resamples, seed=cfg.seed, level=cfg.level)
            summary[b][f"{k}_ci"] = [iv.lo, iv.hi]
    if "avg" in summary and scores:
        for k in _keys(next(iter(scores.values()))):
            xs, sizes = _flat(scores, k)
            iv = stats.mean_ci(xs, sizes, resamples=cfg.resamples, seed=cfg.seed, level=cfg.level)
            summary["avg"][f"{k}_ci"] = [iv.lo, iv.hi]
    return summary


def compare_systems(scores: Mapping[str, Mapping[str, Mapping[str, list[float]]]],
                    pairs: Sequence[tuple[str, str]], cfg: BootstrapConfig) -> dict[str, dict]:
    """{"a vs b": {"a", "b", benchmark | "avg": {"n", em/f1: {diff, lo, hi, n, significant}}}}: paired bootstrap
    of a - b over the questions both systems answered: each benchmark's first min(n_a, n_b) rows (systems answer a
    prefix of every benchmark, `SystemSpec.n_questions`), so the pairs are the same questions in the same order."""
    out: dict[str, dict] = {}
    for a, b in pairs:
        sa, sb = scores[a], scores[b]
        if list(sa) != list(sb):
            raise ValueError(f"compare {a!r} with {b!r}: they were not run on the same benchmarks "
                             f"({list(sa)} vs {list(sb)})")
        common = {x: min(len(sa[x]["em"]), len(sb[x]["em"])) for x in sa}
        sa = {x: {k: v[: common[x]] for k, v in sa[x].items()} for x in sa}
        sb = {x: {k: v[: common[x]] for k, v in sb[x].items()} for x in sb}
        res: dict = {"a": a, "b": b}
        keys = [k for k in _keys(next(iter(sa.values()))) if k in next(iter(sb.values()))]
        for bench in sa:
            res[bench] = {"n": len(sa[bench]["em"])}
            for k in keys:
                d = stats.paired_diff(sa[bench][k], sb[bench][k], resamples=cfg.resamples, seed=cfg.seed,
                                      level=cfg.level)
                res[bench][k] = d.to_dict()
        res["avg"] = {"n": sum(len(sa[x]["em"]) for x in sa)}
        for k in keys:
            (xa, sizes), (xb, _) = _flat(sa, k), _flat(sb, k)
            d = stats.paired_diff(xa, xb, sizes, resamples=cfg.resamples, seed=cfg.seed, level=cfg.level)
            res["avg"][k] = d.to_dict()
        out[f"{a} vs {b}"] = res
    return out
