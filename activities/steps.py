"""Step manifests: what each train step trains on, recorded once in the store.

The training workflow passes `(run, step)` to the trainer, never per-sample refs: payloads and
workflow state stay the same size whatever the batch size. `record_step` writes the manifest
(first write wins, so a step's content never changes once recorded: a resumed or replayed run
trains each step on exactly what it trained on before); `recorded_steps` tells a starting
workflow which of its next steps are already recorded — the prefetched steps handed over by a
continue-as-new, or the steps a failed run had collected — so they are trained, not collected
again. `run_record` tells it what the store holds of the run (steps trained, the newest
checkpoint, whether it finished: `workflows/durable_start.py`), and `record_finished` marks its end.
"""

from __future__ import annotations


from temporalio import activity

from vime.temporal.heartbeat import heartbeats_throughout
from vime.temporal.retry import final_config_errors
from vime.temporal.store_calls import store_call
from vime.store import SampleStore
from workflows.steps import (RECORD_FINISHED, RECORD_STEP, RECORDED_STEPS, RUN_RECORD, FinishedRun, RecordedStep,
                            RecordedStepsInput, RunRecord, StepRecord)


class StepActivities:
    def __init__(self, store: SampleStore) -> None:
        self.store = store

    @activity.defn(name=RECORD_STEP)
    @final_config_errors
    @heartbeats_throughout
    async def record_step(self, rec: StepRecord) -> RecordedStep:
        meta = {**rec.meta, "next_position": rec.next_position}
        manifest = await store_call(self.store.write_step_manifest, rec.run_id, rec.step, rec.rollout_ids,
                                           weight_version=rec.weight_version, meta=meta)
        return _recorded(manifest)

    @activity.defn(name=RECORDED_STEPS)
    @final_config_errors
    @heartbeats_throughout
    async def recorded_steps(self, inp: RecordedStepsInput) -> list[RecordedStep]:
        def read() -> list[RecordedStep]:
            found, step, misses = [], inp.from_step, 0
            while misses < inp.gap:
                manifest = self.store.read_step_manifest(inp.run_id, step)
                if manifest is None:
                    misses += 1
                else:
                    found.append(_recorded(manifest))
                    misses = 0
                step += 1
            return found

        return await store_call(read)

    @activity.defn(name=RUN_RECORD)
    @final_config_errors
    async def run_record(self, run_id: str) -> RunRecord:
        def read() -> RunRecord:
            trained = self.store.trained_counts(run_id)
            steps = max(trained) + 1 if trained else 0
            last = self.store.read_step_manifest(run_id, steps - 1) if steps else None
            progress = self.store.run_progress(run_id)
            return RunRecord(steps, _recorded(last).next_position if last else 0, progress.checkpoint,
                             progress.finished)

        return await store_call(read)

    @activity.defn(name=RECORD_FINISHED)
    @final_config_errors
    async def record_finished(self, inp: FinishedRun) -> None:
        await store_call(self.store.record_finished, inp.run_id, inp.state)

    def all(self) -> list:
        return [self.record_step, self.recorded_steps, self.run_record, self.record_finished]


def _recorded(manifest) -> RecordedStep:
    meta = manifest.meta or {}
    return RecordedStep(manifest.step, int(meta.get("next_position", 0)), len(manifest.rollout_ids),
                        manifest.weight_version, int(meta.get("failed_samples", 0)))
