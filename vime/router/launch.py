"""Start an existing router (vllm-router) in front of several vLLM servers.

vime does not route requests itself: `vllm-router` does (session affinity on `X-Session-ID`
with `--router-policy consistent_hash`, prefix-cache-aware routing by default). The user's
`--router-*` flags arrive ready in `args.router_args`.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from vime.engine.server import free_port
from vime.errors import ServiceError
from vime.procs import log_tail, spawn, stop_process_group


def router_binary() -> str:
    candidate = Path(sys.executable).parent / "vllm-router"
    found = str(candidate) if candidate.exists() else shutil.which("vllm-router")
    if not found:
        raise ServiceError("more than one vLLM server needs a router: `pip install vllm-router` "
                           "(or start one yourself and pass --vllm-router-ip/--vllm-router-port)")
    return found


class Router:
    """A `vllm-router` process over `worker_urls`; `url` is what generate functions call."""

    def __init__(self, worker_urls: Sequence[str], router_args: Sequence[str] = (), *, log_path: Path,
                 host: str = "127.0.0.1", port: int | None = None, run_dir: Path | None = None,
                 prefill_urls: Sequence[str] = (), decode_urls: Sequence[str] = ()) -> None:
        """`prefill_urls` and `decode_urls` (both, instead of `worker_urls`) start the router in
        its PD mode: each request is prefilled on a prefill server, whose KV cache vLLM's connector
        hands to a decode server that generates."""
        self.worker_urls = list(worker_urls)
        self.prefill_urls, self.decode_urls = list(prefill_urls), list(decode_urls)
        self.router_args = list(router_args)
        self.host, self.port = host, port or free_port(host)
        self.log_path = log_path
        self.run_dir = run_dir
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        metrics = [] if any(a.startswith("--prometheus-port") for a in self.router_args) else [
            "--prometheus-port", str(free_port(self.host))]  # its default 29000 collides between runs
        if self.prefill_urls:
            workers = ["--vllm-pd-disaggregation"]
            for url in self.prefill_urls:
                workers += ["--prefill", url]
            for url in self.decode_urls:
                workers += ["--decode", url]
        else:
            workers = ["--worker-urls", *self.worker_urls]
        return [router_binary(), "--host", self.host, "--port", str(self.port), *workers, *metrics,
                *self.router_args]

    def __enter__(self) -> Router:
        self.process = spawn(self.command(), self.log_path, run_dir=self.run_dir)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(f"vllm-router exited with code {self.process.returncode}; last lines of "
                                   f"{self.log_path}:\n{log_tail(self.log_path, 20)}")
            with contextlib.suppress(urllib.error.URLError, OSError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            time.sleep(0.3)
        self.__exit__()
        raise ServiceError(f"vllm-router did not answer {self.url}/health within 60 s; see {self.log_path}")

    def __exit__(self, *exc: object) -> None:
        proc, self.process = self.process, None
        stop_process_group(proc, 10)
