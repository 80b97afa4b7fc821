"""Nothing vime starts outlives what started it: the guard, the run-directory lock, the worker
supervisor and the live weights a restarted vLLM server boots from. Real processes, no mocks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from vime.engine.weight_sync import live_weights
from vime.errors import ConfigError, ServiceError
from vime.launcher.follow import Follower
from vime.procs import leftover_processes, spawn, stop_process_group
from vime.rundir import RunDirLock
from vime.launcher.supervisor import Supervisor, WorkerProcess


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# A command that starts a grandchild in the background (like vLLM's API server starting its
# engine core), writes both pids, then sleeps.
FAMILY = textwrap.dedent("""
    import json, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[1], "w").write(json.dumps({"parent": __import__("os").getpid(), "child": child.pid}))
    time.sleep(600)
""")


def start_family(tmp_path: Path) -> tuple[subprocess.Popen, dict]:
    script, pids = tmp_path / "family.py", tmp_path / "pids.json"
    script.write_text(FAMILY)
    guard = spawn([sys.executable, str(script), str(pids)], tmp_path / "family.log", run_dir=tmp_path)
    assert wait_until(lambda: pids.exists() and pids.read_text())
    return guard, json.loads(pids.read_text())


def test_when_the_command_is_killed_the_guard_kills_what_it_left_behind(tmp_path):
    guard, pids = start_family(tmp_path)
    os.kill(pids["parent"], signal.SIGKILL)  # like kill -9 of vLLM's API server
    assert guard.wait(10) == 128 + signal.SIGKILL
    assert wait_until(lambda: not alive(pids["child"])), "the grandchild outlived its parent"


def test_a_guarded_family_dies_with_a_launcher_killed_with_sigkill(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from vime.procs import spawn
        spawn([sys.executable, {str(tmp_path / 'family.py')!r}, {str(tmp_path / 'pids.json')!r}],
              {str(tmp_path / 'family.log')!r}, run_dir={str(tmp_path)!r})
        time.sleep(600)
    """)])
    (tmp_path / "family.py").write_text(FAMILY)
    assert wait_until(lambda: (tmp_path / "pids.json").exists() and (tmp_path / "pids.json").read_text(), 20)
    pids = json.loads((tmp_path / "pids.json").read_text())
    launcher.kill()
    launcher.wait()
    assert wait_until(lambda: not alive(pids["parent"]) and not alive(pids["child"]), 30)
    assert wait_until(lambda: leftover_processes(tmp_path) == [], 10)


def test_a_guard_killed_with_sigkill_leaves_a_grandchild_that_stopping_it_then_kills(tmp_path):
    """kill -9 of the guard itself: the command dies with it (its death signal), but the grandchild
    (vLLM's engine core, whose model worker then spins at full CPU) is reparented to init. Stopping
    the dead guard, as a fleet does before it restarts a server, kills its whole process group."""
    guard, pids = start_family(tmp_path)
    os.kill(guard.pid, signal.SIGKILL)
    guard.wait(10)
    assert wait_until(lambda: not alive(pids["parent"]))
    assert alive(pids["child"])  # the hazard: nothing else would stop it
    stop_process_group(guard, timeout=1)
    assert wait_until(lambda: not alive(pids["child"])), "the dead guard's grandchild outlived its stop"


def test_stopping_a_guard_stops_its_command_gracefully_then_everything(tmp_path):
    guard, pids = start_family(tmp_path)
    t0 = time.monotonic()
    stop_process_group(guard, timeout=10)
    assert time.monotonic() - t0 < 10  # python exits on SIGTERM at once
    assert not alive(pids["parent"]) and wait_until(lambda: not alive(pids["child"]))


def test_a_second_launcher_on_the_same_run_directory_is_refused_naming_the_first(tmp_path):
    with RunDirLock(tmp_path):
        with pytest.raises(ConfigError, match=rf"in use by another vime process .*pid {os.getpid()}\)"):
            with RunDirLock(tmp_path):
                pass


def test_taking_the_run_directory_stops_what_an_earlier_launch_left_running(tmp_path):
    guard, pids = start_family(tmp_path)
    with RunDirLock(tmp_path) as lock:
        assert {pids["parent"], pids["child"], guard.pid} <= set(lock.leftovers)
    guard.wait(10)
    assert not alive(pids["parent"]) and not alive(pids["child"])


def worker(tmp_path: Path, code: str, name: str = "w") -> WorkerProcess:
    module = tmp_path / f"{name}_mod.py"
    module.write_text(code)
    return WorkerProcess(name, f"{name}_mod", [], tmp_path / f"{name}.log", tmp_path,
                         env={"PYTHONPATH": str(tmp_path)})


