"""The systems the joint trainer knows: each names its workflow's params section, builds its training-mode
rollout and its reward, optionally its own per-episode training figures, and its advantage estimator: GAE with a
critic and the GAE scope its reward needs, or (critic-free systems) its own. A new system adds one factory here,
one `joint.systems` entry and its `joint.<system>` section (stages.train_joint.JointParams).

Credit rule (DESIGN): a call's return must rise with the quality of its own output. Where the rewards sit decides
the GAE scope, so it is the system's, not a param:
- M-ASK `call`: every call carries its own reward (Eq. 2-3). Summed over the episode (γ = λ = 1) the Answer call
  of turn t would return F1(a_t) + 3·(F1(a_{t+1}) − F1(a_t)) + F1(a_{t+1}) + … = 4·F1(a_{t+1}) − 2·F1(a_t) + …, so a
  better own answer would lower its own return (and Planning would gain from a wrong a_0): ΔF1 telescopes. The
  official code makes every call its own verl sample with the reward on its last token, i.e. GAE within the call
  (notes m-ask.md §11). `joint.mask.estimator: group` (not the paper's) keeps that per-call credit without the
  critic: each call's own reward normalised among the same role's calls at the same turn of its question's
  `group_size` rollouts (`mask_group_advantages`).
- JADE `episode`: R_global (Eq. 6) sits on the terminal call alone; only GAE over the flattened calls (Alg. 2) carries
  it back, through the critic, to the planner and executors that produced it. `joint.jade.estimator: group` (not
  the paper's) replaces the critic by GRPO's outcome advantage over `group_size` rollouts of each question: the
  episode's return, normalised within its group, on every call (`JadeTrainParams`).
- DECOR and QAgent have no critic: their group estimators (Eq. 6; QAgent Eq. 3) give every call its advantage.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from ragteam.agents.decor_workflow import DynamicSamplingConfig
from ragteam.config import ParamsError, Strict, parse_section
from ragteam.llm import Team
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import episode_return
from ragteam.train.joint.system import JointSystem


def call_group_key(ep: Episode, c) -> tuple:
    """The group an M-ASK call is compared within by `estimator: group`: the same question's rollouts, the same role
    at the same turn (`meta["turn"]`, 0 = Planning), the end-of-episode Answer apart from a turn's Answer."""
    return ep.question_id, c.role, int(c.meta.get("turn", -1)), bool(c.meta.get("final"))


def mask_group_advantages(episodes: Sequence[Episode], eps: float = 1e-4) -> list[list[float | None]]:
    """M-ASK's critic-free estimator (`joint.mask.estimator: group`, not the paper's): each call's own reward (Eq. 2-3
    with the format penalty, as annotated) normalised among the calls of the same role and turn in the G rollouts of
    its question (`call_group_key`), A = (r − μ) / (σ + eps) with the sample σ (`group_normalized`, TRL's GRPO
    convention and the project's ε). It keeps M-ASK's per-call credit (a call's advantage rises with its own reward
    only; summing rewards over the episode would invert it, module docstring) and puts the group's mean where GAE
    within the call puts the critic's value: A = r − V becomes A = (r − μ) / σ. A pool of one call (a turn only one
    rollout reached) or of equal rewards gets A = 0."""
    from ragteam.train.advantages import group_normalized

    flat = [(i, c) for i, ep in enumerate(episodes) for c in ep.calls]
    missing = [(episodes[i].episode_id, c.role) for i, c in flat if c.reward is None]
    if missing:
        raise ValueError(f"mask_group_advantages: call(s) without a reward (annotate first): {missing[:3]}")
    adv = group_normalized([c.reward for _, c in flat], [call_group_key(episodes[i], c) for i, c in flat],
                           std="sample", eps=eps)
    out: list[list[float | None]] = [[] for _ in episodes]
    for (i, _), a in zip(flat, adv):
        out[i].append(a)
    return out


