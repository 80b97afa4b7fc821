"""Hooks that fail sometimes, or hang, cost their samples, not the run.

- A reward or generate hook that raises on a sample, or runs past `--custom-rm-timeout` /
  `--custom-generate-timeout`, leaves that sample FAILED with one line naming the hook, the
  sample and the file:line; its group is dropped whole and replaced, and the step counts it.
- The run trains on while a step's failed share stays within `--max-failed-sample-ratio`, and
  stops with the first hook error above it or when every sample fails.
- While a step waits on a slow hook the console says so.

The unit tests drive `run_group` with hooks and no engine; the two runs at the end go through
`vime train` on the tiny model and the shared training server.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import pytest

from activities.rollout import summarize
from tests.conftest import engine_flags
from tests.runs import TrainRun
from tests.test_bad_input import one_line_error, write
from tests.test_rollout_generate import FAKE_GENERATE, hook_module, make_args  # noqa: F401 - a fixture
from vime.launcher.follow import format_progress
from vime.rollout import hook_calls
from vime.rollout.group import run_group
from vime.rollout.rewards import SampleRewardError, reward
from vime.sample_summary import failure_class
from vime.store import SampleStore
from vime.types import Sample
from workflows.failures import StepFailures

HOOKS = '''
import asyncio, time

async def flaky(args, sample, **kwargs):
    if sample.index == 1:
        raise ValueError("the verifier choked")
    return 1.0

async def hangs(args, sample, **kwargs):
    await asyncio.sleep(10**6)

def blocks(args, sample, **kwargs):  # a plain function: called in a thread, where a hang blocks nothing
    time.sleep(10**6)

def sync_score(args, sample, **kwargs):
    return 0.5

async def generate_hangs(args, sample, sampling_params):
    await asyncio.sleep(10**6)
'''


def group(n: int = 3) -> list[Sample]:
    return [Sample(group_index=0, index=i, prompt="p", label="1") for i in range(n)]


# ---- one group --------------------------------------------------------------------------------


async def test_a_reward_that_raises_on_one_sample_fails_that_sample_naming_hook_sample_and_line(tmp_path,
                                                                                                 hook_module):
    fake, hooks = hook_module(FAKE_GENERATE), hook_module(HOOKS)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{fake}.fake", "--custom-rm-path",
                     f"{hooks}.flaky")
    rollouts = await run_group(args, group())
    [ok0], [bad], [ok2] = rollouts
    assert ok0.reward == ok2.reward == 1.0 and ok0.status != Sample.Status.FAILED
    assert bad.status == Sample.Status.FAILED and bad.reward is None
    line = bad.metadata["hook_failure"]
    assert line.startswith(f"--custom-rm-path '{hooks}.flaky' raised ValueError: the verifier choked on sample 1 (")
    assert line.endswith(f"{hooks}.py:6)"), line
    assert "infra_failure" not in bad.metadata
    assert failure_class(bad.status.value, bad.metadata) == "reward_error"  # its class in eval figures

    out = summarize(0, ["0", "1", "2"], rollouts, preview=False)
    assert (out.samples, out.errors, out.failed, out.first_error) == (3, 1, 1, line)


@pytest.mark.parametrize("hook", ["hangs", "blocks"], ids=["await-asyncio-sleep", "time-sleep-in-a-def"])
async def test_a_reward_that_hangs_times_out_on_its_own_sample_and_names_the_hook(tmp_path, hook_module, hook):
    fake, hooks = hook_module(FAKE_GENERATE), hook_module(HOOKS)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{fake}.fake", "--custom-rm-path",
                     f"{hooks}.{hook}", "--custom-rm-timeout", "0.5")
    t0 = time.monotonic()
    rollouts = await run_group(args, group(2))
    assert time.monotonic() - t0 < 3  # both at once, each within its limit: the loop was never blocked
    for i, [s] in enumerate(rollouts):
        assert s.status == Sample.Status.FAILED and s.reward is None
        assert s.metadata["hook_failure"] == f"--custom-rm-path {hooks}.{hook} timed out after 0.5 s on sample {i}"
        assert failure_class(s.status.value, s.metadata) == "timeout"
    assert not hook_calls.in_flight  # nothing left registered as waiting


async def test_a_generate_hook_that_hangs_times_out_and_the_sample_fails(tmp_path, hook_module):
    hooks = hook_module(HOOKS)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{hooks}.generate_hangs",
                     "--custom-generate-timeout", "0.3", "--rm-type", "exact_match")
    [[s]] = await run_group(args, group(1))
    assert s.status == Sample.Status.FAILED and "infra_failure" not in s.metadata  # not retried as an outage
    assert s.metadata["hook_failure"] == (f"--custom-generate-function-path {hooks}.generate_hangs timed out "
                                          "after 0.3 s on sample 0")
    assert failure_class(s.status.value, s.metadata) == "timeout"


async def test_a_sync_reward_runs_off_the_event_loop_and_scores_as_before(tmp_path, hook_module):
    hooks = hook_module(HOOKS)
    args = make_args(tmp_path, "--custom-rm-path", f"{hooks}.sync_score")
    assert await reward(args, Sample(index=0, response="x")) == 0.5


async def test_a_reward_error_outside_a_group_still_stops_what_called_it(tmp_path, hook_module):
    """`vime rescore` and other callers that record no failed samples stop as before."""
    hooks = hook_module(HOOKS)
    args = make_args(tmp_path, "--custom-rm-path", f"{hooks}.flaky")
    with pytest.raises(SampleRewardError, match="raised ValueError: the verifier choked on sample 1"):
        await reward(args, Sample(index=1))


async def test_a_call_waiting_past_half_its_limit_is_listed_for_the_console():
    async def slow(args, sample):
        await asyncio.sleep(0.5)
        return 1.0

    call = asyncio.create_task(hook_calls.call_limited(slow, "--custom-rm-path rm.score", 0.8, None, None,
                                                       run_id="r"))
    await asyncio.sleep(0.1)
    assert hook_calls.slow_calls() == {}
    await asyncio.sleep(0.35)
    [(key, (count, age))] = hook_calls.slow_calls().items()
    assert key == ("r", "--custom-rm-path rm.score") and count == 1 and 0.4 <= age < 0.8
    assert await call == 1.0
    assert hook_calls.waiting_line("--custom-rm-path rm.score", 3, 60.2) == \
        "[vime] waiting on --custom-rm-path rm.score for 60 s: 3 samples"


# ---- one step ---------------------------------------------------------------------------------


@dataclass
class Group:  # what StepFailures reads of a RolloutOutput
    samples: int = 4
    failed: int = 0
    first_error: str | None = None
    earlier: bool = False


def test_a_step_counts_every_sample_drawn_and_trains_while_the_failed_share_is_within_the_bound():
    step = StepFailures(0.1)
    step.add([Group(), Group(failed=3, first_error="first"), Group(failed=2, first_error="second")])
    assert (step.samples, step.failed, step.first_error) == (12, 5, "first") and step.over_bound()
    step.add([Group(), Group(), Group()])  # the replacement groups
    assert step.share == 5 / 24 and not step.over_bound()


def test_a_hook_failing_one_sample_in_20_trains_to_the_end_and_one_failing_40_percent_stops():
    """The bound is on the rate, not on one step's share: a steady 5% hook is above a 10% share
    in ~4% of 64-sample steps by chance, and must not stop a long run for it."""
    rng = random.Random(0)

    def step_of(rate: float) -> StepFailures:
        step = StepFailures(0.1)
        step.add([Group(samples=8, failed=sum(rng.random() < rate for _ in range(8))) for _ in range(8)])
        return step

    assert not any(step_of(0.05).over_bound() for _ in range(1000))
    assert all(step_of(0.4).over_bound() for _ in range(100))


def test_a_step_above_the_bound_stops_with_the_first_error_and_the_numbers():
    step = StepFailures(0.1)
    step.add([Group(failed=3, first_error="--custom-rm-path 'm.score' raised ValueError: x (m.py:3)"), Group(failed=1)])
    assert step.over_bound()
    assert step.stop_message(4) == ("step 4: 4 of its 8 samples failed (50%, more than --max-failed-sample-ratio 0.1 "
                                    "allows by chance: 2.9); "
                                    "the first error: --custom-rm-path 'm.score' raised ValueError: x (m.py:3)")


def test_a_step_whose_every_sample_failed_stops_even_when_any_share_is_allowed():
    step = StepFailures(1.0)
    step.add([Group(failed=4, first_error="boom"), Group(failed=4)])
    assert step.all_failed() and step.over_bound()
    assert step.stop_message(0) == ("step 0: every one of its 8 samples failed, so there is nothing to train on; "
                                    "the first error: boom")


def test_groups_answered_from_the_store_are_not_counted_again():
    """A run resumed after it stopped on a hook's failures (the hook fixed since) reads those
    groups back from the store: dropped, but the new step is not stopped by them."""
    step = StepFailures(0.1)
    step.add([Group(failed=4, first_error="old", earlier=True), Group()])
    assert (step.samples, step.failed, step.first_error) == (4, 0, None) and not step.over_bound()


def test_the_progress_line_shows_the_steps_failed_samples():
    m = {"step": 2, "reward_mean": 0.5, "failed_samples": 3}
    assert "| failed 3 |" in format_progress(m, 6)
    assert "failed" not in format_progress({**m, "failed_samples": 0}, 6)


# ---- vime train ----------------------------------------------------------------------------------

FLAKY = '''
import time

def score(args, sample, **kwargs):
    """1 sample in 20 fails: index 3 (and 43, ...) raises, index 23 (63, ...) hangs."""
    if sample.index % 40 == 3:
        raise ValueError(f"flaky verifier on sample {sample.index}")
    if sample.index % 40 == 23:
        time.sleep(10**6)
    return float(len(sample.response) % 2)
'''

HANGS = '''
import asyncio, time

def score(args, sample, **kwargs):
    if sample.index % 2:
        time.sleep(10**6)  # blocks: in its own thread
    return asyncio.sleep(10**6)  # never ends: on the worker's event loop
'''


def stored(run: TrainRun) -> list[Sample]:
    with SampleStore.open(run.run_dir) as store:
        return [s for _, s in store.iter_samples(run.run_id)]


@pytest.mark.vllm
def test_a_flaky_reward_trains_to_the_end_with_its_failures_counted_and_never_trained(
        training_server, tiny_model_dir, tmp_path):
    """Cost: one 3-step run of 4 groups x 4 samples (~100 s on 2 busy cores). The steps draw one
    replacement group each (the sample positions are fixed, so the failures are too)."""
    write(tmp_path / "flaky.py", FLAKY)
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--custom-rm-path", "flaky.score",
                   "--custom-rm-timeout", "4", steps=3, groups=4, n=4)
    assert run.run_to_end(600) == 0, run.tail()
    out = run.output()
    assert out.count("| failed 1 |") == 3, out[-3000:]
    assert "[vime] waiting on --custom-rm-path flaky.score for " in out, out[-3000:]

    metrics = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["failed_samples"] for m in metrics] == [1, 1, 1]
    assert run.trained_counts() == {0: 16, 1: 16, 2: 16}  # each step keeps its batch size
    samples = stored(run)
    failed = {s.index: s.metadata["hook_failure"] for s in samples if s.status == Sample.Status.FAILED}
    assert sorted(failed) == [3, 23, 43], failed
    assert failed[3].startswith("--custom-rm-path 'flaky.score' raised ValueError: flaky verifier on sample 3")
    assert failed[3].endswith("flaky.py:7)")
    assert failed[23] == "--custom-rm-path flaky.score timed out after 4 s on sample 23"
    dropped = {s.group_index for s in samples if s.status == Sample.Status.FAILED}
    with SampleStore.open(run.run_dir) as store:  # the failed samples' groups, and only they, were not trained
        assert {s.group_index for _, s in store.iter_samples(run.run_id, untrained=True)} == dropped
    run.assert_nothing_left()


@pytest.mark.vllm
def test_a_reward_that_hangs_on_every_sample_stops_the_run_with_its_named_timeout(
        training_server, tiny_model_dir, tmp_path):
    """Cost: one run that stops in its first step (~85 s on 2 busy cores). Odd samples block in a
    thread (time.sleep), even ones never end on the worker's loop (an awaitable): both time out."""
    write(tmp_path / "hang.py", HANGS)
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--custom-rm-path", "hang.score",
                   "--custom-rm-timeout", "3", steps=2, groups=2, n=4)
    t0 = time.monotonic()
    assert run.run_to_end(300) == 2
    line = one_line_error(run.output())
    assert "step 0: every one of its 8 samples failed" in line, line
    assert "--custom-rm-path hang.score timed out after 3 s on sample" in line, line
    assert time.monotonic() - t0 < 120, f"{time.monotonic() - t0:.0f} s"  # not the rollout activity's 2 hours
    samples = stored(run)
    assert len(samples) == 8 and all(s.status == Sample.Status.FAILED for s in samples)
    assert {s.metadata["hook_failure"] for s in samples} == {
        f"--custom-rm-path hang.score timed out after 3 s on sample {i}" for i in range(8)}
    assert run.trained_counts() == {}
    run.assert_nothing_left()
