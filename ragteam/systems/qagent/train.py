"""QAgent training (Sec. 3.3-3.4, App. C): multi-turn GRPO in two stages on the joint trainer's one core.

QAgent is a system adapter of the joint trainer (`ragteam.train.joint`), not a loop of its own:
- rollout   each question of a step is run G = `group_size` times through Algorithm 1 (`run_qagent`, end to end,
            sampled at the trainer's temperature); episode k·G..k·G+G-1 are question k's group;
- reward    stage 1 Eq. 7 (format gate x strict EM of the agent's <answer>); stage 2 Eq. 8-10 (non-strict EM of the
            frozen generator's G(q, K), the generator called inside the reward in one batched call per step,
            + hit_weight x Hit);
- sample    one whole trajectory per episode (`trajectory_samples`): prompt ids, then every generated segment and
            injected block tokenised by `workflow.trajectory_tokens`, whose loss mask is 0 on the
            <information> blocks and the retry text (Fig. 2: "the searched content tokens are masked"); a
            trajectory cut at `max_seq_len` keeps its place in its group's statistics but trains no token, and the
            step log's `truncated` is the share of such trajectories;
- advantage group-normalised reward over the G rollouts of a question, broadcast to the trajectory's tokens, no
            critic (`JointSystem.advantage="group"`);
- select    off in the paper's recipe; `joint.qagent.dynamic_sampling` trains only the groups whose rewards vary
            (every other group's advantages are 0) and refills the step with further questions, DAPO's way, as
            DECOR's trainer does (`ragteam.train.decor_adv.dynamic_sampling` on `trajectory_return`);
- loss      the clipped ratio with k3 KL to the reference, normalised by the group's total generated tokens
            (Eq. 3; `loss_agg: group_token_mean`).
Stage 2 starts from the stage-1 model (saved, LoRA merged, under the work dir) and its reference is that model.
"""
from __future__ import annotations

import gc
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ragteam.config import Strict
from ragteam.llm import EngineConfig, SamplingConfig, Team
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.systems.qagent.rewards import qagent_rewards_stage1, qagent_rewards_stage2
from ragteam.systems.qagent.workflow import QAgentConfig, ROLE, agent_calls, run_qagent, trajectory_tokens
from ragteam.train.checkpoints import TrainResult, save_agent
from ragteam.train.decor_adv import DynamicSamplingConfig
from ragteam.train.joint.batch import Sample
from ragteam.train.joint.loop import train_joint_ppo
from ragteam.train.joint.params import PPOParams
from ragteam.train.joint.system import JointSystem

Stage = Literal["stage1", "stage2"]


class QAgentTrainParams(Strict):
    """params.yaml `joint.qagent`: the fields every `joint.<system>` has (`max_questions`, `ppo` overrides of
    `joint.ppo`, see stages.train_joint) and QAgent's own. `joint.ppo.steps` does not apply: each stage runs
    `stage1_steps` / `stage2_steps`. Per-turn response length: llm.sampling.qagent.max_new_tokens."""

    max_questions: int = Field(0, ge=0)           # first n questions of the training pool; 0 = all
    ppo: dict[str, Any] = Field(default_factory=dict)
    stages: list[Stage] = Field(default_factory=lambda: ["stage1", "stage2"], min_length=1)
    group_size: int = Field(5, ge=2)              # G rollouts per question
    stage1_steps: int = Field(8, ge=1)
    stage2_steps: int = Field(8, ge=1)
    hit_weight: float = Field(0.5, ge=0)          # Eq. 10: R = EM(A*, Ã) + 0.5·Hit
    generator: str | None = None                  # frozen stage-2 generator G (role answer_agent); null = llm.model
    max_seq_len: int = Field(8192, ge=16)         # prompt + trajectory tokens; a trajectory cut there does not
                                                  # train (trajectory_samples), logged as `truncated`
    # DAPO's dynamic sampling (not in the QAgent paper, hence off by default): a step trains only the groups whose
    # rewards vary and rolls out further questions, up to max_rounds rollouts a step, until it has
    # questions_per_step of them
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=lambda: DynamicSamplingConfig(enabled=False))

    def steps(self, stage: Stage) -> int:
        return self.stage1_steps if stage == "stage1" else self.stage2_steps


# ---- rollout and samples ------------------------------------------------------------------------------------------

def rollout_groups(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: QAgentConfig,
                   group_size: int) -> list[Episode]:
    """G end-to-end rollouts of every row, all advancing together (one engine call per turn over all of them);
    `meta["group"]` is the row's position in `rows` (a question drawn twice in a step makes two groups); the
    samples' group is (question id, position), so that the groups of a step's refill rollouts
    (`joint.qagent.dynamic_sampling`), whose positions start at 0 again, stay apart from the first rollout's."""
    reps = [r for r in rows for _ in range(group_size)]
    eps = run_qagent(reps, team, retriever, cfg, plugin=False, system="qagent")
    for i, ep in enumerate(eps):
        ep.meta.update(group=i // group_size, rollout=i % group_size,
                       workflow={"turns": ep.meta["rounds"], "retries": ep.meta["retries"]})  # the step log's turns
    return eps