class GroupEstimatorParams(Strict):
    """`joint.<system>` of a GAE system that may train without its critic: the fields every `joint.<system>` has
    (`max_questions`, `ppo` overrides of `joint.ppo`, see stages.train_joint) and the choice of advantage estimator,
    `gae` (the paper's: a critic, one rollout per question) or `group` (this project's critic-free alternative for a
    backbone whose critic explains nothing: `group_size` rollouts of each question, a step then trains
    `questions_per_step` x `group_size` episodes)."""

    max_questions: int = Field(0, ge=0)           # first n questions of the training pool; 0 = all
    ppo: dict[str, Any] = Field(default_factory=dict)
    estimator: Literal["gae", "group"] = "gae"
    group_size: int = Field(1, ge=1)              # rollouts per question; >= 2 with estimator group, 1 with gae

    @model_validator(mode="after")
    def _check_group(self) -> GroupEstimatorParams:
        if self.estimator == "group" and self.group_size < 2:
            raise ValueError(f"estimator group needs group_size >= 2 (one rollout of a question has no group to "
                             f"normalise within), got {self.group_size}")
        if self.estimator == "gae" and self.group_size != 1:
            raise ValueError(f"group_size {self.group_size}: rollouts per question apply to estimator group only; "
                             "estimator gae rolls out each question once (set estimator: group, or group_size: 1)")
        return self


class MaskTrainParams(GroupEstimatorParams):
    """params.yaml `joint.mask`. `estimator: group` gives every call its own reward normalised within its question's
    G rollouts, same role and turn (`mask_group_advantages`); `gae` is the paper's (a critic, GAE within each call)."""


def mask_system(params: dict[str, Any], retriever: Retriever) -> JointSystem:
    """M-ASK: the five roles of `ragteam.agents.mask`, the Answer agent after every turn, turn-level rewards
    (Eq. 2-3) minus `mask.format_penalty` per malformed call; GAE within each call (per-call rewards: see above), or
    with `joint.mask.estimator: group` each call's reward normalised over its question's G rollouts, no critic."""
    from ragteam.agents import mask as M
    from ragteam.agents.mask_workflow import MaskConfig, run_mask
    from ragteam.rewards.mask import annotate_mask

    cfg = parse_section(params, "mask", MaskConfig)
    # joint.mask, when given (the stage always has it; a caller without it trains the paper's way)
    tp = (parse_section(params, "joint.mask", MaskTrainParams) if "mask" in (params.get("joint") or {})
          else MaskTrainParams())
    describe = {"workflow": "ragteam.agents.mask_workflow.run_mask(training=True)", "mask": cfg.model_dump(),
                "reward": "M-ASK Eq. 2-3 (ragteam.rewards.mask.annotate_mask_episode)"}
    annotate = lambda eps: annotate_mask(eps, cfg.format_penalty)  # noqa: E731
    if tp.estimator == "gae":
        return JointSystem(
            name="mask", roles=M.ROLES,
            rollout=lambda rows, team: run_mask(rows, team, retriever, cfg, system="mask", training=True),
            annotate=annotate,
            gae_scope="call",         # Eq. 2-3 reward each call itself; the official code's per-call GAE
            describe=describe,
        )
    return JointSystem(
        name="mask", roles=M.ROLES,
        # G copies of each question, consecutive; Episode.question_id (the row id) is the group
        rollout=lambda rows, team: run_mask([r for r in rows for _ in range(tp.group_size)], team, retriever, cfg,
                                            system="mask", training=True),
        annotate=annotate, advantage=mask_group_advantages,
        requires={"normalize_advantages": False},   # the group normalisation is the only one (GRPO's)
        describe={**describe, "estimator": f"group of {tp.group_size} rollouts per question",
                  "advantage": "ragteam.train.systems.mask_group_advantages (each call's reward normalised within "
                               "its question's rollouts, same role and turn; no critic)"},
    )


def _workflow(ep: Episode) -> dict:
    return ep.meta["workflow"]


