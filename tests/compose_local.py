"""docker-compose.yml's services as local processes: the file's own commands, run on this machine
(tests/test_compose_local.py), so the file cannot drift from what runs.

Each service's command runs as its container would run it (an `sh -c` script through `sh`, with
the service's `environment`) once what it `depends_on` is up by Compose's rule: started, healthy
by that service's own health check, or completed successfully. Only what differs between a
container on a Compose network and a process here is rewritten (`LocalTopology.localize`):

- addresses: a service's `NAME:PORT`, a `--X-ip NAME --X-port PORT` pair, and in a service's own
  command its listening port and `0.0.0.0` become 127.0.0.1 and a free local port (a service's
  ports are those its `ports` and `expose` declare);
- bind mounts: a container path becomes the local copy of its repository directory under `root`
  (a host path elsewhere, such as the /dev/shm directory the weights go through, is this host's);
- `StandIn`s replace the images vime does not build (PostgreSQL, Temporal's server and schema
  step, the Web UI); the test starts them, and `variables` sets what points at them.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.compose import REPO
from vime.engine.server import free_port
from vime.procs import log_tail, spawn, stop_process_groups


@dataclass(frozen=True)
class StandIn:
    """What replaces a service here, and whether that service's own health check applies to it."""

    why: str
    health_check_applies: bool = False


@dataclass
class LocalTopology:
    services: dict
    root: Path
    stand_ins: dict[str, StandIn]
    variables: dict[str, str] = field(default_factory=dict)
    """Values that replace a service's environment variable of the same name (before `localize`)."""
    ports: dict[tuple[str, int], int] = field(init=False)
    processes: dict[str, subprocess.Popen] = field(init=False, default_factory=dict)
    ready: set[str] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        missing = set(self.stand_ins) - set(self.services)
        assert not missing, f"stand-ins for services the file does not have: {missing}"
        self.ports = {(name, port): free_port() for name, service in self.services.items()
                      for port in declared_ports(service)}
        for name in self.services:  # as Docker does for a bind mount's missing host directory
            for local_dir in self.mounts(name).values():
                if not local_dir.suffix:
                    local_dir.mkdir(parents=True, exist_ok=True)

    def port(self, service: str, port: int) -> int:
        return self.ports[(service, port)]

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def localize(self, text: str, own: str) -> str:
        """`text` (a command, a variable, a health check of service `own`) with this machine's
        addresses and paths."""
        for (name, port), local in self.ports.items():
            host = re.escape(name)
            text = re.sub(rf"--([\w-]+)-ip {host} --\1-port {port}\b",
                          lambda m: f"--{m[1]}-ip 127.0.0.1 --{m[1]}-port {local}", text)
            text = re.sub(rf"(?<![\w.-]){host}:{port}\b", f"127.0.0.1:{local}", text)
            if name == own:
                text = re.sub(rf"(--[\w-]*port) {port}\b", lambda m: f"{m[1]} {local}", text)
                text = re.sub(rf"\b127\.0\.0\.1:{port}\b", f"127.0.0.1:{local}", text)
        text = text.replace("0.0.0.0", "127.0.0.1")
        for container, local_dir in self.mounts(own).items():
            text = re.sub(rf"(?<![\w/.-]){re.escape(container)}(?=/|\s|'|$)", str(local_dir), text)
        return text

    def mounts(self, name: str) -> dict[str, Path]:
        """Container path -> this machine's copy of the repository directory bind-mounted there.
        A host path outside the repository (/dev/shm/vime) is this host's own: left as it is."""
        out = {}
        for volume in self.services[name].get("volumes", []):
            host, container = volume.split(":")[:2]
            local = (REPO / host).resolve()
            if host.startswith((".", "/")) and local.is_relative_to(REPO):
                out[container] = self.root / local.relative_to(REPO)
        return out

    def environment(self, name: str) -> dict[str, str]:
        given = {**self.services[name]["environment"]}
        given.update({k: v for k, v in self.variables.items() if k in given})
        bin_dir = str(Path(sys.executable).parent)  # the venv's: vime, torchrun, vllm-router, temporal, hf
        return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                **{k: self.localize(v, name) for k, v in given.items()}}

    def adopt(self, name: str, process: subprocess.Popen) -> None:
        """A stand-in the test started, stopped with the rest."""
        self.processes[name] = process

    def start(self, name: str) -> subprocess.Popen:
        argv = shlex.split(self.localize(self.services[name]["command"], name))
        self.processes[name] = spawn(argv, self.log(name), env=self.environment(name), run_dir=self.root)
        return self.processes[name]

    def up(self) -> None:
        """Start every service not behind a profile, in dependency order, as `docker compose up`."""
        for name in self.order():
            if name in self.stand_ins or self.services[name].get("profiles"):
                continue
            self.wait_for_dependencies(name)
            self.start(name)

    def run(self, name: str, timeout: float = 300.0) -> None:
        """A one-shot service, as `docker compose run --rm NAME`: it must exit 0."""
        self.wait_for_dependencies(name)
        self.start(name)
        self.wait_completed(name, timeout)

    def order(self) -> list[str]:
        """The services in an order that starts each after what it depends on (the file's order
        where it does not matter)."""
        done: list[str] = []
        while len(done) < len(self.services):
            name = next(n for n, s in self.services.items() if n not in done and set(s["depends_on"]) <= set(done))
            done.append(name)
        return done

    def wait_for_dependencies(self, name: str) -> None:
        for dependency, how in self.services[name]["depends_on"].items():
            if how["condition"] == "service_healthy":
                self.wait_healthy(dependency)
            elif how["condition"] == "service_completed_successfully" and dependency not in self.stand_ins:
                self.wait_completed(dependency)

    def wait_healthy(self, name: str, timeout: float = 600.0) -> None:
        """Until the service's own health check (localized) passes."""
        stand_in = self.stand_ins.get(name)
        if name in self.ready or (stand_in and not stand_in.health_check_applies):
            return
        test = self.services[name]["healthcheck"]["test"]
        argv = test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]]
        argv = [self.localize(word, name) for word in argv]
        self.wait(lambda: subprocess.run(argv, capture_output=True, env=self.environment(name)).returncode == 0,
                  timeout, f"{name} healthy ({shlex.join(argv)})")
        self.ready.add(name)

    def wait_completed(self, name: str, timeout: float = 300.0) -> None:
        process = self.processes[name]
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"one-shot {name} still runs after {timeout:.0f} s:\n{log_tail(self.log(name))}")
        assert code == 0, f"one-shot {name} exited with {code}:\n{log_tail(self.log(name))}"

    def wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `done()`; fails at once, with its log, when a long-running service exits."""
        deadline = time.monotonic() + timeout
        while not done():
            for name, process in self.processes.items():
                one_shot = self.services[name].get("restart") in ("no", "on-failure")
                if process.poll() is not None and not one_shot:
                    raise AssertionError(f"{name} exited ({process.returncode}) while waiting for {what}:\n"
                                         f"{log_tail(self.log(name), 40)}")
            assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
            time.sleep(1.0)

    def stop(self) -> None:
        stop_process_groups(list(self.processes.values()))


def declared_ports(service: dict) -> list[int]:
    """The container ports a service listens on: its `ports` targets and its `expose` list."""
    ports = [int(str(p.get("target") if isinstance(p, dict) else p).split(":")[-1]) for p in service.get("ports", [])]
    return ports + [int(p) for p in service.get("expose", [])]
