"""What a finished prompt group returns to the training workflow (`RolloutOutput`).

Lives below workflows/ because the training workflow's state carries it (`TrainingState.queued`,
`vime.temporal.training_contract`), and the launcher, `vime config` and the ops commands read
that state without importing workflow code. Standard library only: workflows import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RolloutOutput:
    """A finished group as the training workflow sees it: its rollout ids and a summary."""

    position: int
    rollout_ids: list[str] = field(default_factory=list)
    keep: bool = True  # the dynamic-sampling filter's verdict for the group
    filter_reason: str | None = None
    reward_mean: float | None = None
    status: str = "completed"
    samples: int = 0
    errors: int = 0  # samples that failed with an error of the model, the data or a hook (not infra)
    infra: int = 0  # samples that failed for infrastructure reasons (agent rollouts only: kept, not trained)
    first_error: str | None = None
    failed: int = 0  # of `errors`, the samples a hook failed (raised, timed out): the group is not kept
    earlier: bool = False  # answered from the store: generated (and its failures counted) before
    # What the Web UI shows of the group (its workflow's memo): each sample's reward, status and
    # the start of its prompt and response. The group's workflow takes it off before returning,
    # so the training workflow's history never carries text.
    preview: list[dict] | None = None