# JADE's own training figures (Sec. 4 RQ2 / App. D): per episode, averaged over a step's episodes by the trainer
JADE_STATS: dict[str, Callable[[Episode], float]] = {
    "turns": lambda ep: float(_workflow(ep)["rounds"]),             # a JADE round is its turn (Eq. 6's T)
    "searches": lambda ep: float(_workflow(ep)["retrievals"]),      # Eq. 6's N_ret
    "ds_calls": lambda ep: float(_workflow(ep)["ds_calls"]),
    "ds_per_round": lambda ep: _workflow(ep)["ds_calls"] / max(_workflow(ep)["rounds"], 1),  # App. D's DS ratio
    "decomposed": lambda ep: float(_workflow(ep)["decomposed"]),    # the root plan decomposed (QDS / QDP)
    "decompose_share": lambda ep: _workflow(ep)["plans_decompose"] / max(_workflow(ep)["plans"], 1),
    "max_rounds_hit": lambda ep: float(_workflow(ep)["max_rounds_hit"]),
    "r_global": lambda ep: float(_workflow(ep)["r_global"]),
}


class JadeTrainParams(GroupEstimatorParams):
    """params.yaml `joint.jade` (`GroupEstimatorParams`). With `estimator: group` each episode's return (the sum of
    its calls' rewards: R_global and the Eq. 7 format penalties) is normalised within its group
    (`ragteam.train.advantages.outcome_group_advantages`) and given to every call. `dynamic_sampling` (DAPO, off by
    default) trains only the groups whose returns vary and refills the step, as DECOR's and QAgent's do."""

    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=lambda: DynamicSamplingConfig(enabled=False))

    @model_validator(mode="after")
    def _check_sampling(self) -> JadeTrainParams:
        if self.estimator == "gae" and self.dynamic_sampling.enabled:
            raise ValueError("dynamic_sampling applies to estimator group only; estimator gae rolls out each question "
                             "once (set estimator: group, or dynamic_sampling enabled: false)")
        return self


def jade_group_advantages(episodes: Sequence[Episode]) -> list[list[float | None]]:
    """JADE's critic-free estimator (`JadeTrainParams`): every call of episode i gets its group-normalised return."""
    from ragteam.train.advantages import outcome_group_advantages

    return outcome_group_advantages([episode_return(ep) for ep in episodes], [ep.question_id for ep in episodes],
                                    [len(ep.calls) for ep in episodes])


def jade_system(params: dict[str, Any], retriever: Retriever) -> JointSystem:
    """JADE (§3.4, Algorithm 2): the planner and the six LLM executors of `ragteam.agents.jade`, rolled out with
    Algorithm 1 (`run_jade`: JADE's training rollout is its inference procedure), rewarded by Eq. 6-8
    (`ragteam.rewards.jade.assign_rewards`: R_global on the terminal call, −`jade.reward.format_penalty` on every
    malformed call). GAE runs over each episode's flattened call sequence (`gae_scope="episode"`), so the round-1
    planner is credited with the terminal reward through the critic. The Eq. 7 format penalties sit on the malformed
    calls themselves, yet the same episode GAE also charges each one (discounted by γλ) to every earlier call of the
    episode: this follows Algorithm 2's GAE over the flattened calls, not a per-call credit."""
    from ragteam.agents import jade as J
    from ragteam.agents.jade_workflow import JadeConfig, run_jade
    from ragteam.rewards.jade import assign_rewards
    from ragteam.train.decor_adv import dynamic_sampling

    cfg = parse_section(params, "jade", JadeConfig)
    # joint.jade, when given (the stage always has it; a caller without it trains the paper's way)
    tp = (parse_section(params, "joint.jade", JadeTrainParams) if "jade" in (params.get("joint") or {})
          else JadeTrainParams())

    def annotate(episodes: list[Episode]) -> list[Episode]:
        for ep in episodes:
            assign_rewards(ep, cfg.reward)
        return episodes

    describe = {"workflow": "ragteam.agents.jade_workflow.run_jade", "jade": cfg.model_dump(),
                "reward": "JADE Eq. 6-8 (ragteam.rewards.jade.assign_rewards)"}
    if tp.estimator == "gae":
        return JointSystem(
            name="jade", roles=J.ROLES,
            rollout=lambda rows, team: run_jade(rows, team, retriever, cfg, system="jade"),
            annotate=annotate, stats=JADE_STATS,
            gae_scope="episode",      # R_global on the terminal call only: Alg. 2's GAE over the flattened calls
            describe=describe,
        )
    ds = tp.dynamic_sampling
    return JointSystem(
        name="jade", roles=J.ROLES,
        # G copies of each question, consecutive; Episode.question_id (the row id) is the group
        rollout=lambda rows, team: run_jade([r for r in rows for _ in range(tp.group_size)], team, retriever, cfg,
                                            system="jade"),
        annotate=annotate, stats=JADE_STATS, advantage=jade_group_advantages,
        select=(lambda eps: dynamic_sampling(eps, lambda ep: {"episode": episode_return(ep)})) if ds.enabled else None,
        max_rollout_rounds=ds.max_rounds if ds.enabled else 1,
        requires={"normalize_advantages": False},   # the group normalisation is the only one (GRPO's)
        describe={**describe, "estimator": f"group of {tp.group_size} rollouts per question",
                  "advantage": "ragteam.train.systems.jade_group_advantages (GRPO outcome advantage, no critic)",
                  "dynamic_sampling": ("ragteam.train.decor_adv.dynamic_sampling (the episode return varies in the "
                                       f"group), refilled up to {ds.max_rounds} rollouts per step")
                  if ds.enabled else "off"},
    )


