"""`System`: everything one system is, as one object the stages, the joint trainer, the warm-up, evaluation and
params_check read from `ragteam.systems.REGISTRY` (issue 72). A system's module builds one and the registry lists
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
from ragteam.retrieval.base import Retriever
from ragteam.rewards.team import TeamReward
from ragteam.train.checkpoints import TrainResult
from ragteam.train.joint.params import PPOParams
from ragteam.train.joint.system import JointSystem
from ragteam.warmup.oracle import OracleSystem


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

    def build_joint(self, params: dict[str, Any], retriever: Retriever, *args) -> JointSystem:
        if self.joint is None:
            raise ValueError(f"system {self.name!r} is not trained by train_joint")
        return self.joint(params, retriever, *args)
