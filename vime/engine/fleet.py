"""The rollout servers a launch started, kept alive: `EngineFleet`.

A vLLM server that dies (crash, OOM, kill -9) is noticed within a second (`check`, called by
the launcher's watch loop), its log tail is printed, and it is restarted **on the same address**
from the live weights (`vime.engine.weight_sync.live_weights`: the policy the trainer synced last, with its
weight version), so clients and the trainer find it where it was and nothing samples from stale
weights. Requests that were in flight fail as infrastructure failures and their rollouts are
retried by Temporal once the server is back.

A server whose process lives on but whose `/health` refuses (an error status, or a refused
connection) for `HUNG_AFTER_S` counts as dead too: when its engine core dies, vLLM's API server
starts its shutdown and then waits, without a bound, for the connections clients keep open
(drilled: kill -9 of the engine core left a run waiting for 10 minutes). It is stopped and
restarted the same way. A server that is only slow to answer (busy, or SIGSTOPped: probes time
out) is left alone, as before: the clients' stall bound handles it.

A server that keeps dying (`MAX_DEATHS` within `DEATH_WINDOW_S`) is not restarted again: `check`
raises `ServiceError` with one line naming the server, its log and its last error.
A router in front of several servers is supervised the same way (same port, same workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from vime.engine.weight_sync import live_weights, lora_serving
from vime.engine.server import VLLMServer
from vime.errors import ServiceError
from vime.log import get_logger
from vime.procs import exit_cause, log_tail

log = get_logger(__name__)

MAX_DEATHS = 3
DEATH_WINDOW_S = 600.0
START_TIMEOUT_S = 300.0  # what VLLMServer waits by default; under load start-up takes ~2 min
RESTART_TIMEOUT_S = 600.0
HUNG_AFTER_S = 20.0  # a live server whose /health refused for this long is restarted


@dataclass
class _Slot:
    """One server position: its address stays, the process behind it may change."""

    index: int
    server: VLLMServer
    deaths: deque = field(default_factory=deque)  # monotonic times of deaths in the window
    restart: asyncio.Task | None = None
    died_at: float = 0.0
    unanswered_since: float | None = None  # monotonic time of the first refused /health probe in a row


class EngineFleet:
    """`with EngineFleet(...) as fleet:` starts the servers (and a router for several) and waits
    for them (or `start()`, then `wait_ready()`); `await fleet.check()` restarts the dead ones and
    returns what to tell the user."""

    def __init__(self, servers: list[VLLMServer], *, run_dir: str | Path, router=None, name: str = "",
                 follows_training: bool = True) -> None:
        self.slots = [_Slot(i, s) for i, s in enumerate(servers)]
        self.run_dir = Path(run_dir)
        self.router = router
        self.name = name  # the model's, in a --vllm-config topology of several ("" for the one policy)
        self.follows_training = follows_training  # restarts load the live weights; else its checkpoint
        self.router_deaths: deque = deque()

    @property
    def server_urls(self) -> list[str]:
        return [slot.server.url for slot in self.slots]

    @property
    def url(self) -> str:
        """What generate functions call: the router, or the one server."""
        return self.router.url if self.router is not None else self.slots[0].server.url

    def __enter__(self) -> EngineFleet:
        self.start()
        self.wait_ready()
        return self

    def start(self) -> EngineFleet:
        """Spawn every server and return at once: the launcher starts its workers meanwhile (their
        start-up and vLLM's overlap), then calls `wait_ready`."""
        try:
            for slot in self.slots:
                slot.server.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def wait_ready(self) -> None:
        """Block until every server answers `/health` (a `ServiceError` with its log tail if one
        does not), then start the router."""
        try:
            with ThreadPoolExecutor(len(self.slots)) as pool:
                list(pool.map(lambda slot: slot.server.wait_healthy(START_TIMEOUT_S), self.slots))
            if self.router is not None:
                self.router.__enter__()
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        for slot in self.slots:
            if slot.restart is not None:
                slot.restart.cancel()
        if self.router is not None:
            self.router.__exit__()
        with ThreadPoolExecutor(len(self.slots)) as pool:
            list(pool.map(lambda slot: slot.server.stop(), self.slots))

    async def check(self) -> list[str]:
        """Restart dead servers (in the background); return lines for the console."""
        lines: list[str] = []
        for slot in self.slots:
            if slot.restart is not None:
                if slot.restart.done():
                    lines.append(self._restart_result(slot))
                continue
            proc = slot.server.process
            if proc is None:
                continue
            if proc.poll() is None:
                if not await self._hung(slot):
                    continue
                lines.append(self._on_death(slot, None))
            else:
                lines.append(self._on_death(slot, proc.returncode))
            slot.restart = asyncio.create_task(asyncio.to_thread(self._restart, slot))
        if self.router is not None and self.router.process is not None and self.router.process.poll() is not None:
            lines.append(self._restart_router())
        return lines

    @property
    def restarting(self) -> bool:
        return any(slot.restart is not None for slot in self.slots)

    async def _hung(self, slot: _Slot) -> bool:
        """Whether the live server's `/health` has refused every probe for `HUNG_AFTER_S`."""
        if not await asyncio.to_thread(slot.server.refuses):
            slot.unanswered_since = None
            return False
        now = time.monotonic()
        if slot.unanswered_since is None:
            slot.unanswered_since = now
        return now - slot.unanswered_since >= HUNG_AFTER_S

    def _on_death(self, slot: _Slot, code: int | None) -> str:
        """`code` None: the process lives but stopped answering (`_hung`)."""
        now = time.monotonic()
        slot.unanswered_since = None
        slot.died_at = now
        slot.deaths.append(now)
        while slot.deaths and now - slot.deaths[0] > DEATH_WINDOW_S:
            slot.deaths.popleft()
        server = slot.server
        cause = (exit_cause(code, server.log_path) if code is not None else
                 f"alive but its /health refused for {HUNG_AFTER_S:.0f} s; stopped")
        if len(slot.deaths) >= MAX_DEATHS:
            raise ServiceError(
                f"vLLM server {self._label(slot)} ({server.url}) died {len(slot.deaths)} times in "
                f"{DEATH_WINDOW_S / 60:.0f} minutes; last error: {cause}; see {server.log_path}")
        tail = "\n".join("    " + line for line in log_tail(server.log_path, 5).splitlines())
        weights = "the current weights" if self.follows_training else "its checkpoint (a frozen model)"
        return (f"[vime] vLLM server {self._label(slot)} ({server.url}) died ({cause}); restarting it on the same "
                f"address with {weights}; last lines of {server.log_path}:\n{tail}")

    def _restart(self, slot: _Slot) -> int | None:
        """Start the server again on its port from the live weights; returns their version."""
        old = slot.server
        old.stop()  # what its dead process left in its group (a SIGKILLed guard's engine core)
        live = live_weights.current(self.run_dir) if self.follows_training else None
        model = str(live[0]) if live else old.model
        server = old.relaunch(model)
        adapters = lora_serving.current(self.run_dir) if self.follows_training else None
        if adapters is not None and adapters["adapters"]:
            # a LoRA run: the server boots with the adapters the others hold (the run's current
            # version and those kept for groups still sampling), before it answers any request
            server.server_args = (lora_serving.without_lora_modules(server.server_args)
                                  + lora_serving.lora_modules_args(adapters))
        slot.server = server
        server.start().wait_healthy(RESTART_TIMEOUT_S)
        if adapters is not None and adapters["adapters"]:
            return int(adapters["version"])
        if live is not None and _weight_label(server.url) in (live_weights.BASE_VERSION, None):
            # Label the live weights only while no sync has reached the server since it booted:
            # the trainer's sync (it waits for the server) may land first, and lowering its
            # label would make every group sampled there look stale (vime.rollout.policy_check)
            _post_json(f"{server.url}/update_weight_version", {"new_version": str(live[1])})
        return live[1] if live else None

    def _restart_result(self, slot: _Slot) -> str:
        task, slot.restart = slot.restart, None
        took = time.monotonic() - slot.died_at
        try:
            version = task.result()
        except Exception as e:  # noqa: BLE001 - a failed restart is a death of its own
            slot.server.stop()
            msg = self._on_death(slot, -1)
            slot.restart = asyncio.create_task(asyncio.to_thread(self._restart, slot))
            return f"[vime] restarting vLLM server {self._label(slot)} failed ({str(e).splitlines()[0]}); {msg}"
        weights = (f"weight version {version}" if version is not None else "the base checkpoint (no sync yet)"
                   if self.follows_training else "its checkpoint (a frozen model)")
        return f"[vime] vLLM server {self._label(slot)} is back at {slot.server.url} after {took:.0f} s, serving {weights}"

    def _label(self, slot: _Slot) -> str:
        return f"{self.name} {slot.index}" if self.name else str(slot.index)

    def _restart_router(self) -> str:
        now = time.monotonic()
        self.router_deaths.append(now)
        while self.router_deaths and now - self.router_deaths[0] > DEATH_WINDOW_S:
            self.router_deaths.popleft()
        cause = exit_cause(self.router.process.returncode, self.router.log_path)
        which = f"the {self.name} router" if self.name else "the router"
        if len(self.router_deaths) >= MAX_DEATHS:
            raise ServiceError(f"{which} ({self.router.url}) died {len(self.router_deaths)} times; last error: "
                               f"{cause}; see {self.router.log_path}")
        self.router.__exit__()
        self.router.__enter__()
        return f"[vime] {which} ({self.router.url}) died ({cause}); restarted it on the same address"


def _weight_label(url: str) -> str | None:
    """The weight version the server reports now (`default` until it is first told one), or None
    when it does not say."""
    try:
        with urllib.request.urlopen(f"{url}/weight_info", timeout=30) as response:
            return str(json.loads(response.read()).get("weight_version"))
    except (OSError, ValueError):
        return None


def _post_json(url: str, payload: dict) -> None:
    """Best effort: a server that does not take the label still serves the right weights."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with contextlib.suppress(OSError):
        urllib.request.urlopen(request, timeout=30).close()