def test_a_worker_that_stops_on_a_configuration_error_stops_the_run_with_its_line(tmp_path):
    w = worker(tmp_path, "import sys\nprint('vime: error: --prompt-data p.jsonl:3: not valid JSON', "
                         "file=sys.stderr)\nsys.exit(2)\n")
    with Supervisor([w]) as supervisor:
        assert wait_until(lambda: not w.alive())
        with pytest.raises(ConfigError, match=r"^--prompt-data p.jsonl:3: not valid JSON$"):
            supervisor.check()


def test_a_worker_that_crashes_the_same_way_twice_at_start_is_not_restarted_again(tmp_path):
    w = worker(tmp_path, "raise RuntimeError('no GPU here')\n")
    with Supervisor([w]) as supervisor:
        assert wait_until(lambda: not w.alive())
        [death] = supervisor.check()
        assert "RuntimeError: no GPU here" in death.cause
        assert wait_until(lambda: not w.alive())
        with pytest.raises(ServiceError, match="died twice right after starting: RuntimeError: no GPU here"):
            supervisor.check()


def test_a_killed_worker_is_restarted_with_a_new_identity(tmp_path):
    w = worker(tmp_path, "import time\ntime.sleep(600)\n")
    with Supervisor([w]) as supervisor:
        first = w.identity
        os.kill(w.process.pid, signal.SIGKILL)  # the guard: it reports the kill as its exit status
        assert wait_until(lambda: not w.alive())
        [death] = supervisor.check()
        assert death.identity == first and w.identity != first and w.alive()


def command_pid(w: WorkerProcess) -> int:
    """The worker's own process (its guard's child)."""
    children = Path(f"/proc/{w.pid}/task/{w.pid}/children")
    assert wait_until(lambda: children.read_text().split())
    return int(children.read_text().split()[0])


def test_the_supervisor_says_at_once_that_a_killed_worker_exited(tmp_path):
    """Issue 21: a killed rollout worker was noticed ~30 s after its death. A thread now waits on
    each worker (a blocking waitpid): the callback comes within the guard's 0.2 s poll."""
    w = worker(tmp_path, "import time\ntime.sleep(600)\n")
    exited = threading.Event()
    with Supervisor([w]) as supervisor:
        supervisor.on_exit(exited.set)
        pid = command_pid(w)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        assert exited.wait(10)
        noticed = time.monotonic() - t0
        assert not w.alive() and noticed < 3, noticed
        [death] = supervisor.check()
        assert death.cause == "killed by SIGKILL"


class StuckWorkflow:
    """A workflow handle whose result never comes and whose progress query never answers, as when
    the worker that runs the workflow has just died."""

    async def result(self):
        await asyncio.Event().wait()

    async def query(self, *args, **kwargs):
        await asyncio.Event().wait()


async def test_a_dead_worker_is_handled_at_once_while_the_progress_query_hangs(tmp_path, capsys):
    """The follower's loop can sit in a query to a workflow whose worker just died (for ~30 s, until
    Temporal gives up on it): worker deaths are handled apart from that loop."""
    w = worker(tmp_path, "import time\ntime.sleep(600)\n")
    with Supervisor([w]) as supervisor:
        follow = asyncio.create_task(Follower(None, StuckWorkflow(), "run", supervisor).follow())
        pid = command_pid(w)
        await asyncio.sleep(1.5)  # the follower is in its query now
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        out = ""
        while "worker w died (killed by SIGKILL); restarted it" not in out and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.05)
            out += capsys.readouterr().out
        took = time.monotonic() - t0
        follow.cancel()
        assert took < 3, (took, out)
        assert w.alive() and w.restarts == 1


SLOW_TO_STOP = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(0)))
time.sleep(600)
"""


def test_stopping_the_supervisor_stops_its_workers_together_not_one_after_another(tmp_path):
    """Two workers that each take 3 s to stop: 3 s in all (it took the sum, one by one)."""
    workers = [worker(tmp_path, SLOW_TO_STOP, name) for name in ("a", "b")]
    with Supervisor(workers):
        time.sleep(1)  # their SIGTERM handlers are in place
        t0 = time.monotonic()
    took = time.monotonic() - t0
    assert 3 <= took < 5.5, took
    assert not leftover_processes(tmp_path)


def test_published_weights_make_a_model_directory_with_their_version(tmp_path):
    from safetensors.torch import save_file
    import torch

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "tokenizer.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, str(base / "model.safetensors"))
    run_dir = tmp_path / "run"
    weights = Path("/dev/shm") / f"vime-test-{os.getpid()}.safetensors"
    save_file({"w": torch.ones(2)}, str(weights), metadata={live_weights.VERSION_KEY: "7"})
    try:
        assert live_weights.current(run_dir) is None
        directory = live_weights.publish(weights, run_dir, base)
        found, version = live_weights.current(run_dir)
        assert found == directory and version == 7
        assert (directory / "config.json").resolve() == (base / "config.json").resolve()
        assert not weights.exists()  # moved, not copied
    finally:
        live_weights.remove(run_dir)
        weights.unlink(missing_ok=True)
    assert live_weights.current(run_dir) is None
