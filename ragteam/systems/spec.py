"""`System`: everything one system is, as one object the stages, the joint trainer, the warm-up, evaluation and
params_check read from `ragteam.systems.registry.REGISTRY` (issue 72). A system's module builds one and the registry lists
it; no module outside the system's own decides anything by its name.

The trainer and the warm-up sit below the systems (tests/test_layering.py): they take what a system hands them
(`ragteam.train.joint.system.JointSystem`, `ragteam.warmup.oracle.OracleSystem`) and never import a system. The
stages, which sit above, look the system up here and pass those objects in.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ragteam.config import Strict
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import TeamReward
from ragteam.train.checkpoints import TrainResult
from ragteam.train.joint.params import PPOParams
from ragteam.train.joint.system import JointSystem
from ragteam.warmup.oracle import OracleSystem


@dataclass(frozen=True)
class RowKind:
    """One kind of evaluate row (`ragteam.eval.evaluate.SystemSpec.workflow`): how evaluation runs and scores it.

    `roles`: the workflow's roles, in order (a row's `model` moves all but `frozen_roles`, helper roles that are never
    trained and stay on the base model or their own checkpoint). `run(rows, team, retriever, cfgs, spec, name)` runs
    the workflow on the rows (`cfgs`: `ragteam.eval.evaluate.WorkflowConfigs`, `spec` the row) and returns one
    Episode per row. `post_score(scored, team, cfgs)` adds what the system scores after EM/F1 on the episodes with
    golds (its rewards; LJ where `judged`: the system judges its episodes itself, evaluation's LJ judge is not used).
    `has_team_reward(spec, cfgs)`: whether the row's episodes get the system's team reward (None: whenever the
    system has one for the kind, `System.team_rewards`). `family`: its figure panel (the paper it comes from).
    `settings`: the `SystemSpec` row settings only this kind accepts. `check(name, spec, agents)`: a params error
    message for a row that cannot run (None: fine). `compared_with`: the row kind that a row of this kind, named as
    the kind, is compared against when both are rows (the report's derived pairs, `comparison_pairs`); `ablations`:
    rows of this kind get the full-trained vs untrained vs ablated-agent pairs (MAPS's Table 2)."""

    roles: tuple[str, ...]
    run: Callable[..., list[Episode]]
    family: str
    frozen_roles: tuple[str, ...] = ()
    post_score: Callable[..., None] | None = None
    judged: bool = False
    retrieves: bool = True          # False: runs without a retriever (the native baseline)
    has_team_reward: Callable[[Any, Any], bool] | None = None
    settings: tuple[str, ...] = ()
    check: Callable[[str, Any, Any], str | None] | None = None
    compared_with: str | None = None
    ablations: bool = False


@dataclass(frozen=True)
class System:
    """One system (module docstring).

    `section`: its inference params section (`mask`, `jade`, ...) and `config` the model that section parses into
    (None: a system without one). `train_params`: the model of `joint.<name>` (None: no joint training); `joint`
    builds what the joint trainer trains from params and the rollouts' retriever, with the system's rewards, credit
    scope and advantage estimator (None: not trained by `train_joint`); `reward_text` says in words what its reward
    is (the model card's). `oracle` builds its warm-up oracle player (None: no warm-up). `stages`: the successive
    training stages of a system whose `train_joint` runs several (QAgent), each built by `joint(params, retriever,
    stage, generator)`, their PPO settings by `stage_ppo` and run in order by `train_stages`; empty: one run of the
    joint loop."""

    name: str
    section: str | None = None
    config: type[Strict] | None = None
    train_params: type[Strict] | None = None
    joint: Callable[..., JointSystem] | None = None
    reward_text: str | None = None
    oracle: Callable[[dict[str, Any]], OracleSystem] | None = None
    stages: tuple[str, ...] = ()
    # a system of several stages: (joint.ppo merged, joint.<system>, stage) -> the stage's PPO settings, and the run
    # of every stage in order (`ragteam.systems.qagent.train.train_qagent`'s signature)
    stage_ppo: Callable[[PPOParams, Any, str], PPOParams] | None = None
    train_stages: Callable[..., tuple[TrainResult, list[dict]]] | None = None
    # the evaluate row settings (`ragteam.eval.evaluate.SystemSpec`) under which the team-reward probe of its RL
    # scores held-out questions with its own training reward (M-ASK: the Answer agent after every turn)
    probe_row: dict[str, Any] = field(default_factory=dict)
    # role -> regex: its roles' output formats for guided decoding, the `<system>_grammar` rows of evaluate
    # (`ragteam.agents.grammars`); empty: no grammar rows
    grammars: dict[str, str] = field(default_factory=dict)
    # evaluation row kind (`SystemSpec.workflow`) -> the system's own training reward of its finished episodes
    # (`metrics["team_reward"]`, ragteam.rewards.team); a kind without one has no team reward
    team_rewards: dict[str, TeamReward] = field(default_factory=dict)
    # evaluation row kind (`SystemSpec.workflow`) -> how evaluate runs and scores such a row; empty: no rows
    rows: dict[str, RowKind] = field(default_factory=dict)
    # roles whose trained checkpoints `eval.agents` may name (by role)
    agent_roles: tuple[str, ...] = ()
    # (WorkflowConfigs) -> helper role -> its own checkpoint, whatever the row (DECOR's frozen summarizer and judge)
    frozen_role_models: Callable[[Any], dict[str, str]] | None = None
    # (WorkflowConfigs, team) -> the LJ judge evaluation uses for rows that do not judge themselves (`eval.lj: all`)
    judge: Callable[[Any, Any], Any] | None = None
    # (WorkflowConfigs, base model, the row kinds in use, whether every row gets LJ) -> the report's context lines
    # for this system's settings ({}: none to show)
    report_context: Callable[[Any, str, set[str], bool], dict[str, str]] | None = None

    def build_joint(self, params: dict[str, Any], retriever: Retriever, *args) -> JointSystem:
        if self.joint is None:
            raise ValueError(f"system {self.name!r} is not trained by train_joint")
        return self.joint(params, retriever, *args)
