"""`vime train`: start (or resume) a run on this machine and follow it to the end.

What is not given is started here: the Temporal dev server (no `--temporal-address`), vLLM
servers and a router (no `--vllm-router-ip`), and always the run's workers (rollout queue,
trainer) as supervised child processes. Then the `train-<run>` workflow is started — or, if it
is already running, followed; if it failed, started again from the last checkpoint — and its
progress printed until it finishes.

Durable to the edges:
- everything is checked before anything starts (`vime.config.preflight`);
- one launcher per run directory (`vime.rundir`), which first stops whatever an earlier launch
  left running; every child dies with the launcher, even on SIGKILL (`vime.procguard`);
- every part started here is supervised while the run goes (`vime.launcher.follow`): Temporal restarts on
  the same port and file, a vLLM server on the same address with the current weights, a worker
  with Temporal told at once;
- nothing that changes between launches (ports) is frozen in the workflow's input: workers get
  this launch's addresses as flags;
- Ctrl-C (or SIGTERM) stops every part and prints what was saved and the command that resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from vime.config.forward import CHECKED_ENV
from vime.engine.weight_sync import live_weights, lora_serving
from vime.engine.model_fleets import ModelFleets, model_fleets
from vime.engine.topology import topology_of
from vime.errors import VimeError
from vime.config.run_input import initial_state, secret_env, training_config
from vime.launcher.follow import Follower, RunFailed
from vime.log import get_logger
from vime.config.preflight import preflight
from vime.metrics_log import read_metrics
from vime.procs import ask_all_to_stop
from vime.config.eval_config import replaced_sets_note
from vime.config.run_args import stored_config
from vime.rundir import RunDirLock, remove_launch_info, write_launch_info
from vime.store import SampleStore
from vime.launcher.recovery import recover_from_earlier_launch
from vime.launcher.supervisor import LAUNCH_ID, Supervisor, WorkerProcess
from vime.temporal.client import temporal_service
from vime.temporal.restart_plan import recorded, restart_plan, restart_point
from vime.temporal.training_contract import (TRAINER_LOST_SIGNAL, TRAINING_WORKFLOW, TrainingInput, TrainingState,
                                             failure_message)

log = get_logger(__name__)



@dataclass
class ExternalEngines:
    """Servers the user runs (--vllm-router-ip/port): used as they are, not supervised."""

    url: str
    server_urls: list[str]
    model_urls: dict[str, str]

    async def check(self) -> list[str]:
        return []

    def wait_ready(self) -> None:
        """Nothing to wait for: a workflow that needs the servers waits for them itself."""


@contextlib.contextmanager
def engines(args, run_dir: Path) -> Iterator[ModelFleets | ExternalEngines]:
    """The rollout servers: the ones given by --vllm-router-ip/port, else the run's topology
    (`--vllm-config`, or N servers of the policy) started (and kept) here."""
    if args.vllm_router_ip and args.vllm_router_port:
        url = f"http://{args.vllm_router_ip}:{args.vllm_router_port}"
        yield ExternalEngines(url, list(args.vllm_server_urls or [url]), dict(args.vllm_model_routers))
        return
    topology = topology_of(args, check_overrides=False)  # checked when the flags were parsed
    fleets = model_fleets(topology, run_server_args=list(args.vllm_server_args), router_args=list(args.router_args),
                          run_dir=run_dir, sync_engine=args.weight_sync_engine,
                          lora_rank=args.lora_rank if lora_serving.adapter_sync(args) else 0)
    for model in topology.models:
        log_path = fleets.fleets[model.name].slots[0].server.log_path
        if model.num_servers > 1:
            log_path = log_path.with_name(log_path.name.replace("-0.log", "-*.log"))
        who = f" for {model.name}" if len(topology.models) > 1 else ""
        print(f"[vime] starting {model.num_servers} vLLM server(s){who} on {model.model_path}"
              f"{'' if model.update_weights else ' (frozen)'} (logs: {log_path})", flush=True)
    fleets.start()  # `wait_ready` once the workers start
    try:
        yield fleets
    finally:
        fleets.__exit__()


_ENDED = {WorkflowExecutionStatus.FAILED: "failed", WorkflowExecutionStatus.TERMINATED: "was terminated",
          WorkflowExecutionStatus.CANCELED: "was cancelled", WorkflowExecutionStatus.TIMED_OUT: "timed out"}


async def _describe(handle: WorkflowHandle):
    try:
        return await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def _failure(handle: WorkflowHandle) -> str:
    try:
        await handle.result()
    except Exception as e:  # noqa: BLE001 - what ended it, for one line
        return failure_message(e)[:300] or type(e).__name__
    return "no error"


async def finished_state(client, args) -> TrainingState | None:
    """The result of the run's workflow if it completed (a completed run is not trained again)."""
    handle = client.get_workflow_handle(f"train-{args.run_id}", result_type=TrainingState)
    described = await _describe(handle)
    if described is None or described.status != WorkflowExecutionStatus.COMPLETED:
        return None
    state = await handle.result()
    print(f"[vime] run {args.run_id} already finished ({state.step} steps); nothing to train. Pass a new "
          f"--run-id (with --load {args.save or 'CHECKPOINT'} to start from its weights) to train more", flush=True)
    return state


