"""`vime eval`: evaluate checkpoints through the durable eval rounds a training run uses, and print
a table checkpoint x eval set.

It launches as `vime train` does (`vime.launcher.launch.Launch`: the run-directory lock, the Temporal dev
server, vLLM servers and a router unless given, supervised workers, recovery from an earlier
launch, Ctrl-C and the same command), with a rollout worker only (nothing trains), and starts or
attaches to the eval run's `EvalWorkflow` (`workflows/evaluation.py`): per checkpoint, its
weights loaded into the servers, then one eval round (`workflows/eval_round.py`). The run id is
derived from what is evaluated (`vime.launcher.eval_command`): the same command resumes it, a finished
one prints its table again, and no eval prompt is sampled or graded twice.

On long-lived workers (`--temporal-address` of a Temporal whose rollout queue has workers
polling it, with `--store-url` and the servers' `--vllm-router-*`/`--vllm-server-urls`), it
starts nothing: the pool's workers serve the eval run, reading its flags from the store as they
read any run's (`register_run` checks them as this command does).
"""

from __future__ import annotations

import dataclasses
import json
import time

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from vime.launcher.eval_command import EvalCommand, parse_eval_command
from vime.config.run_input import training_config
from vime.rollout.eval_metrics import failures_text, round_sets, top_pass
from vime.launcher.launch import Launch, _describe, _failure, resume_command, run_to_end
from vime.launcher.supervisor import WorkerProcess
from vime.temporal.eval_contract import EVAL_WORKFLOW, SERVERS_LOST_SIGNAL, EvalRunInput, eval_workflow_id
from vime.temporal.search_attributes import EVAL, RUN_ID
from vime.temporal.training_contract import TrainingConfig, TrainingState

_ENDED = {WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.CANCELED,
          WorkflowExecutionStatus.TIMED_OUT}


def eval_table(metrics: list[dict]) -> str:
    """One row per checkpoint and eval set: mean reward, pass@1, pass@k of the most samples per
    prompt, mean response length, samples and failures (by class)."""
    rows = [("checkpoint", "step", "set", "reward", "pass@1", "pass@k", "len", "samples", "failed")]
    for m in metrics:
        for name in round_sets(m):
            def fig(key: str, fmt: str = "{:.3f}") -> str:
                value = m.get(f"eval/{name}/{key}")
                return "-" if value is None else fmt.format(value)
            top = top_pass(m, name)
            rows.append((str(m.get("eval_checkpoint", m["step"])), str(m["step"]), name, fig("reward_mean"),
                         fig("pass@1"), f"{top[1]:.3f} (k={top[0]})" if top else "-",
                         fig("response_length_mean", "{:.1f}"), fig("samples", "{}"), failures_text(m, name)))
    return text_table(rows)


def text_table(rows: list[tuple[str, ...]]) -> str:
    """Rows of cells as left-aligned columns, the first row the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def eval_config(args, checkpoints: int) -> TrainingConfig:
    """The run's `TrainingConfig` (queues, environment, eval settings) with the training sizes an
    eval run has no flag for set to what it does: one "step" per checkpoint, no batch."""
    cfg = training_config(args)
    return dataclasses.replace(cfg, num_rollout=checkpoints, rollout_batch_size=cfg.rollout_batch_size or 0,
                               over_sampling_batch_size=cfg.over_sampling_batch_size or 0)


class ReloadAfterRestart:
    """The servers, checked as `vime train` checks them; when a restarted server is back (it boots
    the base model), the eval workflow is told to load its checkpoint again before the round's
    groups, failing the version check meanwhile, are sampled again."""

    def __init__(self, fleet, handle: WorkflowHandle) -> None:
        self.fleet, self.handle = fleet, handle

    async def check(self) -> list[str]:
        was = getattr(self.fleet, "restarting", False)
        lines = await self.fleet.check()
        if was and not getattr(self.fleet, "restarting", False):
            await self.handle.signal(SERVERS_LOST_SIGNAL)
            lines = [*lines, "[vime] loading the checkpoint under evaluation into the restarted server"]
        return lines


async def queue_pollers(client, task_queue: str) -> int:
    """How many workers poll `task_queue` for workflow tasks (a pool of long-lived workers)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    described = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
    return len(described.pollers)


