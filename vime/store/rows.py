"""Converting between `Sample` / turns and the column values of `vime.store.models`.

Plain functions, no database access. Encoding checks everything a write could trip over
later (lengths, int32 range, JSON-serializable fields, a NaN reward), so a bad sample fails
here, before any transaction starts, and nothing of its rollout is written.

Round-trip invariant: `row_to_sample(sample_row(...))` equals the input sample, except that
`rollout_id` comes back as the stored string, `rollout_log_probs` and `teacher_log_probs` come back
rounded to float32,
and JSON fields come back as JSON gives them (tuples as lists, dict keys as strings).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Column

from vime.store import codec
from vime.store.models import KEY_LENGTH, ROLLOUT_ID_LENGTH, SampleRow, TurnRow
from vime.types import Sample, SampleError, SampleRef

# Columns a sample read selects, labelled by column name (ids and timestamps are not part of a Sample).
SAMPLE_COLUMNS: dict[str, Column] = {
    name: SampleRow.__table__.c[name]
    for name in (
        "key", "rollout_id", "sibling", "group_index", "index", "status", "reward", "reward_json",
        "response_length", "prompt", "response", "label", "metadata", "train_metadata", "weight_versions",
        "session_id", "remove_sample", "tokens", "loss_mask", "rollout_log_probs",
        "teacher_log_probs",
    )
}  # fmt: skip
# Columns a ref needs: no token data.
REF_COLUMNS: dict[str, Column] = {
    name: SAMPLE_COLUMNS[name] for name in ("key", "rollout_id", "status", "reward", "response_length")
}


def sample_key(rollout_id: str, sibling: int) -> str:
    return f"{rollout_id}/{sibling}"


def check_rollout_id(rollout_id: str | int) -> str:
    """The rollout id as stored (a string); rejects ids that cannot be stored."""
    if isinstance(rollout_id, bool) or not isinstance(rollout_id, str | int):
        raise SampleError(f"rollout_id {rollout_id!r} must be a str or int")
    text = str(rollout_id)
    if not text or len(text) > min(ROLLOUT_ID_LENGTH, KEY_LENGTH - 8):
        raise SampleError(f"rollout_id {text!r} must be 1 to {ROLLOUT_ID_LENGTH} characters")
    return text


def sample_row(run_id: str, rollout_id: str, sibling: int, sample: Sample) -> dict[str, Any]:
    """Column values for `sample` stored as sibling `sibling` of `rollout_id`; raises `SampleError`."""
    where = f"rollout {rollout_id!r} sample {sibling}"
    if not isinstance(sample, Sample):
        raise SampleError(f"{where}: expected a vime.types.Sample, got {type(sample).__name__}")
    try:
        sample.validate()
        if sample.rollout_id is not None and str(sample.rollout_id) != rollout_id:
            raise SampleError(
                f"Sample.rollout_id={sample.rollout_id!r} differs from the rollout it is written under; "
                f"siblings of one rollout share its id"
            )
        reward, reward_json = _split_reward(sample.reward)
        return {
            "run_id": run_id,
            "key": sample_key(rollout_id, sibling),
            "rollout_id": rollout_id,
            "sibling": sibling,
            "group_index": sample.group_index,
            "index": sample.index,
            "status": parse_status(sample.status).value,
            "reward": reward,
            "reward_json": reward_json,
            "response_length": sample.response_length,
            "prompt": check_json("Sample.prompt", sample.prompt),
            "response": sample.response,
            "label": check_json("Sample.label", sample.label),
            "metadata": check_json("Sample.metadata", sample.metadata),
            "train_metadata": check_json("Sample.train_metadata", sample.train_metadata),
            "weight_versions": check_json("Sample.weight_versions", list(sample.weight_versions)),
            "session_id": sample.session_id,
            "remove_sample": bool(sample.remove_sample),
            "trained_step": None,
            "tokens": codec.encode_int32(sample.tokens, name="Sample.tokens"),
            "loss_mask": codec.encode_optional(codec.encode_uint8, sample.loss_mask, name="Sample.loss_mask"),
            "rollout_log_probs": codec.encode_optional(
                codec.encode_float32, sample.rollout_log_probs, name="Sample.rollout_log_probs"
            ),
            "teacher_log_probs": codec.encode_optional(
                codec.encode_float32, sample.teacher_log_probs, name="Sample.teacher_log_probs"
            ),
        }
    except SampleError as exc:
        raise SampleError(f"{where}: {exc}") from None
    except ValueError as exc:  # ConfigError from the codec
        raise SampleError(f"{where}: {exc}") from None


def row_to_sample(row: Mapping[str, Any]) -> Sample:
    """The `Sample` for a row selected with `SAMPLE_COLUMNS`."""
    reward = row["reward_json"] if row["reward_json"] is not None else row["reward"]
    return Sample(
        group_index=row["group_index"],
        index=row["index"],
        rollout_id=row["rollout_id"],
        prompt=row["prompt"],
        tokens=codec.decode_int32(row["tokens"]),
        response=row["response"],
        response_length=row["response_length"],
        label=row["label"],
        reward=reward,
        loss_mask=codec.decode_optional(codec.decode_uint8, row["loss_mask"]),
        rollout_log_probs=codec.decode_optional(codec.decode_float32, row["rollout_log_probs"]),
        teacher_log_probs=codec.decode_optional(codec.decode_float32, row["teacher_log_probs"]),
        weight_versions=list(row["weight_versions"] or []),
        status=Sample.Status(row["status"]),
        metadata=row["metadata"] if row["metadata"] is not None else {},
        session_id=row["session_id"],
        remove_sample=bool(row["remove_sample"]),
        train_metadata=row["train_metadata"],
    )


def row_to_ref(run_id: str, row: Mapping[str, Any]) -> SampleRef:
    """The `SampleRef` for a row (or a `sample_row` dict); a dict reward gives `reward=None`."""
    return SampleRef(
        run_id=run_id,
        key=row["key"],
        rollout_id=row["rollout_id"],
        status=row["status"],
        reward=row["reward"],
        response_length=row["response_length"],
    )


def turn_row(
    run_id: str,
    rollout_id: str,
    turn: int,
    token_ids: Sequence[int],
    loss_mask: Sequence[int],
    log_probs: Sequence[float] | None,
    meta: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Column values for one trajectory turn; raises `SampleError` on misaligned lists."""
    where = f"rollout {rollout_id!r} turn {turn}"
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise SampleError(f"{where}: turn must be an int >= 0")
    n = len(token_ids)
    if len(loss_mask) != n:
        raise SampleError(f"{where}: loss_mask has {len(loss_mask)} entries for {n} token ids")
    if log_probs is not None and len(log_probs) != n:
        raise SampleError(f"{where}: log_probs has {len(log_probs)} entries for {n} token ids")
    try:
        return {
            "run_id": run_id,
            "rollout_id": rollout_id,
            "turn": turn,
            "token_ids": codec.encode_int32(token_ids, name="token_ids"),
            "loss_mask": codec.encode_uint8(loss_mask, name="loss_mask"),
            "log_probs": codec.encode_optional(codec.encode_float32, log_probs, name="log_probs"),
            "meta": check_json("meta", dict(meta or {})),
        }
    except ValueError as exc:
        raise SampleError(f"{where}: {exc}") from None


