"""The engine fleet's supervision rules, on a stand-in server process (a real process that only
sleeps, named as such: a vLLM start costs 30-60 s here, and `test_chaos.py` kills real vLLM
servers). A dead server is restarted on the same address from the live weights; one that dies 3
times in 10 minutes stops the launch with one line naming it, its log and its last error."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from vime.engine import fleet as fleet_module
from vime.engine.fleet import EngineFleet
from vime.errors import ServiceError
from vime.procs import spawn, stop_process_group


class SleepingServer:
    """Stands in for `VLLMServer`: same attributes and lifecycle, a `sleep` process behind it."""

    def __init__(self, model: str, log_path: Path, port: int = 4242) -> None:
        self.model, self.log_path, self.port = model, log_path, port
        self.url = f"http://127.0.0.1:{port}"
        self.process = None
        self.healthy = True  # False: `/health` refuses (an error status or a refused connection)

    def refuses(self) -> bool:
        return not self.healthy

    def start(self) -> SleepingServer:
        self.process = spawn([sys.executable, "-c", "import time; time.sleep(600)"], self.log_path)
        return self

    def wait_healthy(self, timeout: float) -> SleepingServer:
        return self

    def __enter__(self) -> SleepingServer:
        return self.start()

    def stop(self) -> None:
        stop_process_group(self.process, 5)

    def relaunch(self, model: str) -> SleepingServer:
        return SleepingServer(model, self.log_path, self.port)


async def restarted(fleet: EngineFleet) -> list[str]:
    lines = await fleet.check()
    while fleet.restarting:
        await asyncio.sleep(0.05)
        lines += await fleet.check()
    return lines


def kill(server: SleepingServer) -> None:
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()


async def test_a_dead_server_comes_back_on_its_address_and_the_third_death_stops_the_launch(tmp_path):
    log = tmp_path / "vllm-0.log"
    log.write_text("RuntimeError: CPU Generator does not use offset\n")  # what a crashed engine leaves
    with EngineFleet([SleepingServer("base-model", log)], run_dir=tmp_path) as fleet:
        first = fleet.slots[0].server
        kill(first)
        lines = await restarted(fleet)
        back = fleet.slots[0].server
        assert back is not first and back.url == first.url and back.model == "base-model"  # no sync yet
        assert "vLLM server 0 (http://127.0.0.1:4242) died (killed by SIGKILL)" in lines[0]
        assert "is back at http://127.0.0.1:4242" in lines[-1] and "the base checkpoint" in lines[-1]
        kill(back)
        await restarted(fleet)
        fleet.slots[0].server.process.kill()
        fleet.slots[0].server.process.wait()
        with pytest.raises(ServiceError, match=r"vLLM server 0 \(http://127.0.0.1:4242\) died 3 times in 10 minutes; "
                                               r"last error: killed by SIGKILL; see .*vllm-0.log"):
            await fleet.check()


async def test_a_live_server_whose_health_refuses_is_stopped_and_restarted(tmp_path, monkeypatch):
    """vLLM's API server outlives a dead engine core, waiting for clients' open connections to
    close: a run must not wait on it forever. A few failed probes are not a death."""
    monkeypatch.setattr(fleet_module, "HUNG_AFTER_S", 0.5)
    with EngineFleet([SleepingServer("base-model", tmp_path / "vllm-0.log")], run_dir=tmp_path) as fleet:
        first = fleet.slots[0].server
        first.healthy = False
        assert await fleet.check() == [] and not fleet.restarting, "one failed probe is not a death"
        first.healthy = True
        await asyncio.sleep(0.6)
        assert await fleet.check() == [], "an answer resets the clock"
        first.healthy = False
        await fleet.check()
        await asyncio.sleep(0.6)
        lines = await restarted(fleet)
        assert "vLLM server 0 (http://127.0.0.1:4242) died (alive but its /health refused for 0 s; stopped)" \
            in lines[0]
        assert first.process.poll() is not None, "the hung process is gone"
        assert fleet.slots[0].server is not first and "is back at http://127.0.0.1:4242" in lines[-1]


async def test_a_frozen_models_server_comes_back_on_its_checkpoint_not_the_policys_live_weights(
        tmp_path, monkeypatch):
    """In a `--vllm-config` topology, a reward model's server that dies reloads the reward model;
    only the policy's servers restart from the weights the trainer synced last."""
    from vime.engine.weight_sync import live_weights

    live = (tmp_path / "live", 7)
    monkeypatch.setattr(live_weights, "current", lambda run_dir: live)
    policy = EngineFleet([SleepingServer("policy", tmp_path / "vllm-actor-0.log", 4243)], run_dir=tmp_path,
                         name="actor")
    frozen = EngineFleet([SleepingServer("reward-model", tmp_path / "vllm-reward-0.log", 4244)], run_dir=tmp_path,
                         name="reward", follows_training=False)
    with policy, frozen:
        monkeypatch.setattr("vime.engine.fleet._post_json", lambda url, payload: None)
        for fleet in (policy, frozen):
            kill(fleet.slots[0].server)
        policy_lines, frozen_lines = await restarted(policy), await restarted(frozen)
    assert policy.slots[0].server.model == str(tmp_path / "live") and "weight version 7" in policy_lines[-1]
    assert frozen.slots[0].server.model == "reward-model" and "its checkpoint (a frozen model)" in frozen_lines[-1]
    assert "vLLM server reward 0 (http://127.0.0.1:4244) died" in frozen_lines[0]
    assert "restarting it on the same address with its checkpoint (a frozen model)" in frozen_lines[0]


def test_a_server_refuses_when_health_errs_or_its_port_is_closed_not_when_it_is_only_slow():
    """What `EngineFleet` restarts after `HUNG_AFTER_S`: an API server without its engine (an error
    status) or in its shutdown (a refused connection). A stopped or busy server (the probe times
    out) is not restarted for it: SIGSTOP of vLLM for 25 s is the clients' stall bound's case."""
    import http.server
    import socket
    import threading

    from vime.engine.server import VLLMServer, free_port

    class Health(http.server.BaseHTTPRequestHandler):
        status = 200

        def do_GET(self):
            self.send_response(self.status)
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = VLLMServer("m", port=httpd.server_address[1])
        assert not server.refuses()
        Health.status = 503  # vLLM's /health once its engine died
        assert server.refuses()
    finally:
        httpd.shutdown()
    assert VLLMServer("m", port=free_port()).refuses(), "nothing listens: refused"
    with socket.socket() as silent:  # listens, never answers: what a SIGSTOPped server looks like
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        assert not VLLMServer("m", port=silent.getsockname()[1]).refuses()