class EvalLaunch(Launch):
    """A launch of an eval run: `Launch` with the eval workflow and a rollout worker only, or
    none on a pool of long-lived workers."""

    command = "eval"

    def __init__(self, cmd: EvalCommand) -> None:
        super().__init__(cmd.args, checked=True)
        self.cmd = cmd
        self.pool = 0  # workers already polling the rollout queue of a Temporal we were given

    def workflow_handle(self, client) -> WorkflowHandle:
        return client.get_workflow_handle(eval_workflow_id(self.args.run_id), result_type=TrainingState)

    def starts_engines_early(self) -> bool:
        """No: an eval run's end is known to its workflow only (the store records no finish)."""
        return False

    async def finished(self, client) -> TrainingState | None:
        handle = self.workflow_handle(client)
        described = await _describe(handle)
        if described is None or described.status != WorkflowExecutionStatus.COMPLETED:
            if self.args.temporal_address:  # checked here, the one call before the workers start
                self.pool = await queue_pollers(client, self.args.rollout_task_queue)
            return None
        print(f"[vime] eval {self.args.run_id} already finished; its table again (nothing is sampled)", flush=True)
        return await handle.result()

    def workers(self, temporal_address: str, fleet) -> list[WorkerProcess]:
        if self.pool:
            print(f"[vime] {self.pool} worker(s) poll {self.args.rollout_task_queue} at {temporal_address}: the eval "
                  "runs on them, starting none", flush=True)
            return []
        return [w for w in super().workers(temporal_address, fleet) if w.name == "rollout"]

    async def start(self, client) -> tuple[WorkflowHandle, int | None]:
        args = self.args
        handle = self.workflow_handle(client)
        described = await _describe(handle)
        status = described.status if described else None
        if status == WorkflowExecutionStatus.RUNNING:
            print(f"[vime] eval {args.run_id} is in progress; continuing it", flush=True)
            return handle, None
        if status in _ENDED:
            print(f"[vime] eval {args.run_id} ended ({await _failure(handle)}); starting it again: rounds it "
                  "recorded are kept, samples it stored are not sampled again", flush=True)
        n = len(self.cmd.checkpoints)
        print(f"[vime] evaluating {self.cmd.source}: {n} checkpoint(s) "
              f"({', '.join(c.label for c in self.cmd.checkpoints)}) as eval run {args.run_id}", flush=True)
        handle = await client.start_workflow(
            EVAL_WORKFLOW, EvalRunInput(eval_config(args, n), self.cmd.checkpoints),
            id=handle.id, task_queue=args.rollout_task_queue, result_type=TrainingState,
            search_attributes=TypedSearchAttributes([SearchAttributePair(RUN_ID, args.run_id),
                                                     SearchAttributePair(EVAL, True)]),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY)
        return handle, 0

    def services(self, temporal, fleet, handle: WorkflowHandle) -> list:
        return [temporal, ReloadAfterRestart(fleet, handle)]

    def _summarize(self, state: TrainingState) -> None:
        seconds = round(time.monotonic() - self.t0, 1)
        summary = {"run_id": self.args.run_id, "evaluated": self.cmd.source, "seconds": seconds,
                   "checkpoints": state.metrics}
        (self.run_dir / "eval.json").write_text(json.dumps(summary, indent=1))
        print(eval_table(state.metrics), flush=True)
        print(f"[vime] eval {self.args.run_id} finished: {len(state.metrics)} checkpoint(s) in {seconds:.0f} s; "
              f"figures in {self.run_dir / 'eval.json'}, samples: vime samples {self.args.run_id} --eval "
              f"--run-dir {self.run_dir}", flush=True)

    def stopped_line(self, resume: str) -> str:
        done = len(self.follower.evals_printed) if self.follower else 0
        return (f"[vime] stopped eval {self.args.run_id} ({done} checkpoint(s) evaluated by this launch; rounds and "
                f"samples kept in {self.args.store_url.removeprefix('sqlite:///')}); resume with: {resume}")


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        from vime.launcher.eval_command import USAGE

        print(USAGE + "\n\n" + (__doc__ or ""))
        return 0
    cmd = parse_eval_command(argv)
    from vime.log import configure_logging

    configure_logging()
    return run_to_end(cmd.args, resume_command(), checked=True, launch=EvalLaunch(cmd))[0]