def decor_system(params: dict[str, Any], retriever: Retriever) -> JointSystem:
    """DECOR (Sec. 4.4): Planner, Filter and Answerer on the shared policy, the summarizer (and an LLM judge) frozen;
    `decor.group_size` training-mode rollouts of each question (a malformed call truncates its trajectory); rewards
    R_total of Eq. 3 per call (format gate, Eq. 2, the `decor.judge` role verdicts); advantages of Eq. 6 per role
    within each question's group, no critic; dynamic sampling keeps a question's group only when some role's return
    varies within it, and the trainer refills the step with further questions up to
    `decor.dynamic_sampling.max_rounds` rollouts. The loss is the shared one with `ratio_level: sequence`
    (Eq. 5; clip-higher through `clip_eps` / `clip_eps_high`)."""
    from ragteam.agents import decor as D
    from ragteam.agents.decor_workflow import JUDGE_ROLE, DecorConfig, run_decor
    from ragteam.rewards.decor import decor_rewards, make_judge
    from ragteam.train.decor_adv import decor_advantages, dynamic_sampling

    cfg = parse_section(params, "decor", DecorConfig)
    last_team: dict[str, Team] = {}       # the step's Team: the LLM judge's `decor_judge` role is on it

    def rollout(rows: Sequence[dict], team: Team) -> list[Episode]:
        last_team["team"] = team
        # G copies of each question, consecutive; Episode.question_id (the row id) is the group of Eq. 6
        return run_decor([r for r in rows for _ in range(cfg.group_size)], team, retriever, cfg, system="decor",
                         truncate_on_format_error=True)

    def annotate(eps: list[Episode]) -> list[Episode]:
        decor_rewards(eps, make_judge(cfg, last_team["team"]), cfg.reward)
        return eps

    ds = cfg.dynamic_sampling
    frozen: dict[str, str | None] = {D.SUMMARIZER: cfg.summarizer_model}
    if cfg.judge == "llm":
        frozen[JUDGE_ROLE] = cfg.judge_model
    return JointSystem(
        name="decor", roles=D.POLICY_ROLES, rollout=rollout, annotate=annotate,
        advantage=decor_advantages,
        select=dynamic_sampling if ds.enabled else None, max_rollout_rounds=ds.max_rounds if ds.enabled else 1,
        frozen_roles=frozen, requires={"ratio_level": "sequence", "normalize_advantages": False},
        describe={"workflow": "ragteam.agents.decor_workflow.run_decor(truncate_on_format_error=True)",
                  "decor": cfg.model_dump(), "advantage": "ragteam.train.decor_adv.decor_advantages (Eq. 6)",
                  "dynamic_sampling": ("ragteam.train.decor_adv.dynamic_sampling (some role's return varies in the "
                                       f"group), refilled up to {ds.max_rounds} rollouts per step")
                  if ds.enabled else "off",
                  "reward": "DECOR Eq. 2-3 with the format gate (ragteam.rewards.decor.decor_rewards)"},
    )


