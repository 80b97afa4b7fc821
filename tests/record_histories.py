"""Record the workflow histories that `tests/test_replay.py` replays against the current code.

    .venv/bin/python -m tests.record_histories [OUT_DIR] [RUN ...]   (default: tests/data/histories, all)

Four real runs on the tiny model, one vLLM CPU server shared by them (~6 minutes):
- `quickstart`: a quickstart-shaped GRPO run with `--max-staleness 1` that continues as new every
  2 steps (prefetched steps handed over), and one of its RolloutWorkflows;
- `restarted-trainer`: a run whose trainer worker is killed with SIGKILL after its first step;
- `agent`: a coding-agent run (`--rollout-env coding_agent`: bubblewrap sandboxes, the built-in
  agent), one of its CodingAgentGroupWorkflows and one of its agent rollouts;
- `started-again`: a one-step run that records its end in the store, then the same workflow id
  started again with its `vime config` input (as the Web UI's form does), which trains nothing.

Name runs (`agent`) to record only those.

Record again only when a workflow change is *meant* to break replay (and then version the
change for runs in flight, see Temporal's patching); a failing replay test otherwise means a
change would break every run in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from temporalio.client import Client

from examples.coding_agent_rl.gold_edits import write_prompts
from examples.coding_agent_rl.tasks.prepare import load_tasks
from tests.conftest import engine_flags
from tests.runs import REPO, TrainRun
from vime.config.args import parse_args
from vime.config.run_input import to_json, workflow_input
from vime.engine.server import VLLMServer
from vime.engine.weight_sync.protocol import weight_sync_server_args
from vime.temporal.dev_server import TemporalDevServer
from vime.testing.tiny_model import tiny_model_dir

OUT = Path(__file__).resolve().parent / "data" / "histories"


async def dump(run: TrainRun, out: Path, name: str, extra_types: tuple[str, ...]) -> list[Path]:
    """Write every execution of the run's training workflow, and the first workflow of each of
    `extra_types`, as Temporal JSON histories named `<name>-<workflow>-<n>.json`."""
    server = TemporalDevServer(run.run_dir, headless=True)
    server.start()
    written = []
    try:
        client = await Client.connect(server.address)
        executions = [e async for e in client.list_workflows(f"WorkflowId = 'train-{run.run_id}'")]
        for wf_type in extra_types:
            found = [e async for e in client.list_workflows(f"WorkflowType = '{wf_type}'")]
            executions += sorted(found, key=lambda e: e.start_time)[:1]
        for i, e in enumerate(sorted(executions, key=lambda e: (e.workflow_type, e.start_time))):
            history = await client.get_workflow_handle(e.id, run_id=e.run_id).fetch_history()
            path = out / f"{name}-{e.workflow_type}-{i}.json"
            path.write_text(json.dumps(json.loads(history.to_json()), indent=None))
            written.append(path)
    finally:
        server.stop()
    return written


def record(out: Path, only: set[str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = tiny_model_dir()
    work = Path(tempfile.mkdtemp(prefix="vime-histories-"))
    server = VLLMServer(model, server_args=[*weight_sync_server_args(), "--max-model-len", "2048", "--seed", "0"],
                        log_path=work / "vllm.log")
    with server:
        flags = engine_flags(server)
        files = []
        if not only or "quickstart" in only:
            files += record_quickstart(work, model, flags, out)
        if not only or "restarted-trainer" in only:
            files += record_restarted(work, model, flags, out)
        if not only or "agent" in only:
            files += record_agent(work, model, flags, out)
        if not only or "started-again" in only:
            files += record_started_again(work, model, flags, out)
    for path in files:
        print(f"{path} ({path.stat().st_size // 1024} KiB)")


def record_quickstart(work: Path, model: Path, flags: list[str], out: Path) -> list[Path]:
    quick = TrainRun(work / "quickstart", model, *flags, "--max-staleness", "1", "--continue-as-new-after-steps",
                     "2", steps=3, run="quickstart")
    assert quick.run_to_end() == 0, quick.tail()
    return asyncio.run(dump(quick, out, "quickstart", ("RolloutWorkflow",)))


def record_restarted(work: Path, model: Path, flags: list[str], out: Path) -> list[Path]:
    restarted = TrainRun(work / "restarted", model, *flags, steps=3, run="restarted")
    restarted.start()
    restarted.wait_for_step(1)
    os.kill(restarted.pid("trainer"), signal.SIGKILL)
    assert restarted.wait() == 0, restarted.tail()
    assert "re-attaching" in (restarted.run_dir / "worker-rollout.log").read_text()
    return asyncio.run(dump(restarted, out, "restarted-trainer", ()))


def record_agent(work: Path, model: Path, flags: list[str], out: Path) -> list[Path]:
    tasks = work / "agent"
    tasks.mkdir(parents=True)
    prompts = write_prompts(load_tasks()[:1], tasks / "coding-tasks.jsonl")
    agent = TrainRun(tasks, model, *flags, "--prompt-data", str(prompts), "--rollout-env",
                     "coding_agent", "--agent-max-turns", "2", "--agent-max-tokens", "32",
                     "--agent-max-format-errors", "2", "--rm-type", "exact_match", steps=1, groups=1, n=2,
                     run="agent")
    assert agent.run_to_end() == 0, agent.tail()
    return asyncio.run(dump(agent, out, "agent", ("CodingAgentGroupWorkflow", "CodingAgentRolloutWorkflow")))


def record_started_again(work: Path, model: Path, flags: list[str], out: Path) -> list[Path]:
    run = TrainRun(work / "again", model, *flags, steps=1, run="again")
    assert run.run_to_end() == 0, run.tail()
    run_flags = run.argv[run.argv.index("train") + 1:]
    asyncio.run(start_again(run, run_flags))
    return asyncio.run(dump(run, out, "started-again", ()))


async def start_again(run: TrainRun, run_flags: list[str]) -> None:
    """`train-<run>` started once more, on a rollout worker of the run, with Temporal's default
    id-reuse policy; it completes at once (the store says the run finished)."""
    with TemporalDevServer(run.run_dir, headless=True) as server:
        worker = subprocess.Popen([sys.executable, "-m", "workers.rollout", *run_flags, "--temporal-address",
                                   server.address], cwd=REPO, env=run.env)
        try:
            client = await Client.connect(server.address)
            inp = json.loads(to_json(workflow_input(parse_args(run_flags))))
            handle = await client.start_workflow("TrainingWorkflow", inp, id=f"train-{run.run_id}",
                                                 task_queue="vime-rollout")
            await handle.result()
            assert "already finished" in (await (await handle.describe()).memo())["notice"]
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)


if __name__ == "__main__":
    record(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT, set(sys.argv[2:]) or None)
