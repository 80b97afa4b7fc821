"""`vime train --fleet DIR`: a run on a shared fleet, which starts nothing of its own.

The fleet (`vime fleet`) already serves Temporal, the store, a LoRA-enabled vLLM server and
long-lived workers, so this launch is `vime train` with none of the starting: it checks the run
as `vime train` does, starts (or attaches to) `train-<run>` with the run's flags and the fleet's
connections, and follows it. The run belongs to the fleet, not to this process: Ctrl-C detaches
(the run trains on), the same command re-attaches, `vime cancel` stops it. What the fleet's
servers hold (other runs' adapters) and its workers' work are never touched from here.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from vime.errors import ConfigError, ServiceError
from vime.launcher.fleet_info import process_started_at, read_fleet
from vime.launcher.launch import Launch, run_to_end


class FleetLaunch(Launch):
    """A launch on a fleet: no workers, no servers; the fleet's are the run's."""

    owns_services = False

    def __init__(self, args, fleet_dir: str) -> None:
        super().__init__(args, checked=True)
        self.fleet_dir = fleet_dir
        self.started_at = process_started_at()

    def run_dir_lock(self) -> contextlib.AbstractContextManager:
        """None: the run belongs to the fleet, whose workers check its flags when it starts (and
        refuse a run directory a process holds); a second `vime train --fleet` of the run only
        follows it too, as `vime status --follow` would, and this launch left nothing running."""
        self.run_dir.mkdir(parents=True, exist_ok=True)  # metrics, adapters, launch.json
        return contextlib.nullcontext(SimpleNamespace(leftovers=[]))

    def workers(self, temporal_address: str, fleet) -> list:
        return []

    def services(self, temporal, fleet, handle) -> list:
        """The fleet itself: once it stops, its Temporal and servers are gone, and following the
        run would only retry a dead address; the run waits in the fleet's files instead."""
        return [*super().services(temporal, fleet, handle), _FleetAlive(self.fleet_dir, self.args.run_id)]

    def stopped_line(self, resume_command: str) -> str:
        p = self.follower.progress if self.follower else {}
        where = f"at step {p['step']}/{self.args.num_rollout}" if "step" in p else "before its first step"
        return (f"[vime] detached from run {self.args.run_id} {where}; it goes on training on the fleet in "
                f"{self.fleet_dir}. Re-attach with: {resume_command}; cancel it with: vime cancel "
                f"{self.args.run_id} --temporal-address {self.args.temporal_address} --store-url {self.args.store_url}")


def main(args, fleet_dir: str) -> int:
    return run_to_end(args, launch=FleetLaunch(args, fleet_dir))[0]


class _FleetAlive:
    """A follower's service check: the fleet this run is on still serves (its `fleet.json`, its pid)."""

    def __init__(self, fleet_dir: str, run_id: str) -> None:
        self.fleet_dir, self.run_id = fleet_dir, run_id

    async def check(self) -> None:
        try:
            read_fleet(self.fleet_dir)
        except ConfigError:
            raise ServiceError(f"the fleet in {self.fleet_dir} stopped; run {self.run_id} waits in its files: start "
                               f"the fleet again (vime fleet --fleet-dir {self.fleet_dir} ...) and run this command "
                               "again to continue it") from None
