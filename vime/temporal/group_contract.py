"""The group contract: what the training workflow hands an environment's group workflow
(`GroupInput`) and what it gets back (`GroupOutput`).

Every environment is consumed as a group of rollout ids: the samples travel through the store,
only ids and this small summary through Temporal. It lives below workflows/ and vime/envs/
because the training workflow's state carries a `GroupOutput` (`TrainingState.queued`,
`vime.temporal.training_contract`), and the launcher, `vime config` and the ops commands read
that state without importing workflow code. The single-turn groups' names `RolloutInput` and
`RolloutOutput` are the same classes; recorded histories carry the fields, not the names.
Standard library only: workflows import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GroupInput:
    run_id: str
    step: int
    position: int  # the data source's prompt position: group_index of the samples
    weight_version: int
    evaluation: bool = False  # an eval group: `position` is a prompt of eval set `eval_set` (see workflows/eval_round.py)
    heartbeat_seconds: float = 60.0
    local_activity: bool = False  # generate in the workflow's own worker (see RolloutWorkflow)
    # For environments whose group workflow fans out: the run's settings it needs.
    n_samples_per_prompt: int = 1
    sandbox_task_queue: str = "vime-sandbox"
    eval_set: str | None = None  # with `evaluation`: the `--eval-prompt-data` set the prompt is from


@dataclass
class SampleInput:
    """One sample of a group, as a fanned-out group hands it to its per-sample workflow or
    activity (`SampleInput.of(group, i)`); an environment adds fields of its own by subclassing."""

    run_id: str
    step: int
    position: int  # the data source's prompt position (the group)
    index: int  # which sample of the group
    weight_version: int
    heartbeat_seconds: float = 60.0
    evaluation: bool = False  # the group's: a sample of an eval prompt (see GroupInput)
    eval_set: str | None = None

    @classmethod
    def of(cls, group: GroupInput, index: int, **extra):
        """Sample `index` of `group`, with the subclass's own fields in `extra`."""
        return cls(group.run_id, group.step, group.position, index, group.weight_version,
                   heartbeat_seconds=group.heartbeat_seconds, evaluation=group.evaluation, eval_set=group.eval_set,
                   **extra)


@dataclass
class GroupOutput:
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
    # Seconds by phase of the activity that made the group (`vime.rollout.phase_times`: context,
    # run_group, store; http, tokenize, reward summed over its samples), for the step's profile.
    perf: dict[str, float] = field(default_factory=dict)


RolloutInput = GroupInput
RolloutOutput = GroupOutput