def trajectory_samples(tok, episodes: Sequence[Episode], max_seq_len: int | None = None) -> list[Sample]:
    """One sample per episode: the first prompt is the sample's prompt, the whole trajectory its response, with
    `trajectory_tokens`' loss mask (generated 1, injected 0); the reward is the one on the last agent call.

    A trajectory longer than `max_seq_len` tokens (prompt included) is cut there. When the cut removes generated
    tokens, the sample keeps its reward and its group but its whole loss mask is 0, and the episode records
    `meta["truncated_tokens"]` (the generated tokens cut; 0 otherwise). Why: the reward was earned by the whole
    trajectory (stage 1 by its every turn and its final <answer>, stage 2 by K and so by every query), and the
    policy never saw a sequence that ends where the cut does; training the prefix on that reward credits tokens
    for an outcome they did not produce. As DAPO's overlong filtering (verl `mask_overlong_loss`), the sample stays
    in its group's mean and std, so its group-mates' advantages are those of the group that was rolled out; it only
    adds no loss tokens (Eq. 3 normalises over the tokens that count)."""
    out = []
    for ei, ep in enumerate(episodes):
        calls = agent_calls(ep)
        reward = calls[-1].reward
        if reward is None:
            raise ValueError(f"episode {ep.episode_id}: the last {ROLE} call has no reward (annotate first)")
        if "group" not in ep.meta:
            raise ValueError(f"episode {ep.episode_id}: no meta['group'] (roll out with rollout_groups)")
        t = trajectory_tokens(ep, tok)
        ids, mask, cut = t.input_ids, t.loss_mask, 0
        if max_seq_len is not None and len(ids) > max_seq_len:
            if t.prompt_len >= max_seq_len:
                raise ValueError(f"episode {ep.episode_id}: the prompt alone has {t.prompt_len} tokens "
                                 f"(max_seq_len {max_seq_len})")
            cut = sum(mask[max_seq_len:])
            ids, mask = ids[:max_seq_len], mask[:max_seq_len]
            if cut:
                mask = [0] * len(mask)
        ep.meta["truncated_tokens"] = cut
        out.append(Sample(episode=ei, call=ep.calls.index(calls[-1]), role=ROLE, prompt_ids=ids[:t.prompt_len],
                          response_ids=ids[t.prompt_len:], reward=float(reward),
                          group=(ep.question_id, ep.meta["group"]),
                          mask=mask[t.prompt_len:]))
    return out


def trajectory_return(ep: Episode) -> dict[str, float]:
    """What QAgent's advantage normalises within a group (`JointSystem.advantage="group"`): the reward on the
    trajectory's last agent call, as `trajectory_samples` reads it, under the one role."""
    reward = agent_calls(ep)[-1].reward
    if reward is None:
        raise ValueError(f"episode {ep.episode_id}: the last {ROLE} call has no reward (annotate first)")
    return {ROLE: float(reward)}


def truncated(ep: Episode) -> float:
    """1 if the episode's sample lost generated tokens to max_seq_len (`trajectory_samples`): the step log's
    `truncated` is the share of a step's trajectories that did not train."""
    if "truncated_tokens" not in ep.meta:
        raise ValueError(f"episode {ep.episode_id}: no meta['truncated_tokens'] (build its sample first)")
    return float(ep.meta["truncated_tokens"] > 0)


def qagent_system(cfg: QAgentConfig, tp: QAgentTrainParams, retriever: Retriever, stage: Stage = "stage1",
                  generator: Team | None = None) -> JointSystem:
    """The JointSystem of one training stage; stage 2 needs `generator`, a Team whose answer_agent is G."""
    if stage == "stage2" and generator is None:
        raise ValueError("qagent stage2: the reward needs the frozen generator (a Team with role answer_agent)")

    from ragteam.train.decor_adv import dynamic_sampling

    ds = tp.dynamic_sampling

    def annotate(eps: list[Episode]) -> list[Episode]:
        if stage == "stage1":
            qagent_rewards_stage1(eps)
        else:
            qagent_rewards_stage2(eps, generator, cfg.passage_words, tp.hit_weight)
        return eps

    return JointSystem(
        name="qagent", roles=(ROLE,),
        rollout=lambda rows, team: rollout_groups(rows, team, retriever, cfg, tp.group_size),
        annotate=annotate,
        # module paths in `describe` are historical identifiers (pre-package), kept so that model hashes stay the same
        describe={"workflow": "ragteam.train.qagent.rollout_groups (run_qagent end to end)", "stage": stage,
                  "qagent": cfg.model_dump(), "group_size": tp.group_size, "max_seq_len": tp.max_seq_len,
                  "reward": ("Eq. 7 (ragteam.rewards.qagent.qagent_rewards_stage1)" if stage == "stage1" else
                             f"Eq. 8-10, hit_weight {tp.hit_weight} (ragteam.rewards.qagent.qagent_rewards_stage2)"),
                  "samples": "trajectory_tokens (information / retry masked; cut at max_seq_len: loss masked, "
                             "kept in the group statistics)", "advantage": "group",
                  "dynamic_sampling": ("ragteam.train.decor_adv.dynamic_sampling on trajectory_return (the group's "
                                       f"rewards vary), refilled up to {ds.max_rounds} rollouts per step")
                  if ds.enabled else "off"},
        advantage="group",
        select=(lambda eps: dynamic_sampling(eps, trajectory_return)) if ds.enabled else None,
        max_rollout_rounds=ds.max_rounds if ds.enabled else 1,
        samples=lambda tok, eps: trajectory_samples(tok, eps, tp.max_seq_len),
        stats={"truncated": truncated},
    )


