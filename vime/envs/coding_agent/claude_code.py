"""Run the Claude Code CLI, unmodified, inside a sandbox against a vime adapter.

The CLI is the agent; the `AnthropicAdapter` records what the policy sampled for it. This
module only starts the CLI the right way:

- The sandbox must be created with network access (`BwrapSandbox(repo, network=True)`):
  the CLI reaches the adapter over HTTP on the host's 127.0.0.1, and bubblewrap's default
  (every namespace unshared) gives the sandbox a loopback of its own where nothing listens.
  `--share-net` keeps the host's network namespace; nothing else is shared.
- The binary runs from the host, read-only: a bubblewrap sandbox sees only the host's system
  directories, so `claude_code_binds()` names the `node_modules` tree holding the CLI
  (scripts/setup.sh installs it under the repository) for `ro_binds`, visible at the same path,
  also under `/tmp` (CI clones there; binds go over the sandbox's private `/tmp`). Claude Code
  2.x ships a native executable; older ones are a node script. Either runs as uid 65534
  provided the path is world-readable and executable.
- `HOME=/tmp` (the sandbox's private, writable tmpfs) holds the CLI's config; telemetry,
  auto-update and error reporting are off, so the only traffic is to the adapter.
- The command runs as the sandbox's unprivileged user, so `--dangerously-skip-permissions`
  is allowed (Claude Code refuses it as root) and lets the CLI edit `/workspace` and run
  commands without asking.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from vime.sandbox.base import WORKDIR, CommandTimeout, Sandbox

ROOT = Path(__file__).resolve().parents[3]

CLAUDE_ENV = {
    "HOME": "/tmp",
    "CLAUDE_CONFIG_DIR": "/tmp/.claude",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}
"""What every run sets besides the adapter's URL and the session id."""


def find_claude_code() -> str | None:
    """`$VIME_CLAUDE_BIN`, the repository's `node_modules/.bin/claude`, or `claude` on PATH."""
    local = ROOT / "node_modules" / ".bin" / "claude"
    return os.environ.get("VIME_CLAUDE_BIN") or (str(local) if local.exists() else shutil.which("claude"))


def _needs_node(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(128)
    return head.startswith(b"#!") and b"node" in head


def claude_code_available() -> bool:
    """Whether the CLI exists, can be run by anyone (the sandbox's uid 65534), and has node
    if it is a node script."""
    path = find_claude_code()
    if path is None:
        return False
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return False
    if not (mode & stat.S_IXOTH and mode & stat.S_IROTH):
        return False
    return not _needs_node(real) or shutil.which("node") is not None


def claude_code_binds(binary: str | None = None) -> list[str]:
    """Host paths a bubblewrap sandbox must bind (`BwrapSandbox(ro_binds=...)`) for the CLI to
    be visible inside it: the `node_modules` tree that holds it (or its directory). A sandbox sees
    only the host's system directories (/usr, /etc, ...), so a CLI anywhere else needs these."""
    binary = binary or find_claude_code()
    if binary is None:
        return []
    path = Path(binary).absolute()
    holder = next((p for p in path.parents if p.name == "node_modules"), None)
    return [str(holder or path.parent), str(Path(os.path.realpath(path)).parent)]


@dataclass
class ClaudeCodeResult:
    """How the CLI ended: `rc` (None when it ran past the timeout and was killed), its final
    JSON result (`--output-format json`; None when it printed none) and the output's tails."""

    rc: int | None
    result: dict | None
    stdout_tail: str
    stderr_tail: str
    wall_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """The CLI exited 0 and reported no error of its own."""
        return self.rc == 0 and self.result is not None and self.result.get("is_error") is False


def _last_json(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.strip().startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


async def run_claude_code(sandbox: Sandbox, base_url: str, session_id: str, prompt: str, *,
                          timeout: float = 1800.0, max_turns: int | None = None, model: str | None = None,
                          extra_args: list[str] | None = None, claude_bin: str | None = None,
                          tail_chars: int = 4000) -> ClaudeCodeResult:
    """`claude -p prompt --output-format json` in `sandbox` (cwd /workspace), talking to the
    adapter at `base_url` as `session_id` (its API key). The session must be open on the
    adapter; the caller finishes it and reads the segments afterwards."""
    binary = claude_bin or find_claude_code()
    if binary is None:
        raise FileNotFoundError("Claude Code is not installed: run scripts/setup.sh "
                                "(npm install @anthropic-ai/claude-code) or set VIME_CLAUDE_BIN")
    if not (await sandbox.exec(["test", "-x", binary])).ok:
        raise FileNotFoundError(f"Claude Code at {binary} is not visible inside sandbox {sandbox.sandbox_id}: "
                                "bind it in (BwrapSandbox(ro_binds=claude_code_binds())) or install it under /usr")
    argv = [binary, "-p", prompt, "--output-format", "json", "--dangerously-skip-permissions"]
    if max_turns is not None:
        argv += ["--max-turns", str(max_turns)]
    if model is not None:
        argv += ["--model", model]
    argv += list(extra_args or [])
    env = {**CLAUDE_ENV, "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": session_id}
    t0 = time.monotonic()
    try:
        rc, out, err = await sandbox.exec(argv, env=env, timeout=timeout, cwd=WORKDIR)
    except CommandTimeout as e:
        return ClaudeCodeResult(None, _last_json(e.stdout), e.stdout[-tail_chars:], e.stderr[-tail_chars:],
                                time.monotonic() - t0, timed_out=True)
    return ClaudeCodeResult(rc, _last_json(out), out[-tail_chars:], err[-tail_chars:], time.monotonic() - t0)