async def start_or_attach(client, args) -> tuple[WorkflowHandle, int | None]:
    """Start `train-<run>`, follow it if it is running, start it again if it failed. Returns the
    handle and the step this launch starts from (None when attaching: the workflow tells)."""
    workflow_id = f"train-{args.run_id}"
    handle = client.get_workflow_handle(workflow_id, result_type=TrainingState)
    described = await _describe(handle)
    status = described.status if described else None
    if status == WorkflowExecutionStatus.RUNNING:
        print(f"[vime] run {args.run_id} is in progress; continuing it", flush=True)
        return handle, None
    state = initial_state(args)
    if status in _ENDED:
        print(f"[vime] run {args.run_id}'s workflow {_ENDED[status]} ({await _failure(handle)}); starting it "
              f"again from {'step ' + str(state.step) if state.step else 'the beginning'}: steps it recorded "
              "are trained on their stored rollouts, not sampled again", flush=True)
    handle = await client.start_workflow(
        TRAINING_WORKFLOW, TrainingInput(training_config(args), state),
        id=workflow_id, task_queue=args.rollout_task_queue, result_type=TrainingState,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY)
    return handle, state.step


def _urls_flag(flag: str, values: list[str]) -> list[str]:
    return [flag, *values] if values else []


def _workers(args, run_dir: Path, temporal_address: str, fleet) -> list[WorkerProcess]:
    host, port = fleet.url.removeprefix("http://").rsplit(":", 1)
    argv = [*args.argv, "--temporal-address", temporal_address, "--vllm-router-ip", host,
            "--vllm-router-port", port, *_urls_flag("--vllm-server-urls", fleet.server_urls),
            *_urls_flag("--vllm-model-urls", [f"{name}={url}" for name, url in fleet.model_urls.items()])]
    checked = {CHECKED_ENV: "1", **secret_env(args)}  # this launcher's parse checked the --vllm-* flags: no vLLM
    # import in workers; the W&B key as the environment (the run's recorded flags leave it out)
    return [WorkerProcess("rollout", "workers.rollout", argv, run_dir / "worker-rollout.log", run_dir, env=checked),
            WorkerProcess("trainer", "workers.trainer", argv, run_dir / "worker-trainer.log", run_dir, env=checked)]


def eval_cost(metrics: list[dict]) -> dict | None:
    """What the run's eval rounds cost: their seconds beside the steps' (rollout wait, train and
    sync), over the steps in `metrics`; None when no round ran. In fully async mode the rounds
    overlap the steps (`steps_beside_eval`: steps trained while a round sampled, their sync held)."""
    rounds = [m["eval_seconds"] for m in metrics if isinstance(m.get("eval_seconds"), int | float)]
    if not rounds:
        return None
    steps = sum(m.get("rollout_wait_seconds", 0) + m.get("train_phase_seconds", 0) + m.get("sync_seconds", 0)
                for m in metrics if not m.get("eval_only"))
    beside = sum(1 for m in metrics if m.get("sync_held"))
    return {"eval_rounds": len(rounds), "eval_seconds": round(sum(rounds), 1), "step_seconds": round(steps, 1),
            **({"steps_beside_eval": beside} if beside else {})}


def eval_cost_text(cost: dict) -> str:
    """`eval 12.3 s in 4 rounds beside 45.6 s of steps (+27%)`; rounds that overlapped training
    (fully async) are not a share of the steps' time: the line says how many steps trained
    meanwhile, and bench/eval_cost.py measures what they cost."""
    share = f" (+{100 * cost['eval_seconds'] / cost['step_seconds']:.0f}%)" if cost["step_seconds"] else ""
    if cost.get("steps_beside_eval"):
        share = f", {cost['steps_beside_eval']} step(s) trained while a round sampled"
    return (f"eval {cost['eval_seconds']:.1f} s in {cost['eval_rounds']} round(s) beside {cost['step_seconds']:.1f} s "
            f"of steps{share}")


