"""What `vime runs` and `vime samples` list: one summary per run, one line per sample.

Plain SQL over the store's tables (no token data is read for a listing), the same on SQLite
and PostgreSQL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import and_, case, distinct, func, select, text
from sqlalchemy.exc import DBAPIError

from vime.errors import ConfigError
from vime.ops.steps import step_index, step_number
from vime.sample_summary import failure_of, preview, versions_text
from vime.store import SampleStore
from vime.store.models import RunRow, SampleRow


FAILED = ("failed", "aborted")


@dataclass
class RunSummary:
    run_id: str
    created_at: str
    samples: int
    steps_trained: int
    num_rollout: int | None
    last_reward: float | None  # mean reward of the newest trained step
    failed: int  # samples stored as failed or aborted
    finished: bool = False  # its workflow recorded the run's end in the store
    ended: str | None = None  # "failed" or "cancelled": its launcher recorded how its workflow ended
    state: str = ""  # running, finished, failed, cancelled or stopped (`vime.ops.run_states`)

    @property
    def progress(self) -> str:
        if self.finished or (self.num_rollout and self.steps_trained >= self.num_rollout):
            return "finished"
        return f"step {self.steps_trained}/{self.num_rollout or '?'}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "progress": self.progress}


@dataclass
class SampleLine:
    key: str
    rollout_id: str
    step: int | None  # the train step that consumed it, from 1 (None while untrained); an eval sample's round
    reward: float | dict | None
    status: str
    version: str  # the policy version(s) that sampled its response
    length: int
    failure: str  # "" when it did not fail; else what kind: infra, error, aborted, ...
    cause: str
    preview: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_summaries(store: SampleStore) -> list[RunSummary]:
    per_run = (select(SampleRow.run_id, func.count().label("samples"),
                      func.count(distinct(SampleRow.trained_step)).label("steps"),
                      func.max(SampleRow.trained_step).label("last_step"),
                      func.sum(case((SampleRow.status.in_(FAILED), 1), else_=0)).label("failed"))
               .group_by(SampleRow.run_id).subquery())
    last_reward = (select(func.avg(SampleRow.reward))
                   .where(SampleRow.run_id == RunRow.run_id, SampleRow.trained_step == per_run.c.last_step)
                   .scalar_subquery())
    query = (select(RunRow.run_id, RunRow.created_at, RunRow.config, RunRow.finished, per_run.c.samples, per_run.c.steps,
                    per_run.c.failed, last_reward.label("last_reward"))
             .outerjoin(per_run, per_run.c.run_id == RunRow.run_id)
             .order_by(RunRow.created_at))
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    return [RunSummary(run_id=r.run_id, created_at=r.created_at.strftime("%Y-%m-%d %H:%M"), samples=r.samples or 0,
                       steps_trained=r.steps or 0, num_rollout=(r.config or {}).get("num_rollout"),
                       last_reward=None if r.last_reward is None else float(r.last_reward), failed=int(r.failed or 0),
                       finished=r.finished is not None, ended=((r.config or {}).get("ended") or {}).get("state"))
            for r in rows]


@dataclass
class SampleFilter:
    step: int | None = None
    status: str | None = None
    rollout: str | None = None
    untrained: bool = False
    failed: bool = False
    where: str | None = None  # an SQL condition over the samples table's columns
    evaluation: bool = False  # the eval samples (step: the round's) instead of the training samples
    dataset: str | None = None  # eval samples of this eval set only
    limit: int = 20
    offset: int = 0


def sample_lines(store: SampleStore, run_id: str, f: SampleFilter) -> tuple[list[SampleLine], int]:
    """The matching samples in write order (a page of them), and how many match in all."""
    evaluation = f.evaluation or f.dataset is not None
    step_column = SampleRow.eval_step if evaluation else SampleRow.trained_step
    conditions = [SampleRow.run_id == run_id,
                  SampleRow.eval_step.is_not(None) if evaluation else SampleRow.eval_step.is_(None)]
    if f.step is not None:  # steps from 1 (`vime.ops.steps`); a round at step N is after N steps
        conditions.append(step_column == (f.step if evaluation else step_index(f.step)))
    if f.dataset is not None:
        conditions.append(SampleRow.sample_metadata["eval_set"].as_string() == f.dataset)
    if f.status:
        conditions.append(SampleRow.status == f.status)
    if f.rollout:
        conditions.append(SampleRow.rollout_id == f.rollout)
    if f.untrained:
        conditions.append(SampleRow.trained_step.is_(None))
    if f.failed:
        conditions.append(SampleRow.status.in_(FAILED))
    if f.where:
        conditions.append(text(f"({f.where})"))
    columns = [SampleRow.key, SampleRow.rollout_id, step_column.label("step"), SampleRow.reward, SampleRow.reward_json,
               SampleRow.status, SampleRow.weight_versions, SampleRow.response_length, SampleRow.response,
               SampleRow.sample_metadata]
    page = select(*columns).where(and_(*conditions)).order_by(SampleRow.id).limit(f.limit).offset(f.offset)
    count = select(func.count()).select_from(SampleRow).where(and_(*conditions))
    try:
        with store.engine.connect() as conn:
            rows, total = conn.execute(page).all(), conn.execute(count).scalar_one()
    except DBAPIError as exc:
        if not f.where:
            raise
        raise ConfigError(f"--where {f.where!r}: {str(exc.orig).splitlines()[0]}; its columns: "
                          f"{', '.join(c.name for c in SampleRow.__table__.columns)}") from None
    if f.dataset is not None and not total:
        _check_eval_set(store, run_id, f.dataset)
    return [_line(r, evaluation) for r in rows], total


def _check_eval_set(store: SampleStore, run_id: str, name: str) -> None:
    """`--dataset NAME` that matched nothing: a set the run never evaluated is one line naming
    the sets it has, not an empty table."""
    eval_set = SampleRow.sample_metadata["eval_set"].as_string()
    query = select(eval_set).distinct().where(SampleRow.run_id == run_id, SampleRow.eval_step.is_not(None))
    with store.engine.connect() as conn:
        names = sorted(n for (n,) in conn.execute(query) if n is not None)
    if name not in names:
        raise ConfigError(f"--dataset {name!r}: run {run_id!r} has no eval set of that name; its eval sets: "
                          f"{', '.join(names) or 'none (no eval sample stored)'}")


def _line(r, evaluation: bool) -> SampleLine:
    meta = r.metadata or {}
    failure, cause = failure_of(r.status, meta)
    return SampleLine(key=r.key, rollout_id=r.rollout_id, step=r.step if evaluation else step_number(r.step),
                      reward=r.reward if r.reward is not None else r.reward_json, status=r.status,
                      version=versions_text(r.weight_versions), length=r.response_length, failure=failure,
                      cause=cause, preview=preview(r.response))
