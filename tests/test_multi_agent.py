"""examples/multi_agent: K solvers, a rewriter and a selector (one policy) return as one fan-out.

- Every rollout's samples share one `rollout_id` and carry their role (`metadata["role"]`); each
  role's reward is its own score times slime's correct / incorrect weight of the final outcome,
  and the advantages count each rollout once in its group whatever its fan-out.
- Durable: one workflow per rollout, one activity per role, each role's turns checkpointed in
  the store; a rollout worker killed with SIGKILL mid-rollout resumes after the last finished
  role, and no role is sampled twice into the store.
- It learns: the example's short run raises the mean reward on CPU, and the same roles run as a
  plain `--custom-generate-function-path` hook through vime's group machinery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError

from tests.conftest import engine_flags
from vime.config.args import parse_args
from vime.envs.base import EnvContext
from vime.envs.multi_agent import roles, task
from vime.envs.multi_agent.activities import start, turn_record, turn_sample
from vime.envs.multi_agent.flags import MultiAgentFlags
from vime.envs.multi_agent.workflow import REWRITER, SELECTOR, SOLVERS, STORE, MultiAgentRolloutInput
from vime.errors import ConfigError
from vime.store import SampleStore
from vime.store.queries import Turn
from vime.train.advantages import advantages_for_samples
from vime.types import Sample
from workflows.rollout import RolloutInput, RolloutOutput

REPO = Path(__file__).resolve().parent.parent
ROLES_OF_A_FULL_ROLLOUT = ["solver", "solver", "solver", "rewriter", "selector"]


def role_sample(role: str, score: float, rollout_id: str = "0", group: int = 0, **meta) -> Sample:
    return Sample(group_index=group, rollout_id=rollout_id, tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1],
                  metadata={"role": role, "score": score, **meta})


# ---- rewards and advantages -------------------------------------------------------------------

def test_every_role_is_paid_its_own_score_times_the_weight_of_the_final_outcome():
    team = [role_sample("solver", 0.2), role_sample("solver", 0.6), role_sample("rewriter", 0.5),
            role_sample("selector", 0.6, pick="B")]  # it picked the second draft: score 0.6, correct
    assert task.assign_rewards(team, correct_weight=1.2, incorrect_weight=0.8) is True
    assert [s.reward for s in team] == pytest.approx([0.24, 0.72, 0.6, 0.72])
    assert all(s.metadata["final_correct"] and s.metadata["reward_weight"] == 1.2 for s in team)

    team[-1].metadata["score"] = 0.2  # the selector picked a wrong candidate: everyone is weighted down
    assert task.assign_rewards(team, correct_weight=1.2, incorrect_weight=0.8) is False
    assert [s.reward for s in team] == pytest.approx([0.16, 0.48, 0.4, 0.16])


def test_a_rollout_that_ended_before_the_selector_has_no_correct_answer():
    solvers = [role_sample("solver", 0.9), role_sample("solver", 0.7)]
    assert task.assign_rewards(solvers, correct_weight=1.2, incorrect_weight=0.8) is False
    assert [s.reward for s in solvers] == pytest.approx([0.72, 0.56])


def test_the_selectors_pick_is_the_first_candidate_label_in_its_reply():
    assert task.parse_pick("the best is C, not A", candidates=4) == 2
    assert task.parse_pick("Every Dog", candidates=4) == 3  # "E" is no label of 4 candidates; "D" is
    assert task.parse_pick("xyz Q", candidates=4) is None
    assert task.parse_pick("", candidates=1) is None


def test_an_uneven_fan_out_counts_once_in_its_groups_statistics():
    # Rollout "a" ran every role (5 samples); rollout "b" had no usable draft and stopped after its
    # 3 solvers. Each counts once: the baseline is the mean of the two rollouts' mean rewards.
    a = [role_sample("solver", x, "a") for x in (1.0, 0.5, 0.5)] + [role_sample("rewriter", 0.5, "a"),
                                                                    role_sample("selector", 1.0, "a")]
    b = [role_sample("solver", 0.0, "b") for _ in range(3)]
    task.assign_rewards(a, 1.0, 1.0)
    task.assign_rewards(b, 1.0, 1.0)
    adv = advantages_for_samples(a + b, "grpo", normalize_std=False)
    baseline = (0.7 + 0.0) / 2
    assert [t[0].item() for t in adv.per_token] == pytest.approx([s.reward - baseline for s in a + b])
    assert adv.stats["rollouts"] == 2 and adv.stats["rewards/mean"] == pytest.approx(baseline)


def test_a_role_turn_survives_the_turn_table_unchanged():
    sample = Sample(group_index=1, index=5, prompt=[{"role": "user", "content": "Solve: x"}], tokens=[7, 8, 9, 10],
                    response="ab", response_length=2, loss_mask=[1, 1], rollout_log_probs=[-0.5, -1.5],
                    weight_versions=[{"version": 3}], status=Sample.Status.TRUNCATED,
                    metadata={"role": "solver", "slot": 0, "turn": 0, "score": 0.5})
    record = turn_record(sample)
    assert record["loss_mask"] == [0, 0, 1, 1] and record["log_probs"] == [0.0, 0.0, -0.5, -1.5]
    stored = Turn(record["turn"], record["token_ids"], record["loss_mask"], record["log_probs"], record["meta"])
    assert turn_sample(stored) == sample


# ---- the grader is hooks ---------------------------------------------------------------------

async def test_the_score_and_the_reward_are_hooks_of_start_not_subclasses(tiny_model_dir, tmp_path, monkeypatch):
    """Another verifier and another payout are two arguments of `start`: the solvers' and the
    rewriter's turns are scored by `score` (the selector's score stays its pick's), and the stored
    rollout is paid by `reward`, one number per turn in turn order. Scripted turns, no engine."""
    from temporalio.testing import ActivityEnvironment

    async def scripted(args, sample, params):  # stands in for vime's generate: the selector picks "A"
        text = "A" if sample.metadata["role"] == "selector" else f"draft {sample.metadata['turn']}"
        sample.tokens, sample.response, sample.response_length = [1, 2, 3, 4], text, 2
        sample.loss_mask, sample.rollout_log_probs, sample.status = [1, 1], [-0.5, -0.5], Sample.Status.COMPLETED
        return sample

    async def score(args, sample):  # an async verifier
        return 0.25 * (sample.metadata["turn"] + 1)

    def reward(args, samples):
        return [10.0 + i for i in range(len(samples))]

    monkeypatch.setattr(roles, "generate", scripted)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Name a city."}) + "\n")
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(prompts), "--input-key", "prompt",
                       "--rollout-env", "multi_agent", "--num-solvers", "2", "--run-id", "hooks",
                       "--run-dir", str(tmp_path / "run")])
    with SampleStore.open(tmp_path / "run") as store:
        store.ensure_run("hooks")
        acts = start(EnvContext(args, store, None), score=score, reward=reward).activities
        inp = MultiAgentRolloutInput("hooks", step=0, position=0, index=0, weight_version=0)
        for act in acts[:3]:  # the solvers, the rewriter, the selector
            await ActivityEnvironment().run(act, inp)
        out = await ActivityEnvironment().run(acts[3], inp)
        stored = store.read_rollout("hooks", out.rollout.rollout_id)
    assert [s.metadata["role"] for s in stored] == ["solver", "solver", "rewriter", "selector"]
    assert [s.metadata["score"] for s in stored] == [0.25, 0.5, 0.75, 0.25]  # the selector's: solver 0's, picked
    assert [s.reward for s in stored] == [10.0, 11.0, 12.0, 13.0] and out.reward_mean == 11.5


@pytest.mark.parametrize("rewards,message", [
    ([1.0], "returned 1 rewards for 2 turns; return one per turn"),
    ([1.0, float("nan")], "returned nan; return a finite number"),
])
async def test_a_reward_hook_that_does_not_pay_every_turn_a_number_is_one_line_naming_it(rewards, message):
    samples = [role_sample("solver", 0.5), role_sample("solver", 0.5)]
    with pytest.raises(ConfigError, match=f"multi_agent reward hook .*<lambda>: {message}"):
        await roles.pay(lambda args, turns: rewards, None, samples)


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,message", [
    (["--num-solvers", "0"], "--num-solvers 0: must be between 1 and 25"),
    (["--correct-reward-weight", "-1"], "--correct-reward-weight -1.0: must be a finite number >= 0"),
    (["--incorrect-reward-weight", "nan"], "--incorrect-reward-weight nan: must be a finite number >= 0"),
    (["--incorrect-reward-weight", "1.5"], "--incorrect-reward-weight 1.5 is above --correct-reward-weight 1.2"),
])
@pytest.mark.parametrize("route", [["--rollout-env", "multi_agent"],
                                   ["--custom-generate-function-path", "vime.envs.multi_agent.generate.generate"]])
def test_bad_flags_are_one_line_naming_the_flag_before_anything_starts(route, flags, message):
    with pytest.raises(ConfigError) as err:
        parse_args([*route, *flags])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_both_routes_take_the_environments_flags():
    env = parse_args(["--rollout-env", "multi_agent", "--num-solvers", "2"])
    hook = parse_args(["--custom-generate-function-path", "vime.envs.multi_agent.generate.generate",
                       "--num-solvers", "2"])
    assert env.env_args == hook.env_args == MultiAgentFlags(num_solvers=2)
    assert (env.rollout_env, hook.rollout_env) == ("multi_agent", "groups")


def test_vime_train_from_the_repository_root_stops_on_a_bad_weight_in_one_line_before_starting(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([str(Path(sys.executable).with_name("vime")), "train", "--custom-generate-function-path",
                           "vime.envs.multi_agent.generate.generate", "--incorrect-reward-weight", "2",
                           "--run-dir", str(run_dir)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "vime train: error: --incorrect-reward-weight 2.0 is above --correct-reward-weight 1.2: a wrong final answer "
        "would pay more than a right one"], done.stderr
    assert not run_dir.exists()  # nothing started


# ---- the generate hook ------------------------------------------------------------------------

@pytest.mark.vllm
async def test_one_generate_call_returns_the_whole_team_as_one_rewarded_fan_out(training_server, tiny_model_dir):
    from vime.rollout.group import run_group

    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), *engine_flags(training_server),
                       "--custom-generate-function-path", "vime.envs.multi_agent.generate.generate",
                       "--rollout-max-response-len", "16", "--run-id", "hook"])
    group = [Sample(group_index=0, index=i, prompt="Name a city.") for i in range(2)]
    rollouts = await run_group(args, group)  # what RolloutWorkflow's activity runs for a group
    for i, fan_out in enumerate(rollouts):
        assert [s.metadata["role"] for s in fan_out] == ROLES_OF_A_FULL_ROLLOUT
        assert {s.rollout_id for s in fan_out} == {i} and {s.group_index for s in fan_out} == {0}
        assert all(s.response_length > 0 and s.rollout_log_probs for s in fan_out)
        weight = 1.2 if fan_out[-1].metadata["score"] >= task.CORRECT_AT else 0.8
        assert [s.reward for s in fan_out] == pytest.approx([s.metadata["score"] * weight for s in fan_out])
        assert fan_out[-1].prompt[0]["content"].count(") ") >= 4  # 3 drafts and the rewrite to choose from


# ---- durable: kill -9 mid-rollout --------------------------------------------------------------

class RolloutWorker:
    """`python -m workers.rollout` for the multi-agent environment, as a child process."""

    def __init__(self, tmp_path: Path, server, model: Path, address: str) -> None:
        self.run_dir, self.run_id = tmp_path / "run", f"ma-{uuid.uuid4().hex[:8]}"
        self.queue = f"q-{uuid.uuid4().hex[:8]}"
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text(json.dumps({"prompt": "Name a city."}) + "\n")
        # One solver and long replies: each role samples for a second or more, so the kill lands
        # inside a role. The seeds are fixed, and the server's weights never change.
        self.argv = [sys.executable, "-m", "workers.rollout", "--hf-checkpoint", str(model), "--prompt-data",
                     str(prompts), "--input-key", "prompt", "--rollout-env", "multi_agent", "--num-solvers", "1",
                     "--n-samples-per-prompt", "2", "--rollout-max-response-len", "1024",
                     "--run-dir", str(self.run_dir), "--run-id", self.run_id, "--temporal-address", address,
                     "--rollout-task-queue", self.queue, *engine_flags(server)]
        self.log = tmp_path / "worker.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> RolloutWorker:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"})
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def stored_turns(self, rollout_id: str) -> int:
        """Read with plain SQLite (WAL: reading goes on while the worker writes)."""
        db_path = self.run_dir / "vime.db"
        if not db_path.exists():
            return 0
        with contextlib.closing(sqlite3.connect(db_path, timeout=60)) as db:
            try:
                return db.execute("SELECT COUNT(*) FROM trajectory_turns WHERE run_id = ? AND rollout_id = ?",
                                  (self.run_id, rollout_id)).fetchone()[0]
            except sqlite3.OperationalError:  # the worker has not created the tables yet
                return 0


@pytest.fixture
def rollout_worker(tmp_path, vllm_server, tiny_model_dir, temporal_env):
    worker = RolloutWorker(tmp_path, vllm_server, tiny_model_dir, temporal_env.client.service_client.config.target_host)
    yield worker
    worker.stop()


async def activity_runs(handle) -> list[tuple[str, int, int]]:
    """(activity type, last attempt, pid of the worker that ran it) per scheduled activity, in order;
    nothing while the workflow has not started."""
    runs: dict[int, list] = {}
    try:
        history = await handle.fetch_history()
    except RPCError:
        return []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            runs[e.event_id] = [e.activity_task_scheduled_event_attributes.activity_type.name, 0, 0]
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = e.activity_task_started_event_attributes
            runs[a.scheduled_event_id][1:] = [a.attempt, int(a.identity.split("@")[0].rsplit("-", 1)[-1])]
    return [tuple(r) for r in runs.values()]


@pytest.mark.vllm
async def test_kill_9_of_the_rollout_worker_resumes_after_the_last_finished_role(rollout_worker, temporal_env):
    worker, client = rollout_worker.start(), temporal_env.client
    inp = RolloutInput(worker.run_id, 0, 0, 0, heartbeat_seconds=5, n_samples_per_prompt=2)
    handle = await client.start_workflow("MultiAgentGroupWorkflow", inp, id=f"{worker.run_id}-rollout-0",
                                         task_queue=worker.queue, result_type=RolloutOutput)
    rollout_0 = client.get_workflow_handle(f"{worker.run_id}-rollout-0-0")
    deadline = time.monotonic() + 180
    while REWRITER not in [kind for kind, _, _ in await activity_runs(rollout_0)]:  # the solvers are done
        assert time.monotonic() < deadline and worker.proc.poll() is None, worker.log.read_text()[-3000:]
        await asyncio.sleep(0.05)
    killed = worker.proc.pid
    worker.proc.kill()  # SIGKILL mid-rewriter: no cleanup of any kind
    worker.proc.wait()
    assert worker.stored_turns("0") < 3, "the kill came after rollout 0's last role"

    restarted = worker.start().proc.pid
    out = await asyncio.wait_for(handle.result(), 240)

    assert out.rollout_ids == ["0", "1"] and out.samples == 6
    with SampleStore.open(worker.run_dir) as store:
        for rid in out.rollout_ids:
            samples = store.read_rollout(worker.run_id, rid)
            assert [s.metadata["role"] for s in samples] == ["solver", "rewriter", "selector"]
            assert {s.rollout_id for s in samples} == {rid}
            assert [t.turn for t in store.read_turns(worker.run_id, rid)] == [0, 1, 2]  # each role's turn once
        markers = [t.meta["sample"]["metadata"]["sampled_by"] for t in store.read_turns(worker.run_id, "0")]
    runs = await activity_runs(rollout_0)
    assert [kind for kind, _, _ in runs] == [SOLVERS, REWRITER, SELECTOR, STORE]  # each scheduled once
    by = [pid for _, _, pid in runs]
    finished_before = by.index(restarted)  # the roles the killed worker finished, then the restarted one's
    assert finished_before >= 1 and by == [killed] * finished_before + [restarted] * (4 - finished_before), runs
    # never run again after the kill: each finished role's turn was sampled by an attempt on the
    # killed worker, no later than the one that finished it. (An attempt before the kill may be a
    # retry: on a loaded machine the dev server can lose an activity's start, or a 5 s heartbeat
    # is missed; the turn is still stored once, as checked above.)
    for (_, attempt, _), marker in zip(runs[:finished_before], markers[:finished_before]):
        assert 1 <= int(marker.rsplit("#", 1)[1]) <= attempt, (markers, runs)
    in_flight_attempt = runs[finished_before][1]
    # the role the kill interrupted: sampled by the killed attempt (killed between storing its turn
    # and reporting) or by a retry; on a loaded machine a retry may itself store the turn and miss
    # its heartbeat, and the next one returns that stored turn: never sampled after it was stored
    assert 1 <= int(markers[finished_before].rsplit("#", 1)[1]) <= in_flight_attempt, (markers, runs)


# ---- learning ---------------------------------------------------------------------------------

@pytest.mark.vllm
def test_the_example_raises_the_mean_reward_on_cpu(training_server, tmp_path):
    run_dir = tmp_path / "multi_agent"
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    result = subprocess.run([sys.executable, "-m", "examples.multi_agent.run", "--run-dir", str(run_dir),
                             "--num-rollout", "8", *engine_flags(training_server)],
                            capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    figures = json.loads((run_dir / "figures.json").read_text())
    rewards = [f["reward"] for f in figures]
    assert len(rewards) == 8
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    with SampleStore.open(run_dir) as store:
        samples = [s for _, s in store.iter_samples("multi_agent")]
        assert store.count_samples("multi_agent", untrained=True) == 0
    by_rollout: dict[str, list[Sample]] = {}
    for s in samples:
        by_rollout.setdefault(str(s.rollout_id), []).append(s)
    assert len(by_rollout) == 8 * 16  # 4 prompts x 4 rollouts per step
    for rollout in by_rollout.values():
        assert [s.metadata["role"] for s in rollout] == ROLES_OF_A_FULL_ROLLOUT
        assert len({s.metadata["weight_version"] for s in rollout}) == 1
