"""The tool: run the model's Python in a sandbox and turn whatever happens into an observation.

Each code block runs as its own `python3 -I -c CODE` in a bubblewrap sandbox (through
`vime.sandbox`, so another backend is a flag away): no network, a wall-clock bound
(`--tool-timeout`), an address-space bound (`--tool-memory-mb`), a bounded private `/tmp`,
`/dev/shm` and `/workspace`, a process count bound, and output kept to its head. Blocks do not share state (no kernel between
them): a block that needs a value prints it.

What the code does is the model's business, so every outcome is an observation for the model,
never an exception for the rollout: a non-zero exit shows the error's last line, a timeout
says it was stopped, a `MemoryError` is the interpreter's own. Only a sandbox that fails to
start or vanishes (`SandboxError`, infrastructure) propagates, so the rollout is retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.envs.tool_use.task import observation
from vime.sandbox import CommandTimeout, make_sandbox

PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class ToolLimits:
    """What one code block may use. `cpu_seconds` sits just above the wall bound so a busy loop
    is stopped by the clock (an observation), not by SIGXCPU."""

    timeout: float = 5.0
    memory_mb: int = 256
    tmp_mb: int = 16
    shm_mb: int = 16
    workspace_mb: int = 16
    max_processes: int = 16
    max_output_bytes: int = 1 << 16

    def sandbox_kwargs(self) -> dict[str, Any]:
        return dict(network=False, cpu_seconds=int(self.timeout) + 2, memory_bytes=self.memory_mb << 20,
                    max_processes=self.max_processes, wall_timeout=self.timeout,
                    tmp_bytes=self.tmp_mb << 20, shm_bytes=self.shm_mb << 20,
                    workspace_bytes=self.workspace_mb << 20, max_output_bytes=self.max_output_bytes)


@dataclass(frozen=True)
class CodeRun:
    """One block's outcome: what it printed, its exit status, and whether the clock stopped it."""

    stdout: str
    stderr: str
    rc: int
    timed_out: bool

    def observation(self, limits: ToolLimits) -> str:
        return observation(self.stdout, self.stderr, self.rc, limits.timeout if self.timed_out else None)


def tool_sandbox(backend: str, limits: ToolLimits):
    """A not-yet-booted sandbox for code blocks (`async with` boots and destroys it)."""
    return make_sandbox(backend, **(limits.sandbox_kwargs() if backend == "bwrap" else {}))


async def run_code(sandbox: Any, code: str, limits: ToolLimits) -> CodeRun:
    """Run `code` in the booted `sandbox` under `limits`; never raises for what the code did."""
    try:
        rc, out, err = await sandbox.exec([PYTHON, "-I", "-c", code], timeout=limits.timeout)
    except CommandTimeout as e:
        return CodeRun(e.stdout, e.stderr, -9, timed_out=True)
    return CodeRun(out, err, rc, timed_out=False)
