"""Agent-sized samples from a fixed seed, for the store's round-trip test and bulk benchmark."""

from __future__ import annotations

import numpy as np

from vime.types import Sample


def random_rollouts(start: int, count: int, *, length: int, prompt_length: int) -> dict[str, list[Sample]]:
    """Samples `start .. start+count-1` as rollouts of 4 siblings, from a seed fixed by `start`:
    the same arguments give the same samples, so a reader can rebuild what a writer stored."""
    rng = np.random.default_rng([11, start])
    response_length = length - prompt_length
    tokens = rng.integers(0, 151_000, (count, length), dtype=np.int32).tolist()
    masks = rng.integers(0, 2, (count, response_length), dtype=np.uint8).tolist()
    log_probs = (-rng.random((count, response_length), dtype=np.float32) * 5).tolist()
    rollouts: dict[str, list[Sample]] = {}
    for offset in range(count):
        i = start + offset
        rollout_id = f"group-{i // 4}"
        rollouts.setdefault(rollout_id, []).append(
            Sample(
                group_index=i // 4,
                index=i,
                rollout_id=rollout_id,
                prompt=[{"role": "user", "content": f"task {i}"}],
                tokens=tokens[offset],
                response=f"response {i}",
                response_length=response_length,
                loss_mask=masks[offset],
                rollout_log_probs=log_probs[offset],
                reward=float(i % 2),
                status=Sample.Status.COMPLETED,
                weight_versions=[{"version": i // 1000, "start": 0, "end": response_length}],
                metadata={"i": i},
            )
        )
    return rollouts
