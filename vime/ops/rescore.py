"""`vime rescore RUN --custom-rm-path NEW`: a run's stored rollouts scored by new reward code,
without sampling again, as a Temporal workflow (`RescoreWorkflow`: idempotent, resumable).

The new rewards are stored beside the old ones (the `rescores` table), never over them; the
command prints each trained step's mean reward under the old and the new code. The same code
(the same source, hashed) rescoring again writes nothing. Temporal is the run's own dev server on
`<run-dir>/temporal.db` (under the run-dir lock), or `--temporal-address`; the command starts its
own worker (`workers/rescore.py`, a child process, stopped at the end), so nothing else needs to
be running. Ctrl-C and the same command resume it.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import select
from temporalio.client import WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError

from vime.errors import ConfigError, ServiceError
from vime.ops.commands import run_parser, table
from vime.ops.locate import open_existing, run_dir_of, store_for
from vime.ops.steps import step_number
from vime.plugins import load_function
from vime.rundir import RunDirLock
from vime.store import SampleStore
from vime.store.models import RunRow
from vime.launcher.supervisor import WorkerProcess, running, while_alive
from vime.temporal.client import connect
from vime.temporal.dev_server import TemporalDevServer
from vime.temporal.rescore import RESCORE_TASK_QUEUE, RESCORE_WORKFLOW, RescoreInput, RescoreOutput


REVIVE_SECONDS = 300  # how long a lost dev server is restarted and waited for


def scorer_of(path: str) -> str:
    """A name for the reward code: the hash of the function's path and its module's source."""
    fn = load_function(path, "--custom-rm-path")
    try:
        source = Path(inspect.getsourcefile(fn) or "").read_bytes()
    except (OSError, TypeError):
        source = inspect.getsource(fn).encode()
    return hashlib.sha256(path.encode() + b"\0" + source).hexdigest()[:16]


def stored_run_config(store: SampleStore, run_id: str) -> dict | None:
    """The config run `run_id` was stored with; None when the store has no such run."""
    with store.engine.connect() as conn:
        return conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).scalar_one_or_none()


def rescore_main(argv: list[str]) -> int:
    parser = run_parser("vime rescore", "Score a run's stored rollouts with new reward code, without sampling; "
                        "the new rewards are stored beside the old, and old vs new means are printed per step.")
    parser.add_argument("--custom-rm-path", required=True, help="module.function of the new reward: "
                        "async rm(args, sample), or rm(args, samples) with --group-rm")
    parser.add_argument("--group-rm", action="store_true", help="the function scores a prompt group at once")
    parser.add_argument("--temporal-address", help="a running Temporal (default: the run's own dev server)")
    args = parser.parse_args(argv)
    scorer = scorer_of(args.custom_rm_path)
    run_dir = run_dir_of(args.run, args.run_dir)
    with open_existing(store_for(args)) as store:
        if stored_run_config(store, args.run) is None:
            raise ConfigError(f"run {args.run!r} is not in {store.url}; `vime runs` lists the runs")
        with _temporal(args, run_dir) as (address, server), \
                running(_worker(address, store_for(args), run_dir)) as worker:
            try:
                out = asyncio.run(_rescore(address, server, worker, RescoreInput(
                    args.run, scorer, args.custom_rm_path, args.group_rm)))
            except RPCError as e:  # a --temporal-address that went away: what is stored stays stored
                raise ServiceError(f"lost Temporal at {address} ({e.message}); the pages scored so far are "
                                   "stored: run the same command to go on") from None
        scored, steps = store.rescore_summary(args.run, scorer)
    if args.json:
        print(json.dumps({"scorer": scorer, "samples": out.samples, "written": out.written, "scored": scored,
                          "steps": [{**s.__dict__, "step": step_number(s.step)} for s in steps]}, indent=1))
        return 0
    print(table([[step_number(s.step), s.samples, s.old_mean, s.new_mean] for s in steps],
                ["STEP", "SAMPLES", "OLD MEAN", "NEW MEAN"]))
    print(f"rescored {out.samples} samples with {args.custom_rm_path} (scorer {scorer}): {out.written} new rewards "
          f"stored beside the old" + ("; this code had scored them all before: nothing changed" if not out.written
                                      else ""))
    return 0


def _worker(address: str, store: str, run_dir: Path) -> WorkerProcess:
    """The rescore worker, its log in the run directory (else in the temp directory)."""
    log_dir = run_dir if run_dir.is_dir() else Path(tempfile.gettempdir())
    return WorkerProcess("rescore", "workers.rescore", ["--temporal-address", address, "--store", store],
                         log_dir / "worker-rescore.log", run_dir if run_dir.is_dir() else None)


@contextmanager
def _temporal(args, run_dir: Path):
    if args.temporal_address:
        yield args.temporal_address, None
        return
    if not run_dir.is_dir():
        raise ConfigError(f"no run directory {str(run_dir)!r} for the run's Temporal; pass --run-dir or "
                          "--temporal-address")
    with RunDirLock(run_dir), TemporalDevServer(run_dir, headless=True) as server:
        yield server.address, server


async def _revive(server: TemporalDevServer) -> None:
    """Restart the run's dev server if it died (same port and file: the client and the worker
    reconnect, the workflow goes on), as `vime train` does; else give it a moment."""
    if server.alive():
        await asyncio.sleep(1.0)
        return
    print(f"[vime] the run's Temporal dev server died; restarting it (log: {server.log_path})", flush=True)
    await asyncio.to_thread(server.restart)


async def _rescore(address: str, server: TemporalDevServer | None, worker: WorkerProcess,
                   inp: RescoreInput) -> RescoreOutput:
    client = await connect(address, identity=f"vime-rescore-{inp.run_id}")
    deadline = time.monotonic() + REVIVE_SECONDS
    while True:
        try:
            handle = await client.start_workflow(
                RESCORE_WORKFLOW, inp, id=f"rescore-{inp.run_id}-{inp.scorer}", task_queue=RESCORE_TASK_QUEUE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, result_type=RescoreOutput)
            return await while_alive(worker, handle.result())
        except RPCError:
            if server is None or time.monotonic() > deadline:
                raise
            await _revive(server)
        except WorkflowFailureError as e:
            cause = e.cause
            while getattr(cause, "cause", None) is not None:
                cause = cause.cause
            raise ConfigError(f"rescore of run {inp.run_id!r} failed: "
                              f"{getattr(cause, 'message', None) or cause}") from None
