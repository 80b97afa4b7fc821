"""CodingAgentRolloutWorkflow against the real parts: rollout worker processes (agent sessions, the
shared sandbox queue and each worker's own sandbox host queue), bubblewrap sandboxes, the vLLM
CPU server on the tiny model, Temporal, the SQLite store.

The tiny model is random, so it never calls a tool well; the agent re-prompts it after each
reply without a tool call (`--agent-max-format-errors`), which gives sessions of several turns
to kill, cancel and interrupt.

One rollout worker process serves the tests on the shared server (`shared_worker`): the agent
activities take the run from their input, so each test runs its own run id through it, in one
run directory. A test that kills or stops it may start it again itself; otherwise the next
test starts it when it finds it gone. A second worker (`twin`) is started for a test alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import signal
import socket
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import TimeoutType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

from examples.coding_agent_rl.gold_edits import write_prompts
from examples.coding_agent_rl.tasks.prepare import load_tasks
from vime.envs.coding_agent.claude_code import claude_code_available
from tests.conftest import engine_flags
from vime.sandbox.bwrap import reap_stale_workdirs
from vime.store import SampleStore
from vime.temporal.search_attributes import ROLLOUT_STATUS
from vime.envs.coding_agent.workflow import AgentRolloutInput, AgentRolloutOutput, agent_workflow_id

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent
TURNS = 8
HEARTBEAT = 5  # seconds: the session's heartbeat timeout
HOST_WAIT = 10  # seconds an activity waits on a sandbox host's queue before the host counts as gone


class Worker:
    """`python -m workers.rollout` for one test's run and queues, as a child process."""

    def __init__(self, tmp_path: Path, server, model: Path, address: str, sandbox_base: Path) -> None:
        self.run_dir, self.base = tmp_path / "run", sandbox_base
        self.run_id = f"run-{uuid.uuid4().hex[:8]}"  # unique: the Temporal server is shared by the session
        self.queue = f"q-{uuid.uuid4().hex[:8]}"
        prompts = write_prompts(load_tasks()[:2], tmp_path / "prompts.jsonl")
        self.argv = [
            sys.executable, "-m", "workers.rollout", "--hf-checkpoint", str(model), "--prompt-data", str(prompts),
            "--input-key", "prompt", "--label-key", "label", "--rollout-env", "coding_agent",
            "--agent-max-turns", str(TURNS), "--agent-max-format-errors", str(TURNS), "--agent-max-tokens", "64",
            "--rollout-temperature", "1.0", "--run-dir", str(self.run_dir), "--run-id", self.run_id,
            "--temporal-address", address, "--rollout-task-queue", self.queue,
            "--sandbox-task-queue", self.queue + "-sbx", "--heartbeat-timeout", str(HEARTBEAT), *engine_flags(server),
        ]
        self.env = {**os.environ, "TMPDIR": str(sandbox_base), "VIME_LOG_LEVEL": "INFO", "VIME_LOG_FORMAT": "json"}
        self.log = tmp_path / "worker.log"
        self.proc: subprocess.Popen | None = None
        self.started: list[str] = []  # ids of the workflows this test started on the worker
        with SampleStore.open(self.run_dir) as store:
            store.ensure_run(self.run_id)

    def twin(self) -> Worker:
        """Another worker process of the same run and queues, as if on another host: its own
        sandbox directory (its sandboxes are invisible to this one) and its own host queue."""
        other = copy.copy(self)
        other.base = Path(tempfile.mkdtemp(prefix="vime-test-sbx-"))
        other.base.chmod(0o755)
        other.env = {**self.env, "TMPDIR": str(other.base)}
        other.log, other.proc, other.started = self.log.with_name("worker-twin.log"), None, []
        return other

    def new_run(self) -> Worker:
        """A fresh run id for the next test on this worker (its store rows, workflow ids and
        search attributes are that test's alone)."""
        self.run_id = f"run-{uuid.uuid4().hex[:8]}"
        with SampleStore.open(self.run_dir) as store:
            store.ensure_run(self.run_id)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _ready_lines(self) -> int:
        return self.log.read_text().count("worker rollout ready") if self.log.exists() else 0

    def ready(self) -> bool:
        """Whether the process last started says it is ready (polling its queues)."""
        return self._ready_lines() > self.ready_before

    def start(self) -> Worker:
        self.ready_before = self._ready_lines()
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        proc.send_signal(sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def inp(self, position: int = 0, index: int = 0) -> AgentRolloutInput:
        return AgentRolloutInput(self.run_id, 0, position, index, 0, heartbeat_seconds=HEARTBEAT,
                                 sandbox_task_queue=self.queue + "-sbx", sandbox_host_seconds=HOST_WAIT)

    def store(self) -> SampleStore:
        return SampleStore.open(self.run_dir)

    def turns(self, rollout_id: str) -> list:
        with self.store() as store:
            return store.read_turns(self.run_id, rollout_id)

    def leftovers(self) -> list[str]:
        """Sandbox workdirs and bubblewrap processes of this test still around."""
        dirs = [p.name for p in self.base.glob("vime-sbx-*")]
        procs = subprocess.run(["pgrep", "-f", f"bwrap.*{self.base}"], capture_output=True, text=True).stdout.split()
        return dirs + [f"pid {p}" for p in procs]


@pytest.fixture(scope="module")
def shared_worker(tmp_path_factory, vllm_server, tiny_model_dir, temporal_env):
    """One worker process for the module's tests on the shared server (a worker's start costs
    seconds of CPU). Its sandboxes live in a directory of its own (its TMPDIR), as
    `sandbox_base` gives a test (see tests/conftest.py)."""
    base = Path(tempfile.mkdtemp(prefix="vime-test-sandboxes-"))
    base.chmod(0o755)
    w = Worker(tmp_path_factory.mktemp("shared-worker"), vllm_server, tiny_model_dir,
               temporal_env.client.service_client.config.target_host, base)
    try:
        yield w
    finally:
        w.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def worker(shared_worker, temporal_env):
    """The shared worker, running, with a fresh run id for this test. A workflow of the test
    still running afterwards (a failed test) is terminated and the worker stopped, so that its
    session and sandbox do not run on into the next test (which starts the worker again)."""
    w = shared_worker.new_run()
    if not w.running():
        w.stop()
        w.start()
    yield w
    running = False
    for workflow_id in w.started:
        handle = temporal_env.client.get_workflow_handle(workflow_id)
        if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
            await handle.terminate("the test is over")
            running = True
    w.started = []
    if running:
        w.stop()


@pytest.fixture
def twin(worker):
    """A second worker of `worker`'s run, on "another host" (see `Worker.twin`); stopped after
    the test (on the same queues, it would take work of the tests after it)."""
    w = worker.twin()
    yield w
    w.stop()
    shutil.rmtree(w.base, ignore_errors=True)


async def _start(client, worker: Worker, position: int = 0):
    handle = await client.start_workflow(
        "CodingAgentRolloutWorkflow", worker.inp(position), id=agent_workflow_id(worker.run_id, position, 0),
        task_queue=worker.queue, result_type=AgentRolloutOutput)
    worker.started.append(handle.id)
    return handle


async def _wait(predicate, timeout: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


async def _activities(handle) -> list[dict]:
    """Every activity the workflow ran, from its history, in order: type, task queue, input, the
    identity (`<role>-<pid>@<host>`) of the worker that ran its last attempt, that attempt, how it
    ended, its result."""
    acts: dict[int, dict] = {}
    for e in (await handle.fetch_history()).events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            acts[e.event_id] = {"type": a.activity_type.name, "queue": a.task_queue.name,
                                "input": [json.loads(p.data) for p in a.input.payloads], "identity": None,
                                "attempt": None, "outcome": "pending", "result": None}
        elif e.HasField("activity_task_started_event_attributes"):
            a = e.activity_task_started_event_attributes
            acts[a.scheduled_event_id].update(identity=a.identity, attempt=a.attempt)
        elif e.HasField("activity_task_completed_event_attributes"):
            a = e.activity_task_completed_event_attributes
            payloads = a.result.payloads
            acts[a.scheduled_event_id].update(outcome="completed",
                                              result=json.loads(payloads[0].data) if payloads else None)
        elif e.HasField("activity_task_timed_out_event_attributes"):
            a = e.activity_task_timed_out_event_attributes
            kind = TimeoutType.Name(a.failure.timeout_failure_info.timeout_type)
            acts[a.scheduled_event_id]["outcome"] = f"timed_out:{kind}"
        elif e.HasField("activity_task_failed_event_attributes"):
            acts[e.activity_task_failed_event_attributes.scheduled_event_id]["outcome"] = "failed"
    return list(acts.values())


def _pid_of(host_queue: str) -> int:
    """The worker pid in a sandbox host queue's name (`<shared>-<host>-<pid>-<hex>`)."""
    return int(host_queue.rsplit("-", 2)[1])


def _ran_by(identity: str) -> int:
    """The pid in a worker's Temporal identity (`[<role>-]<pid>@<host>`)."""
    return int(identity.split("@")[0].rsplit("-", 1)[-1])


def _stored_turns(worker: Worker, rollout_id: str) -> int:
    """Stored turns, read with plain SQLite (WAL: reading goes on while another connection
    holds the write lock)."""
    with contextlib.closing(sqlite3.connect(worker.run_dir / "vime.db", timeout=60)) as db:
        return db.execute("SELECT COUNT(*) FROM trajectory_turns WHERE run_id = ? AND rollout_id = ?",
                          (worker.run_id, rollout_id)).fetchone()[0]


async def test_a_rollout_boots_runs_grades_stores_and_leaves_no_sandbox(worker, temporal_env):
    client = temporal_env.client
    handle = await _start(client, worker)
    out = await asyncio.wait_for(handle.result(), 240)

    assert out.status == "completed" and out.failure_class == "none"
    assert out.reward == 0.0 and out.outcome in ("empty_diff", "tests_failed", "patch_failed")
    assert out.phases[:3] == ["task", "boot", "session"] and "grade" in out.phases and "teardown" in out.phases
    assert out.turns == TURNS
    with worker.store() as store:
        samples = store.read_rollout(worker.run_id, out.rollout.rollout_id)
    assert len(samples) == len(out.rollout.samples) >= 1
    assert {s.rollout_id for s in samples} == {out.rollout.rollout_id}
    assert samples[-1].metadata["segment_kind"] == "final" and samples[-1].reward == 0.0
    assert sum(len(s.metadata["turns"]) for s in samples) == TURNS

    desc = await handle.describe()
    memo = await desc.memo()
    assert memo["trajectory_id"] == f"{worker.run_id}/{out.rollout.rollout_id}"
    assert memo["diff_id"].startswith("sha256:")
    for _ in range(50):
        found = [w.id async for w in client.list_workflows(f"VimeRunId='{worker.run_id}' AND RolloutStatus='completed'")]
        if found:
            break
        await asyncio.sleep(0.2)
    assert found == [handle.id]
    assert worker.leftovers() == []


async def test_kill_9_mid_session_resumes_after_the_last_stored_turn(worker, temporal_env):
    handle = await _start(temporal_env.client, worker)
    rollout_id = "0"
    await _wait(lambda: len(worker.turns(rollout_id)) >= 2, 180, "two stored turns")
    worker.proc.kill()  # SIGKILL: no cleanup of any kind
    worker.proc.wait()
    killed_at = len(worker.turns(rollout_id))
    assert killed_at < TURNS

    worker.start()
    out = await asyncio.wait_for(handle.result(), 240)
    turns = worker.turns(rollout_id)
    attempts = [t.meta["attempt"] for t in turns]
    assert [t.turn for t in turns] == list(range(len(turns)))  # no gap, no turn stored twice
    first = attempts[0]  # the session attempt that was killed stored the first turns; another one the rest
    assert attempts[:killed_at] == [first] * killed_at and first not in attempts[killed_at:]
    assert len(turns) == out.turns == TURNS  # resumed after the last stored turn, not started over
    with worker.store() as store:
        assert store.count_samples(worker.run_id) == len(out.rollout.samples)  # exactly one set
        samples = store.read_rollout(worker.run_id, rollout_id)
    assert sum(len(s.metadata["turns"]) for s in samples) == TURNS
    await _wait(lambda: worker.leftovers() == [], 30, "no sandbox left")


async def test_every_activity_after_the_boot_runs_on_the_booting_workers_own_queue(worker, twin, temporal_env):
    twin.start()
    await _wait(twin.ready, 180, "the twin polling the queues")  # either may boot the sandbox
    handle = await _start(temporal_env.client, worker)
    out = await asyncio.wait_for(handle.result(), 240)
    assert out.status == "completed" and out.turns == TURNS

    acts = await _activities(handle)
    shared = worker.queue + "-sbx"
    boots = [a for a in acts if a["type"] == "boot_sandbox"]
    assert [(b["queue"], b["outcome"]) for b in boots] == [(shared, "completed")]
    host = boots[0]["result"]["task_queue"]
    booter = _pid_of(host)
    assert host.startswith(shared + "-") and booter in (worker.proc.pid, twin.proc.pid)
    assert _ran_by(boots[0]["identity"]) == booter
    on_host = [a for a in acts if a["type"] in ("agent_session", "capture_diff", "teardown_sandbox")]
    assert [a["type"] for a in on_host] == ["agent_session", "capture_diff", "teardown_sandbox"]
    for a in on_host:  # queued for the booting worker, and run by it
        assert (a["queue"], _ran_by(a["identity"]), a["outcome"]) == (host, booter, "completed"), a
    assert [a["queue"] for a in acts if a["type"] == "grade_diff"] == [shared]  # a fresh sandbox, any worker
    assert {a["queue"] for a in acts if a["type"] in ("agent_task", "store_agent_rollout")} == {worker.queue}
    assert worker.leftovers() == [] and twin.leftovers() == []


async def test_kill_9_of_the_booting_worker_mid_session_boots_again_on_the_other_and_finishes(
        worker, twin, temporal_env):
    twin.start()
    await _wait(twin.ready, 180, "the twin polling the queues")  # either may boot the sandbox
    handle = await _start(temporal_env.client, worker)
    await _wait(lambda: len(worker.turns("0")) >= 2, 180, "two stored turns")
    first_host = (await handle.query("progress"))["sandbox_queue"]
    victim, survivor = (worker, twin) if _pid_of(first_host) == worker.proc.pid else (twin, worker)
    assert _pid_of(first_host) == victim.proc.pid
    victim.proc.kill()  # SIGKILL: its sandbox, its host queue and its in-flight session die with it
    victim.proc.wait()
    killed_at = len(worker.turns("0"))

    out = await asyncio.wait_for(handle.result(), 300)
    assert out.status == "completed" and out.turns == TURNS and out.phases.count("boot") == 2
    turns = worker.turns("0")
    assert [t.turn for t in turns] == list(range(TURNS))  # resumed after the last stored turn
    first = turns[0].meta["attempt"]  # the killed attempt stored the first turns, another the rest
    assert [t.meta["attempt"] for t in turns[:killed_at]] == [first] * killed_at
    assert first not in [t.meta["attempt"] for t in turns[killed_at:]]

    acts = await _activities(handle)
    shared = worker.queue + "-sbx"
    boots = [a for a in acts if a["type"] == "boot_sandbox"]
    assert len(boots) == 2 and boots[0]["result"]["task_queue"] == first_host
    assert [b["input"][0]["boot_key"] for b in boots] == [f"{handle.id}/boot-0", f"{handle.id}/boot-1"]
    second_host = boots[1]["result"]["task_queue"]
    assert _pid_of(second_host) == survivor.proc.pid and boots[1]["queue"] == shared
    sessions = [a for a in acts if a["type"] == "agent_session"]
    # on the dead host: the retry after the heartbeat timeout was never taken (SandboxLost)
    assert [(a["queue"], a["outcome"]) for a in sessions] == [
        (first_host, "timed_out:TIMEOUT_TYPE_SCHEDULE_TO_START"), (second_host, "completed")]
    teardowns = [(a["queue"], a["outcome"]) for a in acts if a["type"] == "teardown_sandbox"]
    assert teardowns == [(first_host, "timed_out:TIMEOUT_TYPE_SCHEDULE_TO_START"),  # its host is gone:
                         (shared, "completed"),  # tried from the shared queue, where it is not found
                         (second_host, "completed")]
    assert [a["queue"] for a in acts if a["type"] == "capture_diff"] == [second_host]
    assert survivor.leftovers() == []
    assert len(reap_stale_workdirs(victim.base)) == 1  # the victim's sandbox, reaped when a worker starts there
    assert victim.leftovers() == []


async def test_a_store_locked_past_the_heartbeat_timeout_delays_the_session_without_timing_it_out(
        worker, temporal_env):
    """Store writes run off the worker's event loop: while one waits for SQLite's write lock the
    session's heartbeats go on, and the session continues when the lock is released."""
    handle = await _start(temporal_env.client, worker)
    await _wait(lambda: len(worker.turns("0")) >= 1, 180, "a stored turn")
    hold = 3 * HEARTBEAT
    lock = sqlite3.connect(worker.run_dir / "vime.db", isolation_level=None, timeout=60)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        held_at, beats = _stored_turns(worker, "0"), set()
        for _ in range(6):
            await asyncio.sleep(hold / 6)
            desc = await handle.describe()
            beats |= {(a.attempt, a.last_heartbeat_time.ToSeconds()) for a in desc.raw_description.pending_activities
                      if a.activity_type.name == "agent_session"}
        assert _stored_turns(worker, "0") == held_at < TURNS  # the session's next write waited
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert {attempt for attempt, _ in beats} == {1}  # never timed out and retried
    assert len({at for _, at in beats}) >= 2, beats  # heartbeats kept reaching the server

    out = await asyncio.wait_for(handle.result(), 240)
    assert out.status == "completed" and out.turns == TURNS
    sessions = [a for a in await _activities(handle) if a["type"] == "agent_session"]
    assert [(a["attempt"], a["outcome"]) for a in sessions] == [(1, "completed")]
    assert len({t.meta["attempt"] for t in worker.turns("0")}) == 1


@pytest.mark.parametrize("cancel_after_turns", [1, TURNS - 1], ids=["mid-session", "as-the-session-ends"])
async def test_cancelling_the_workflow_tears_the_sandbox_down(worker, temporal_env, cancel_after_turns):
    """Also when the session finishes its last turn before a heartbeat brings it the cancel: the
    SDK then hands back the session's result, and the rollout must stop all the same.

    A session's last turns take a fraction of a second: on a loaded host it can end (sandbox torn
    down, workflow completed) between two polls, before the test sees its turns. That session did
    not get the cancel this test is about, so the test waits for it to finish and starts the next
    rollout (a fresh run id), up to five (three in a row ended so once in CI, with drills beside it)."""
    for _ in range(5):
        handle = await _start(temporal_env.client, worker)
        await _wait(lambda: len(worker.turns("0")) >= cancel_after_turns, 180, f"{cancel_after_turns} stored turns",
                    every=0.05)
        if worker.leftovers():  # the sandbox is up: the session is still running
            break
        await asyncio.wait_for(handle.result(), 120)  # it ended before the cancel reached it
        worker.new_run()
    else:
        pytest.fail("five sessions in a row ended before the test saw their sandbox up")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 120)
    await _wait(lambda: worker.leftovers() == [], 30, "the sandbox torn down")
    desc = await handle.describe()
    assert desc.typed_search_attributes.get(ROLLOUT_STATUS) == "cancelled"


async def test_ctrl_c_of_the_worker_leaves_no_sandbox_and_the_rollout_finishes_later(worker, temporal_env):
    handle = await _start(temporal_env.client, worker)
    await _wait(lambda: len(worker.turns("0")) >= 1, 180, "a stored turn")
    assert worker.leftovers()
    assert worker.stop(signal.SIGINT) == 0
    assert worker.leftovers() == []

    worker.start()  # the workflow boots a new sandbox and the session resumes into it
    out = await asyncio.wait_for(handle.result(), 240)
    assert out.status == "completed" and out.turns == TURNS
    assert out.phases.count("boot") >= 2
    await _wait(lambda: worker.leftovers() == [], 30, "no sandbox left")


@pytest.mark.skipif(not claude_code_available(), reason="the Claude Code CLI is not installed (scripts/setup.sh)")
async def test_a_claude_code_rollout_runs_the_cli_in_the_sandbox_and_stores_its_session(
        tmp_path, long_context_server, tiny_model_dir, temporal_env, tokenizer_ends):
    base = Path(tempfile.mkdtemp(prefix="vime-test-sbx-"))
    base.chmod(0o755)
    w = Worker(tmp_path, long_context_server, tiny_model_dir, temporal_env.client.service_client.config.target_host,
               base)
    w.argv += ["--agent-harness", "claude_code", "--agent-max-tokens", "32", "--rollout-seed", "0",
               "--rollout-stop-token-ids", *map(str, tokenizer_ends)]
    try:
        w.start()
        handle = await _start(temporal_env.client, w)
        out = await asyncio.wait_for(handle.result(), 300)
        assert out.status == "completed" and out.failure_class == "none" and out.turns >= 1
        with w.store() as store:
            samples = store.read_rollout(w.run_id, out.rollout.rollout_id)
        assert samples and samples[-1].metadata["chain"] == "main"
        assert sum(len(s.metadata["turns"]) for s in samples) == out.turns
        assert w.leftovers() == []
    finally:
        w.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tokenizer_ends(tiny_model_dir) -> list[int]:
    """End-of-text and every word-boundary token: Claude Code's turns then end by themselves
    (a turn cut at max_tokens makes the CLI ask to resume; see tests/test_agent_clis.py)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ends = sorted(i for piece, i in tokenizer.get_vocab().items() if "\u0120" in piece or "\u010a" in piece)
    return [tokenizer.eos_token_id, *ends]


async def test_an_engine_that_stays_down_is_an_infra_failure_with_its_cause(tmp_path, tiny_model_dir, temporal_env):
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = types.SimpleNamespace(host="127.0.0.1", port=port, url=f"http://127.0.0.1:{port}")
    base = Path(tempfile.mkdtemp(prefix="vime-test-sbx-"))
    base.chmod(0o755)
    w = Worker(tmp_path, dead, tiny_model_dir, temporal_env.client.service_client.config.target_host, base)
    try:
        w.start()
        inp = w.inp()
        inp.session_attempts = 2
        handle = await temporal_env.client.start_workflow(
            "CodingAgentRolloutWorkflow", inp, id=agent_workflow_id(w.run_id, 0, 0), task_queue=w.queue,
            result_type=AgentRolloutOutput)
        out = await asyncio.wait_for(handle.result(), 240)

        assert out.status == "failed" and out.failure_class == "infra:engine" and out.reward is None
        assert "ServiceError" in out.rollout.infra_failure and str(port) in out.rollout.infra_failure
        assert out.rollout.samples == []  # nothing was sampled, nothing to train on
        assert "grade" not in out.phases and out.phases[-2:] == ["teardown", "store"]
        found = []
        for _ in range(50):
            found = [x.id async for x in temporal_env.client.list_workflows(
                f"VimeRunId='{w.run_id}' AND FailureClass='infra:engine' AND RolloutStatus='failed'")]
            if found:
                break
            await asyncio.sleep(0.2)
        assert found == [handle.id]
        assert w.leftovers() == []
    finally:
        w.stop()
        shutil.rmtree(base, ignore_errors=True)
