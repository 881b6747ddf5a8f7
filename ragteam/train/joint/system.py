"""`JointSystem`: what a system hands the joint trainer (its rollout, reward, advantage estimator, the episodes
that train, the roles that stay frozen). Each system builds its own in its module (`ragteam.systems.<system>`)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ragteam.llm import Team
from ragteam.records import Episode
from ragteam.train.advantages import Scope

if TYPE_CHECKING:
    from ragteam.train.joint.batch import Sample



@dataclass(frozen=True)
class JointSystem:
    """What a joint system adds to the trainer: its roles, a training-mode rollout and its reward.

    Episodes may hold any number of calls, different from episode to episode (a JADE question answered in one round
    has two calls, a decomposed one a dozen): every call is a sample and GAE runs over each episode's own calls,
    within each call or across them as `gae_scope` says.
    `stats`: the system's own per-episode figures (e.g. JADE's rounds, retrievals, decomposition share), each
    averaged over a step's episodes into the step log under its name; a name also in the generic log (`turns`,
    `searches`) replaces the generic value."""

    name: str
    roles: tuple[str, ...]                                     # the trained roles: their calls are the samples
    rollout: Callable[[Sequence[dict], Team], list[Episode]]   # questions -> Episodes (training mode)
    annotate: Callable[[list[Episode]], list[Episode]]         # fills AgentCall.reward on every trained call
    describe: dict[str, Any]                                   # what goes into the fingerprint and the card
    stats: Mapping[str, Callable[[Episode], float]] = field(default_factory=dict)
    # None: GAE with the critic (M-ASK, JADE). "group": (r - mean) / std within each Sample.group (QAgent), no
    # critic. A function: episodes -> one advantage per call (aligned with Episode.calls; None for a call that
    # does not train), broadcast to the call's tokens (DECOR Eq. 6); no critic is built
    advantage: Callable[[list[Episode]], list[list[float | None]]] | Literal["group"] | None = None
    # (tokenizer, episodes) -> samples; None: one sample per call of a trained role
    samples: Callable[[Any, Sequence[Episode]], list[Sample]] | None = None
    # which rewarded episodes train this step (DECOR's dynamic sampling): whole groups (Episode.question_id) are
    # kept or dropped; None: all. With a `select`, a step that keeps fewer than its questions' groups rolls out
    # further questions, up to `max_rollout_rounds` rollouts per step, the first included (DAPO's
    # max_num_gen_batches; 1: no refill); see `_select_with_refill`
    select: Callable[[list[Episode]], list[Episode]] | None = None
    max_rollout_rounds: int = 1
    # helper roles that are never trained: role -> checkpoint, None = the base model of the policy (its LoRA
    # adapter switched off; a second copy without LoRA). Their calls are generated but are no samples.
    frozen_roles: dict[str, str | None] = field(default_factory=dict)
    # PPOParams values the estimator needs (DECOR: the sequence-level ratio); a mismatch is an error naming the key
    requires: dict[str, Any] = field(default_factory=dict)
    # GAE systems (advantage None) must say where their rewards sit: "call" when every call carries its own reward
    # (GAE within the call: its return is its reward), "episode" when the reward sits on the terminal call and must
    # reach the earlier calls through the critic. A property of the reward, so a system's, never a param
    gae_scope: Scope | None = None

    def __post_init__(self):
        if self.advantage is None and self.gae_scope not in ("call", "episode"):
            raise ValueError(f"joint system {self.name!r}: GAE with a critic needs gae_scope 'call' or 'episode', "
                             f"not {self.gae_scope!r}")

    @property
    def critic(self) -> bool:
        return self.advantage is None
