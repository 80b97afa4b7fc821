"""Where prompt groups come from: a position-addressed view of the prompt file.

A training run consumes prompts by an integer *position*, a global prompt counter that the
training workflow keeps in its state and in checkpoints. Position p is prompt group p:

    epoch, offset = divmod(p, len(dataset))
    prompt = dataset[permutation(epoch)[offset]]   (with --rollout-shuffle; else dataset[offset])

so any process, after any crash, maps a position to the same prompt, and every prompt is used
exactly once per epoch. The group holds `--n-samples-per-prompt` copies with
`group_index = p` and `index = p * n + i`, which makes sample indices (and the rollout ids made
from them) unique in a run and stable across retries.

`RolloutDataSource` also keeps slime's stateful interface (`get_samples`, `add_samples`,
`state_dict`, `save`/`load`) for rollout functions written for slime; its state is the next
position plus the buffer of groups handed back (partial rollouts). `--data-source-path` names
a replacement class, constructed as `cls(args)`.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from vime.errors import ConfigError
from vime.plugins import load_function, load_hook
from vime.rollout.dataset import PromptDataset
from vime.types import Sample

__all__ = ["PromptDataset", "RolloutDataSource", "make_data_source", "pop_first"]


def pop_first(args: Any, rollout_id: Any, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """The default buffer filter (slime's): the oldest groups first, removed from the buffer."""
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


class RolloutDataSource:
    """Prompt groups by position, plus slime's `get_samples` / `add_samples` cursor and buffer.

    Without `--prompt-data` groups hold blank samples (as in slime), for custom generate
    functions that make their own prompts.
    """

    def __init__(self, args: Any, dataset: PromptDataset | None = None) -> None:
        self.args = args
        if dataset is None and args.prompt_data:
            dataset = PromptDataset.from_args(args)
        self.dataset = dataset
        self.position = 0
        self.buffer: list[list[Sample]] = []
        self.metadata: dict[str, Any] = {}
        self._buffer_filter = load_hook(args, "buffer_filter_path") or pop_first

    @property
    def n_samples_per_prompt(self) -> int:
        return int(self.args.n_samples_per_prompt or 1)

    def __len__(self) -> int:
        """Prompts per epoch (0 without a dataset)."""
        return 0 if self.dataset is None else len(self.dataset)

    def locate(self, position: int) -> tuple[int, int]:
        """`(epoch, dataset index)` of the prompt at `position`."""
        if not isinstance(position, int) or isinstance(position, bool) or position < 0:
            raise ConfigError(f"prompt position must be a non-negative integer, got {position!r}")
        if self.dataset is None:
            return 0, position
        epoch, offset = divmod(position, len(self.dataset))
        if self.args.rollout_shuffle:
            return epoch, self.dataset.permutation(epoch)[offset]
        return epoch, offset

    def prompt_group(self, position: int) -> list[Sample]:
        """The `n` fresh samples of the prompt group at `position` (deterministic, no state change)."""
        _, i = self.locate(position)
        template = Sample() if self.dataset is None else self.dataset[i]
        n = self.n_samples_per_prompt
        group = []
        for k in range(n):
            sample = copy.deepcopy(template)
            sample.group_index = position
            sample.index = position * n + k
            sample.status = Sample.Status.PENDING
            group.append(sample)
        return group

    # ---- slime's stateful interface ------------------------------------------------------------

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """`num_groups` groups: first from the buffer (through `--buffer-filter-path`), then the
        next positions."""
        groups: list[list[Sample]] = []
        if self.buffer and num_groups > 0:
            groups = list(self._buffer_filter(self.args, None, self.buffer, num_groups))[:num_groups]
        while len(groups) < num_groups:
            groups.append(self.prompt_group(self.position))
            self.position += 1
        return groups

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Hand groups back (aborted or unfinished ones); `get_samples` returns them before new prompts."""
        if not isinstance(groups, list) or not all(
            isinstance(g, list) and g and all(isinstance(s, Sample) for s in g) for g in groups
        ):
            raise ConfigError("add_samples expects a list of groups, each a non-empty list of Sample")
        self.buffer.extend(groups)

    def get_buffer_length(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the next position, the buffer, and slime's free-form metadata."""
        return {
            "position": self.position,
            "buffer": [[s.to_dict() for s in g] for g in self.buffer],
            "metadata": copy.deepcopy(self.metadata),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        position = state.get("position", 0)
        if not isinstance(position, int) or position < 0:
            raise ConfigError(f"data source state: position must be a non-negative integer, got {position!r}")
        self.position = position
        self.buffer = [[Sample.from_dict(d) for d in g] for g in state.get("buffer", [])]
        self.metadata = dict(state.get("metadata") or {})

    def _state_path(self, directory: str | None, rollout_id: Any) -> str | None:
        if not directory:
            return None
        return os.path.join(directory, "rollout", f"data_source_state_{rollout_id}.json")

    def save(self, rollout_id: Any) -> None:
        """slime's `save`: the state as JSON under `--save`/rollout/ (nothing without --save)."""
        path = self._state_path(self.args.save, rollout_id)
        if path is None:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state_dict(), f)
        os.replace(tmp, path)

    def load(self, rollout_id: Any = None) -> None:
        """slime's `load`: restore the state `save(rollout_id)` wrote, if there is one."""
        path = self._state_path(self.args.load, rollout_id)
        if path is None or not os.path.exists(path):
            return
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"data source state {path!r}: cannot read it ({exc}); delete it to start over") from exc
        self.load_state_dict(state)


def make_data_source(args: Any) -> Any:
    """The data source `args` asks for: `--data-source-path`'s class, else `RolloutDataSource`."""
    path = args.data_source_path
    if path is None:
        return RolloutDataSource(args)
    cls = load_function(path, "--data-source-path")
    return cls(args)