def stage_ppo(base: PPOParams, tp: QAgentTrainParams, stage: Stage) -> PPOParams:
    """The stage's PPOParams: `base` (joint.ppo + joint.qagent.ppo) with the stage's step count. A step's
    G x questions_per_step trajectories must fit one minibatch: Eq. 3 normalises over whole groups, and the paper's
    update is one optimiser step per rollout batch ("purely online")."""
    n = base.questions_per_step * tp.group_size
    if base.minibatch_size < n:
        raise ValueError(f"joint.qagent.ppo.minibatch_size ({base.minibatch_size}) must hold a step's "
                         f"questions_per_step x group_size = {n} trajectories (Eq. 3 normalises over whole groups)")
    if base.loss_agg != "group_token_mean":
        raise ValueError(f"joint.qagent.ppo.loss_agg is {base.loss_agg!r}: QAgent's loss is normalised by each "
                         f"group's total tokens (Eq. 3), loss_agg group_token_mean")
    return base.model_copy(update={"steps": tp.steps(stage)})


# ---- both stages --------------------------------------------------------------------------------------------------

def train_qagent(systems: Mapping[Stage, Callable[[], JointSystem]], rows: Sequence[dict], model_path: str,
                 work_dir: str | Path, ppo: Mapping[Stage, PPOParams], engine_cfg: EngineConfig,
                 sampling: Mapping[str, SamplingConfig] | None = None, *, run_tag: Mapping[str, Any] | None = None,
                 on_step: Callable[[str, int, dict], None] | None = None,
                 probe: Callable[[Team], dict[str, float]] | None = None,
                 probe_steps: Collection[int] = ()) -> tuple[TrainResult, list[dict]]:
    """Run the stages in order (`systems`' keys, stage1 before stage2), each from the previous stage's model
    (saved LoRA-merged to `work_dir/<stage>_model`, whose fingerprint makes a retrained stage 1 invalidate stage
    2's checkpoints); a finished stage resumes as a no-op. Returns the last stage's result (global_step, seconds
    and `extra["stages"]` covering all stages) and the curve rows (column `stage`, steps continued across stages).
    `probe` runs at the global steps `probe_steps` (0: before stage 1's first step), whichever stage they fall in
    (`ragteam.train.probe.stage_probe_steps`)."""
    from ragteam.train.probe import stage_probe_steps

    work = Path(work_dir)
    order = [s for s in ("stage1", "stage2") if s in systems]
    if not order:
        raise ValueError("train_qagent: no stage to train")
    model, rows_out, summaries, offset, result = model_path, [], {}, 0, None
    for n, stage in enumerate(order):
        system = systems[stage]()
        result = train_joint_ppo(system, rows, model, work / stage, ppo[stage], engine_cfg, dict(sampling or {}),
                                 run_tag={**(run_tag or {}), "stage": stage},
                                 on_step=(lambda step, e, _s=stage: on_step(_s, step, e)) if on_step else None,
                                 probe=probe, probe_steps=stage_probe_steps(set(probe_steps), offset,
                                                                            ppo[stage].steps))
        rows_out += curve_rows_joint(result.log_history, offset, stage)
        summaries[stage] = {"global_step": result.global_step, "seconds": result.seconds,
                            "resumed_from": result.resumed_from, "fingerprint": result.extra["fingerprint"]}
        offset += result.global_step
        if n < len(order) - 1:
            model = str(save_agent(result, work / f"{stage}_model"))
            del result, system
            gc.collect()
    result.extra["stages"] = summaries
    result.global_step = offset
    result.seconds = sum(s["seconds"] for s in summaries.values())
    resumed = [s["resumed_from"] for s in summaries.values() if s["resumed_from"] is not None]
    result.resumed_from = sum(resumed) if resumed else None    # steps not run in this session, all stages
    return result, rows_out


def curve_rows_joint(history: Sequence[dict], offset: int, stage: str) -> list[dict]:
    """The joint trainer's log entries as curve rows: every logged column kept, steps continued across stages."""
    return [{**h, "step": int(h["step"]) + offset, "stage": stage} for h in history]


__all__ = ["QAgentTrainParams", "qagent_system", "rollout_groups", "stage_ppo",
           "train_qagent", "trajectory_return", "trajectory_samples", "truncated"]