class Launch:
    """One launch of a run: what it started and what it saw, for the closing lines. `vime eval`
    launches the same way with another workflow (`vime.launcher.eval_launch.EvalLaunch` overrides
    `finished`, `workers`, `start` and the closing lines)."""

    command = "train"
    owns_services = True
    """This launch started the run's workers and servers: at its start it clears what an earlier
    launch's servers held (live weights, adapters) and fails what an earlier launch's workers had
    started. Not on a shared fleet (`vime train --fleet`): those belong to the fleet and go on."""

    def __init__(self, args, *, checked: bool = False) -> None:
        self.args = args
        self.checked = checked  # `preflight(args)` already ran (`vime train` runs it before importing this)
        self.run_dir = Path(args.run_dir)
        self.follower: Follower | None = None
        self.t0 = time.monotonic()
        self.started_at = time.time()  # a step that finished after this was trained by this launch

    async def run(self) -> TrainingState:
        args, run_dir = self.args, self.run_dir
        if not self.checked:
            preflight(args)
        if args.tis_because:
            print(f"[vime] {args.tis_because}", flush=True)
        if note := replaced_sets_note(args):
            print(f"[vime] {note}", flush=True)
        with self.run_dir_lock() as lock:
            if lock.leftovers:
                print(f"[vime] stopped {len(lock.leftovers)} process(es) an earlier launch of this run left "
                      f"running (pids {' '.join(map(str, lock.leftovers[:10]))})", flush=True)
            with SampleStore.open(args.store_url) as store:
                store.ensure_run(args.run_id, stored_config(args))
            self._forget_served_weights()
            try:
                return await self._serve()
            finally:
                self._forget_served_weights()
                remove_launch_info(run_dir)

    def run_dir_lock(self) -> RunDirLock:
        """One launcher per run directory; it stops what an earlier launch left running there."""
        return RunDirLock(self.run_dir)

    def _forget_served_weights(self) -> None:
        if self.owns_services:
            live_weights.remove(self.run_dir)
            lora_serving.remove(self.run_dir)

    async def _serve(self) -> TrainingState:
        args, run_dir = self.args, self.run_dir
        with contextlib.ExitStack() as early:
            # vLLM is the slowest part to start (three processes, each importing torch and vLLM):
            # it starts first, beside the Temporal dev server, unless the store says the run is done.
            fleet = early.enter_context(engines(args, run_dir)) if self.starts_engines_early() else None
            async with temporal_service(args.temporal_address, run_dir=run_dir,
                                        namespace=args.temporal_namespace) as svc:
                print(f"[vime] run {args.run_id} in {run_dir}; Temporal {svc.address}"
                      + (f", Web UI {svc.ui_url}" if svc.ui_url else ""), flush=True)
                write_launch_info(run_dir, temporal=svc.address, namespace=args.temporal_namespace, ui=svc.ui_url,
                                  run_id=args.run_id)
                done = await self.finished(svc.client)
                if done is not None:
                    self._summarize(done)
                    return done
                with contextlib.ExitStack() as late:
                    fleet = fleet or late.enter_context(engines(args, run_dir))
                    state = await self._train(svc, fleet)
        self._summarize(state)
        return state

    def starts_engines_early(self) -> bool:
        """Whether the servers start beside the Temporal dev server this launch starts: yes unless
        the store recorded the run's end (then Temporal's answer, the run's result, needs none).
        Not beside a Temporal we are given (`--temporal-address`): connecting takes no time to
        hide, and a wrong address is then refused before any server starts."""
        if self.args.temporal_address:
            return False
        with SampleStore.open(self.args.store_url) as store:
            return store.run_progress(self.args.run_id).finished is None

    async def _train(self, svc, fleet) -> TrainingState:
        """Start the workers, start or attach to the run's workflow and follow it to its end."""
        args = self.args
        with Supervisor(self.workers(svc.address, fleet), stop_with=ask_all_to_stop) as supervisor:
            await asyncio.to_thread(fleet.wait_ready)  # the workers start up meanwhile
            if not isinstance(fleet, ExternalEngines):
                print(f"[vime] vLLM ready {time.time() - self.started_at:.0f} s after the launch", flush=True)
            handle, start_step = await self.start(svc.client)
            if start_step is None and self.owns_services:  # an earlier launch's workers died with it
                await recover_from_earlier_launch(svc.client, args.run_id, LAUNCH_ID,
                                                  "the worker's launcher was stopped or died")
                await handle.signal(TRAINER_LOST_SIGNAL)
            self.t0 = time.monotonic()
            self.follower = Follower(svc.client, handle, args.run_id, supervisor, self.services(svc, fleet, handle),
                                     start_step=start_step, started_at=self.started_at,
                                     restart=lambda: restart_plan(recorded(args.store_url, args.run_id)))
            try:
                return await self.follower.follow()
            except RunFailed as e:  # `vime runs` tells it from a stop once this Temporal is gone
                with SampleStore.open(args.store_url) as store:
                    store.record_ended(args.run_id, e.ended, str(e))
                raise

    async def finished(self, client) -> TrainingState | None:
        """The run's result if its workflow completed already (then nothing is started)."""
        return await finished_state(client, self.args)

    def workers(self, temporal_address: str, fleet) -> list[WorkerProcess]:
        return _workers(self.args, self.run_dir, temporal_address, fleet)

    async def start(self, client) -> tuple[WorkflowHandle, int | None]:
        return await start_or_attach(client, self.args)

    def services(self, temporal, fleet, handle: WorkflowHandle) -> list:
        """What the follower checks (and restarts) once a second."""
        return [temporal, fleet]

    def _summarize(self, state: TrainingState) -> None:
        trained = self.follower.steps_trained if self.follower else 0
        seconds = round(time.monotonic() - self.t0, 1)
        cost = eval_cost(read_metrics(self.run_dir) or state.metrics)
        summary = {"run_id": self.args.run_id, "steps": state.step, "steps_this_launch": trained,
                   "weight_version": state.weight_version, "seconds": seconds, "checkpoint": state.checkpoint,
                   **(cost or {}), "metrics": state.metrics}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        dropped = sum(m.get("dropped_groups", 0) for m in state.metrics)
        print(f"[vime] run {self.args.run_id} finished: {state.step} steps, {trained} trained by this launch in "
              f"{seconds:.0f} s" + (f"; {dropped} groups dropped past --max-staleness" if dropped else "")
              + (f"; {eval_cost_text(cost)}" if cost else "")
              + f"; summary in {self.run_dir / 'summary.json'}", flush=True)

    def stopped_line(self, resume_command: str) -> str:
        """What Ctrl-C prints: where the run stands, what is saved, and the command that resumes."""
        p = self.follower.progress if self.follower else {}
        where = f"at step {p['step']}/{self.args.num_rollout}" if "step" in p else "before its first step"
        saved = f"checkpoint {p['checkpoint']}" if p.get("checkpoint") else "no checkpoint yet"
        trained = self.follower.steps_trained if self.follower else 0
        return (f"[vime] stopped run {self.args.run_id} {where} ({trained} steps trained by this launch; samples "
                f"and step records in {self.args.store_url.removeprefix('sqlite:///')}, {saved}); resume with: "
                f"{resume_command} (it goes on {restart_point(recorded(self.args.store_url, self.args.run_id))})")


