"""Run a program in a fresh sandbox and say how it went: `passed`, `failed`, `error` or `timeout`,
with a one-line reason. The building block of a test-graded reward:

    result = await run_program(solution + "\\n\\n" + tests, timeout=10)
    sample.metadata["grade"] = result.grade()      # {outcome, reason}: the UI and `vime samples` show it
    return 1.0 if result.passed else 0.0

The outcomes, for a Python program (`code` a string, run as `python3 main.py` in /workspace):

- `passed`: it exited 0;
- `failed`: it ran and an assertion failed (its last error line is an `AssertionError`, or a
  test runner's failure), i.e. the tests said no;
- `error`: it exited non-zero for any other reason (a `SyntaxError`, a `NameError`, a
  `MemoryError`, a crash): the program is broken before any test could judge it;
- `timeout`: the wall clock (`timeout`) or the CPU bound stopped it.

A command (`code` a list of strings) is `passed` on exit 0 and `failed` otherwise. Every one of
these is the model's outcome, an ordinary low reward; only a sandbox that cannot start raises
(`SandboxError`, infrastructure: the rollout is retried or kept out of advantage statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.sandbox.backends import make_sandbox
from vime.sandbox.base import CommandTimeout

OUTCOMES = ("passed", "failed", "error", "timeout")
PYTHON = "/usr/bin/python3"
MAIN = "main.py"
FAILED_MARKERS = ("AssertionError", "FAILED", "Failed:")
"""An error line holding one of these is a test that said no, not a broken program."""

DEFAULT_LIMITS = dict(network=False, memory_bytes=512 << 20, max_processes=32, tmp_bytes=16 << 20,
                      shm_bytes=16 << 20, workspace_bytes=32 << 20, max_output_bytes=1 << 16)
"""The bubblewrap limits `run_program` uses unless given others (see docs/environments.md)."""


@dataclass(frozen=True)
class ProgramResult:
    """How a program went: `outcome` (one of OUTCOMES), `reason` (one line), and its output."""

    outcome: str
    reason: str
    rc: int
    stdout: str = ""
    stderr: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    def grade(self) -> dict[str, str]:
        """The failure-class record a reward puts in `sample.metadata["grade"]`."""
        return {"outcome": self.outcome, "reason": self.reason}


async def run_program(code: str | list[str], *, files: dict[str, str | bytes] | None = None,
                      timeout: float = 10.0, backend: str = "bwrap", env: dict[str, str] | None = None,
                      **sandbox_kwargs: Any) -> ProgramResult:
    """Run `code` (Python source, or a command's argv) in a fresh sandbox of `backend` holding
    `files` (path under /workspace -> content), at most `timeout` seconds; see the module
    docstring for the outcomes. `sandbox_kwargs` go to the backend (bwrap: `memory_bytes`,
    `tmp_bytes`, ...; the bwrap defaults are `DEFAULT_LIMITS`)."""
    if backend == "bwrap":
        sandbox_kwargs = {**DEFAULT_LIMITS, "cpu_seconds": int(timeout) + 2, "wall_timeout": timeout,
                          **sandbox_kwargs}
    argv = [PYTHON, MAIN] if isinstance(code, str) else list(code)
    async with make_sandbox(backend, **sandbox_kwargs) as sandbox:
        for path, data in ({MAIN: code} if isinstance(code, str) else {}).items() | (files or {}).items():
            await sandbox.write_file(path, data)
        try:
            result = await sandbox.exec(argv, timeout=timeout,
                                        env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", **(env or {})})
        except CommandTimeout as e:
            return ProgramResult("timeout", f"timed out after {timeout:g} s", -9, e.stdout, e.stderr)
    return classify(result.rc, result.stdout, result.stderr, python=isinstance(code, str),
                    stopped_by=getattr(result, "stopped_by", None))


def classify(rc: int, stdout: str, stderr: str, *, python: bool = True, stopped_by: str | None = None,
             ) -> ProgramResult:
    """The outcome of a finished program from its exit status and output (see the module docstring)."""
    if stopped_by == "cpu_seconds":
        return ProgramResult("timeout", "stopped: past its CPU time", rc, stdout, stderr)
    if rc == 0:
        return ProgramResult("passed", "exit 0", rc, stdout, stderr)
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    reason = last[:300] or f"exit code {rc}"
    if not python or any(marker in last for marker in FAILED_MARKERS):
        return ProgramResult("failed", reason, rc, stdout, stderr)
    return ProgramResult("error", reason, rc, stdout, stderr)
