"""Core data types: `Sample` (slime-compatible) and the small refs that travel through Temporal.

This module must stay importable inside Temporal's workflow sandbox: standard library only,
no torch / numpy. Token data lives in `Sample` and in the store; workflows only ever see
the refs defined at the bottom (ids and small summaries), never token lists.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from vime.errors import ConfigError


class SampleError(ConfigError):
    """A `Sample` whose fields contradict each other (lengths that do not line up)."""


@dataclass
class Sample:
    """One trainable sequence: a prompt and the response the policy sampled for it.

    Invariants (checked by `validate` and kept by `append_response_tokens`):
    - `tokens` is prompt tokens followed by `response_length` response tokens;
    - `loss_mask`, when set, has exactly `response_length` entries: 1 on model-sampled tokens,
      0 on tool / environment / template tokens spliced into the response;
    - `rollout_log_probs`, when set, has exactly `response_length` entries (0.0 where masked);
    - `teacher_log_probs` (on-policy distillation, slime's field), when set, has exactly
      `response_length` entries: the teacher's log-probs of the response tokens the policy sampled.

    Siblings of a fan-out (one rollout split into several segments) share `rollout_id`.
    `weight_versions` holds the weight-version spans vLLM reported for the response,
    as dicts `{"version", "start", "end"}` or plain version strings (slime's form).
    """

    class Status(str, enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: str | int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    teacher_log_probs: list[float] | None = None
    weight_versions: list[Any] = field(default_factory=list)
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    remove_sample: bool = False
    train_metadata: dict[str, Any] | None = None

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[len(self.tokens) - self.response_length :]

    def append_response_tokens(
        self,
        token_ids: list[int],
        log_probs: list[float] | None = None,
        *,
        loss_mask: int | list[int] = 1,
        text: str | None = None,
    ) -> None:
        """Extend the response by `token_ids`, keeping every per-token list aligned.

        `loss_mask` is 1 for model-sampled tokens (pass their `log_probs`) and 0 for spliced-in
        tool or environment tokens (their log-probs default to 0.0). Raises `SampleError`
        before changing anything when the lengths disagree.
        """
        n = len(token_ids)
        mask = [loss_mask] * n if isinstance(loss_mask, int) else list(loss_mask)
        if len(mask) != n:
            raise SampleError(f"append_response_tokens: loss_mask has {len(mask)} entries for {n} token ids")
        if any(m not in (0, 1) for m in mask):
            raise SampleError("append_response_tokens: loss_mask entries must be 0 or 1")
        if log_probs is not None and len(log_probs) != n:
            raise SampleError(f"append_response_tokens: {len(log_probs)} log_probs for {n} token ids")
        if log_probs is None and any(mask) and self.rollout_log_probs is not None:
            raise SampleError(
                "append_response_tokens: sampled tokens (loss_mask=1) need log_probs, "
                "since this sample already records rollout_log_probs"
            )
        self.validate()
        if self.loss_mask is None:
            self.loss_mask = [1] * self.response_length
        if log_probs is not None and self.rollout_log_probs is None:
            if self.response_length and any(self.loss_mask):
                raise SampleError(
                    "append_response_tokens: earlier sampled tokens have no log_probs; "
                    "pass log_probs from the first sampled token on"
                )
            self.rollout_log_probs = [0.0] * self.response_length
        self.tokens.extend(int(t) for t in token_ids)
        self.response_length += n
        self.loss_mask.extend(mask)
        if self.rollout_log_probs is not None:
            self.rollout_log_probs.extend(float(x) for x in (log_probs or [0.0] * n))
        if text is not None:
            self.response += text

    def validate(self) -> None:
        """Raise `SampleError` naming the field whose length breaks an invariant."""
        if self.response_length < 0 or self.response_length > len(self.tokens):
            raise SampleError(
                f"Sample.response_length={self.response_length} but tokens has {len(self.tokens)} entries"
            )
        for name in ("loss_mask", "rollout_log_probs", "teacher_log_probs"):
            values = getattr(self, name)
            if values is not None and len(values) != self.response_length:
                raise SampleError(
                    f"Sample.{name} has {len(values)} entries but response_length={self.response_length}"
                )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SampleError(f"Sample.from_dict: unknown fields {sorted(unknown)}")
        kwargs = dict(data)
        if "status" in kwargs:
            kwargs["status"] = _parse_status(kwargs["status"])
        return cls(**kwargs)


def _parse_status(value: Any) -> Sample.Status:
    if isinstance(value, Sample.Status):
        return value
    try:
        return Sample.Status(str(value).lower())
    except ValueError:
        try:
            return Sample.Status[str(value).upper()]
        except KeyError:
            names = ", ".join(s.name for s in Sample.Status)
            raise SampleError(f"Sample.status {value!r} is not one of {names}") from None


# ---- refs: what workflows pass around instead of token data ---------------------------------


@dataclass(frozen=True)
class SampleRef:
    """Claim check for one stored sample: `store.read_samples(run_id, [ref])` gives it back."""

    run_id: str
    key: str
    rollout_id: str
    status: str
    reward: float | None = None
    response_length: int = 0


@dataclass(frozen=True)
class RolloutRef:
    """One finished rollout (a single sample or the siblings of a fan-out), as the store has it.

    `infra_failure` carries the cause when the rollout failed for infrastructure reasons
    (sandbox died, engine down); such rollouts are kept out of advantage statistics.
    """

    run_id: str
    rollout_id: str
    samples: list[SampleRef]
    weight_version: int = 0
    infra_failure: str | None = None

    @property
    def rewards(self) -> list[float | None]:
        return [s.reward for s in self.samples]