def resume_command() -> str:
    """This process's own command line, as the user can type it again."""
    if sys.argv[0].endswith(("vime/cli.py", "vime/cli")):  # python -m vime.cli
        return shlex.join([sys.executable, "-m", "vime.cli", *sys.argv[1:]])
    return shlex.join(sys.argv)


async def run_training(args) -> TrainingState:
    """Run (or resume) a training run to its end; see the module docstring."""
    return await Launch(args).run()


def run_to_end(args, resume: str | None = None, *, checked: bool = False,
               launch: Launch | None = None) -> tuple[int, TrainingState | None]:
    """Run a launch to its end as a command does: `(exit code, final state)`. Exit 0 when the run
    finished, 2 on a problem to fix (printed as one line), 130 on Ctrl-C and 143 on SIGTERM (both
    print what was saved and the command that resumes: `resume`, default this process's own).
    `checked`: the caller ran `preflight(args)` already. `launch`: another kind of launch of
    `args` (`vime eval`'s), instead of a training run's."""
    launch = launch or Launch(args, checked=checked)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where a shell started us ignoring it
    # What is imported by now (torch, vLLM's parser, Temporal) lives as long as the process: kept
    # out of garbage collection, it is not walked by the full collection `vime.cli` runs at exit
    # (0.7 s of CPU, 3-4 s of a SIGTERM's stop at load 7) nor by the run's own.
    gc.freeze()

    async def run() -> TrainingState:
        task = asyncio.current_task()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await launch.run()

    try:
        return 0, asyncio.run(run())
    except VimeError as e:
        print(f"vime {launch.command}: error: {e}", file=sys.stderr, flush=True)
        return 2, None
    except (KeyboardInterrupt, asyncio.CancelledError) as e:
        print(launch.stopped_line(resume or resume_command()), file=sys.stderr, flush=True)
        return (130 if isinstance(e, KeyboardInterrupt) else 143), None


def main(args, *, checked: bool = False) -> int:
    return run_to_end(args, checked=checked)[0]
