"""`rescore_page`: one page of a run's stored samples scored by new reward code (RescoreWorkflow).

The reward function gets slime's `args` as the run was started (its stored config, read by run id), with
`--custom-rm-path` (and `--group-rm`) replaced; with `--group-rm` it scores each prompt group of
the page at once. A reward function that raises or returns a non-number stops the rescore with
its one line (a `RewardError`), as it stops a run.
"""

from __future__ import annotations

from itertools import groupby

from temporalio import activity

from vime.temporal.retry import final_config_errors
from vime.temporal.heartbeat import heartbeating
from vime.temporal.store_calls import store_call
from vime.errors import ConfigError
from vime.ops.rescore import stored_run_config
from vime.rollout.rewards import group_rewards
from vime.config.run_args import args_from_stored
from vime.store import SampleStore
from vime.temporal.rescore import RESCORE_PAGE, RescorePage, RescorePageResult


class RescoreActivities:
    def __init__(self, store: SampleStore) -> None:
        self.store = store
        self._configs: dict[str, dict] = {}  # run id -> its stored config (it never changes)

    async def _run_config(self, run_id: str) -> dict:
        if run_id not in self._configs:
            config = await store_call(stored_run_config, self.store, run_id)
            if config is None:
                raise ConfigError(f"run {run_id!r} is not in {self.store.url}; `vime runs` lists the runs")
            self._configs[run_id] = config
        return self._configs[run_id]

    @activity.defn(name=RESCORE_PAGE)
    @final_config_errors
    async def rescore_page(self, inp: RescorePage) -> RescorePageResult:
        rows = await store_call(self.store.read_sample_page, inp.run_id, inp.after_id, inp.limit)
        if not rows:
            return RescorePageResult(inp.after_id, 0, 0)
        args = args_from_stored(await self._run_config(inp.run_id), custom_rm_path=inp.custom_rm_path, group_rm=inp.group_rm)
        rewards: dict[str, float | dict] = {}
        async with heartbeating():  # a killed rescore's page is retried after the heartbeat timeout
            for _, group in groupby(rows, key=lambda row: row[2].group_index):
                group = list(group)
                values = await group_rewards(args, [sample for _, _, sample in group])
                rewards.update({key: value for (_, key, _), value in zip(group, values, strict=True)})
        written = await store_call(self.store.write_rescores, inp.run_id, inp.scorer, rewards)
        return RescorePageResult(rows[-1][0], len(rows), written)