def qagent_system(params: dict[str, Any], retriever: Retriever, stage: str = "stage1", generator=None
                  ) -> JointSystem:
    """QAgent: one agent, G trajectories per question, each one sample with <information> / retry tokens masked,
    group-normalised advantages; stage 1 Eq. 7, stage 2 Eq. 8-10 with `generator` (a Team whose answer_agent is the
    frozen G). Two stages: stages.train_joint runs them through `ragteam.train.qagent.train_qagent`."""
    from ragteam.agents.qagent_workflow import QAgentConfig
    from ragteam.train.qagent import QAgentTrainParams
    from ragteam.train.qagent import qagent_system as build

    cfg = parse_section(params, "qagent", QAgentConfig)
    tp = parse_section(params, "joint.qagent", QAgentTrainParams)
    return build(cfg, tp, retriever, stage, generator)


REWARD_TEXT = {
    "mask": ("M-ASK turn-level rewards (§3.3): Planning F1(a_0, y) (Eq. 2); Answer F1(a_t, y) (Eq. 2); Search, "
             "Summary and Update of turn t F1(a_t, y) - F1(a_{t-1}, y) (Eq. 3); a Search that outputs <end> 0; "
             "minus mask.format_penalty for a malformed call (official code). Every call is a PPO sample with GAE "
             "within the call (the official code's per-call samples): its return is its own reward."),
    "jade": ("JADE (§3.3, Eq. 6-8): R_global = F1(ŷ, y) - α·min(T, M)/M - β·min(N_ret, M)/M on the episode's "
             "terminal call only (AS, or AG when the root was answered directly), with T the rounds, N_ret the "
             "retrievals, α, β, M = jade.reward.alpha, beta, cost_max; minus jade.reward.format_penalty on every "
             "malformed call (Eq. 7). Every call is a PPO sample; GAE over the episode's flattened calls carries "
             "R_global back to the round-1 planner (Alg. 2)."),
    "decor": ("DECOR hierarchical rewards (Sec. 4.3): a trajectory with a malformed Planner / Filter / Answerer output is "
              "truncated and every policy call gets -1 (format gate); otherwise each call gets R_total = α·R_team + "
              "β·R_role (Eq. 3), R_team = λ·F1 + (1 − λ)·R_LJ (Eq. 2), R_role = ±1 per step from decor.judge (rules "
              "or the Appendix B prompts); per role the calls' rewards are averaged per trajectory and normalised "
              "within the question's G trajectories where the role acted (Eq. 6); dynamic sampling trains only on "
              "the groups where some role's return varies (some advantage is non-zero), refilling the step with "
              "further questions up to decor.dynamic_sampling.max_rounds rollouts (DAPO)."),
    "qagent": ("QAgent, one reward per trajectory, group-normalised over its question's G rollouts: stage 1 "
               "1{r_fmt = 1}·EM_s(A*, Â) (Eq. 7), stage 2 EM(A*, G(q, K)) + hit_weight·Hit(τ, A*) (Eq. 8-10, "
               "frozen generator G over the deduplicated passages K; non-strict EM = G's answer contains a gold "
               "answer as whole tokens, Hit = a passage of K does). A trajectory cut at max_seq_len keeps its "
               "place in its group's statistics but does not train (its loss is masked)."),
}

SYSTEMS: dict[str, Callable[[dict[str, Any], Retriever], JointSystem]] = {
    "mask": mask_system, "jade": jade_system, "decor": decor_system, "qagent": qagent_system}


def build_system(name: str, params: dict[str, Any], retriever: Retriever) -> JointSystem:
    if name not in SYSTEMS:
        raise ParamsError(f"joint system {name!r} is not known (known: {', '.join(sorted(SYSTEMS))})")
    return SYSTEMS[name](params, retriever)