TURN_COLUMNS: dict[str, Column] = {
    name: TurnRow.__table__.c[name] for name in ("turn", "token_ids", "loss_mask", "log_probs", "meta")
}


def parse_status(value: Any, *, what: str = "Sample.status") -> Sample.Status:
    """A `Sample.Status` from itself, its value ("completed") or its name ("COMPLETED")."""
    try:
        return Sample.Status(value.value if isinstance(value, Sample.Status) else str(value).lower())
    except ValueError:
        names = ", ".join(s.value for s in Sample.Status)
        raise SampleError(f"{what} {value!r} is not one of {names}") from None


def _split_reward(reward: Any) -> tuple[float | None, dict[str, Any] | None]:
    if reward is None:
        return None, None
    if isinstance(reward, Mapping):
        return None, check_json("Sample.reward", dict(reward))
    try:
        value = float(reward)
    except (TypeError, ValueError):
        raise SampleError(f"Sample.reward {reward!r} must be a number, a dict of scores, or None") from None
    if math.isnan(value):
        raise SampleError("Sample.reward is NaN; the reward function returned no usable score")
    return value, None


def check_json(name: str, value: Any) -> Any:
    """`value` unchanged, once it is known to serialize (else an error naming the field)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise SampleError(
            f"{name} cannot be stored as JSON ({exc}); keep it to str, numbers, bools, None, "
            f"lists and dicts with str keys"
        ) from None
    return value
