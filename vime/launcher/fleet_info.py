"""`<fleet-dir>/fleet.json`: where a shared fleet (`vime fleet`) serves, for `vime train --fleet`.

The file exists exactly while the fleet serves: `vime fleet` writes it whole (rename) once every
part answers and removes it when it stops. A fleet killed with SIGKILL leaves it behind; its pid
is then gone, and `read_fleet` says the fleet is not running. Standard library only: `vime train
--fleet` reads it among its checks, before any heavy import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from vime.errors import ConfigError

FLEET_FILE = "fleet.json"
CONNECTION_FLAGS = ("--temporal-address", "--temporal-namespace", "--store-url", "--vllm-router-ip",
                    "--vllm-router-port", "--vllm-server-urls")  # what the fleet's fleet.json sets


@dataclass(frozen=True)
class FleetInfo:
    """A live fleet's addresses and the base model every run on it trains an adapter of."""

    temporal_address: str
    temporal_namespace: str
    store_url: str
    server_urls: list[str]
    router_ip: str
    router_port: int
    base_model: str
    max_lora_rank: int
    pid: int

    def connection_flags(self) -> list[str]:
        """The flags a run needs to use the fleet's services (what `vime config` JSON would carry)."""
        return ["--temporal-address", self.temporal_address, "--temporal-namespace", self.temporal_namespace,
                "--store-url", self.store_url, "--vllm-router-ip", self.router_ip,
                "--vllm-router-port", str(self.router_port), "--vllm-server-urls", *self.server_urls]


def fleet_path(fleet_dir: str | Path) -> Path:
    return Path(fleet_dir) / FLEET_FILE


def write_fleet(fleet_dir: str | Path, info: FleetInfo) -> None:
    path = fleet_path(fleet_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(info), indent=1))
    os.replace(tmp, path)


def remove_fleet(fleet_dir: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        fleet_path(fleet_dir).unlink()


def start_hint(fleet_dir: str | Path) -> str:
    return f"start one with `vime fleet --fleet-dir {fleet_dir} --hf-checkpoint MODEL`"


def read_fleet(fleet_dir: str | Path) -> FleetInfo:
    """The live fleet of `fleet_dir`, or one `ConfigError` naming the directory and what to start."""
    path = fleet_path(fleet_dir)
    try:
        info = FleetInfo(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise ConfigError(f"--fleet {fleet_dir}: no fleet serves there (no {FLEET_FILE}); "
                          f"{start_hint(fleet_dir)}") from None
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"--fleet {fleet_dir}: {path} is unreadable ({e}); {start_hint(fleet_dir)}") from None
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        raise ConfigError(f"--fleet {fleet_dir}: its fleet (pid {info.pid}) is not running any more; "
                          f"{start_hint(fleet_dir)}") from None
    except PermissionError:
        pass  # alive, another user's
    return info


def _without_fleet_flag(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--fleet":
            skip = True
        elif not a.startswith("--fleet="):
            out.append(a)
    return out


def fleet_run_argv(args, argv: list[str], info: FleetInfo) -> list[str]:
    """The run's command line on the fleet: the user's flags without `--fleet`, the fleet's base
    model as `--hf-checkpoint` when none is given, and the fleet's connection flags, so the run's
    workflow input is what `vime config` of these flags prints. Refuses, in one line, a run the
    fleet cannot serve without disturbing the others."""
    fleet_dir = args.fleet
    if not args.lora_rank or args.lora_rank <= 0:
        raise ConfigError(f"--fleet {fleet_dir} needs --lora-rank R (1..{info.max_lora_rank}): a full fine-tune "
                          "would change the base model every other run on the fleet samples from")
    if args.lora_rank > info.max_lora_rank:
        raise ConfigError(f"--lora-rank {args.lora_rank}: the fleet in {fleet_dir} serves adapters up to rank "
                          f"{info.max_lora_rank}; pass a smaller rank, or start the fleet with --lora-max-rank "
                          f"{args.lora_rank} or more")
    given = args.hf_checkpoint
    if given and os.path.realpath(given) != os.path.realpath(info.base_model):
        raise ConfigError(f"--hf-checkpoint {given}: the fleet in {fleet_dir} serves {info.base_model}, and every "
                          "run on it trains an adapter of that model; drop --hf-checkpoint or use another fleet")
    from vime.engine.weight_sync.lora_serving import adapter_sync  # no torch

    if not adapter_sync(args):
        raise ConfigError(f"--fleet {fleet_dir}: this run would sync merged weights into the fleet's shared server "
                          "(only the default rollout path, --rollout-env groups without --rollout-function-path, "
                          "--eval-function-path or --fully-async, syncs its adapter alone); run it with its own "
                          "servers (vime train without --fleet)")
    served = [a.split("=", 1)[0] for a in argv if a.startswith(("--vllm-", "--router-"))]
    if served:
        raise ConfigError(f"{served[0]}: the fleet in "
                          f"{fleet_dir} serves every run from one server, started with the fleet's flags; drop the "
                          "run's --vllm-*/--router-*/--vllm-config flags (give them to `vime fleet`)")
    own = [flag for flag in CONNECTION_FLAGS if any(a == flag or a.startswith(flag + "=") for a in argv)]
    if own:
        raise ConfigError(f"{own[0]}: --fleet {fleet_dir} sets the run's connections from its {FLEET_FILE}; "
                          f"drop {own[0]}")
    if os.path.realpath(args.run_dir) == os.path.realpath(fleet_dir):
        raise ConfigError(f"--run-dir {args.run_dir} is the fleet's own directory; pass another --run-dir "
                          "(default: runs/<run-id>)")
    if not any(a.split("=", 1)[0] in ("--run-id", "--run-dir") for a in argv):
        raise ConfigError(f"--fleet {fleet_dir} needs --run-id NAME: the same command then re-attaches to the run")
    base = [] if given else ["--hf-checkpoint", info.base_model]
    return [*_without_fleet_flag(argv), *base, *info.connection_flags()]


def checked_fleet_args(argv: list[str]):
    """`vime train --fleet DIR ...`'s flags, checked as `vime train` checks them (`checked_args`),
    on the fleet's connections."""
    from vime.config.args import parse_args
    from vime.config.preflight import checked_args

    args = parse_args(argv, vllm_flags=False)
    return checked_args(fleet_run_argv(args, argv, read_fleet(args.fleet))), args.fleet


def wants_fleet(argv: list[str]) -> bool:
    return any(a == "--fleet" or a.startswith("--fleet=") for a in argv)


def process_started_at() -> float:
    """When this process started (epoch seconds): launch → first step counts the command's own
    imports and checks too. `time.time()` where /proc cannot say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
