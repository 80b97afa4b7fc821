"""The coding agent's tools: Anthropic Messages API definitions and their executors on a `Sandbox`.

Who is to blame decides how a failure travels. The model misusing a tool (a missing file, an
`old` text that is not unique, bad arguments, a command past its timeout) is task data: it
comes back to the model as a `tool_result` with `is_error: true` and the loop goes on. The
sandbox breaking (`SandboxError`) is infrastructure: it is raised, and the rollout is marked
as an infra failure instead of being scored.

Descriptions are short on purpose: every tool definition is rendered into every prompt, and a
small model's context is small.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.sandbox.base import CommandTimeout, Sandbox
from vime.errors import ConfigError


def _tool(name: str, description: str, properties: dict[str, dict], required: list[str]) -> dict:
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "properties": properties, "required": required}}


_STR = {"type": "string"}

TOOLS: dict[str, dict] = {t["name"]: t for t in (
    _tool("read_file", "Read a file.", {"path": _STR}, ["path"]),
    _tool("write_file", "Create or overwrite a file.", {"path": _STR, "content": _STR}, ["path", "content"]),
    _tool("edit_file", "Replace the one occurrence of old with new in a file.",
          {"path": _STR, "old": _STR, "new": _STR}, ["path", "old", "new"]),
    _tool("run", "Run a bash command in the repository; timeout in seconds.",
          {"command": _STR, "timeout": {"type": "number"}}, ["command"]),
    _tool("finish", "End the task with a summary of what you did.", {"summary": _STR}, ["summary"]),
    _tool("subagent", "Give a sub-task to a helper agent; returns its summary.", {"task": _STR}, ["task"]),
)}
"""Every tool by name. The main chain gets all of them; a subagent all but `subagent`."""

MAIN_TOOLS = tuple(TOOLS)
SUBAGENT_TOOLS = tuple(name for name in TOOLS if name != "subagent")

_TYPES = {"string": str, "number": (int, float)}


def tool_definitions(names: tuple[str, ...] | list[str] = MAIN_TOOLS) -> list[dict]:
    """The Messages API `tools` list for `names`, in that order."""
    return [TOOLS[name] for name in names]


@dataclass
class ToolResult:
    """What a tool call answers; `is_error` marks the model's misuse, shown to it as such."""

    content: str
    is_error: bool = False

    def block(self, tool_use_id: str) -> dict:
        """The `tool_result` content block answering `tool_use_id`."""
        block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": self.content}
        if self.is_error:
            block["is_error"] = True
        return block


class ToolError(Exception):
    """The model used a tool wrongly; its message is what the model is told."""


@dataclass
class ToolLimits:
    """`output_chars`: the most characters of a file or of command output a result shows;
    `default_timeout` / `max_timeout`: seconds a `run` gets when it names none / at most."""

    output_chars: int = 8000
    default_timeout: float = 60.0
    max_timeout: float = 600.0


def check_arguments(name: str, arguments: Any, allowed: tuple[str, ...] | list[str] = MAIN_TOOLS) -> dict:
    """`arguments` checked against `name`'s schema (known tool, required keys, types);
    `ToolError` says what is wrong, in words the model can act on."""
    if name not in allowed:
        raise ToolError(f"unknown tool {name!r}; the tools are {', '.join(allowed)}")
    if not isinstance(arguments, dict):
        raise ToolError(f"{name}: arguments must be an object, got {type(arguments).__name__}")
    schema = TOOLS[name]["input_schema"]
    missing = [key for key in schema["required"] if key not in arguments]
    if missing:
        raise ToolError(f"{name}: missing argument(s) {', '.join(missing)}")
    for key, value in arguments.items():
        spec = schema["properties"].get(key)
        if spec is None:
            raise ToolError(f"{name}: unknown argument {key!r}; it takes {', '.join(schema['properties'])}")
        if not isinstance(value, _TYPES[spec["type"]]) or isinstance(value, bool):
            raise ToolError(f"{name}: argument {key!r} must be a {spec['type']}, got {type(value).__name__}")
    return arguments


def truncate(text: str, budget: int) -> str:
    """`text` within `budget` characters: its head and tail, with what was cut said in between
    (the end of a test run's output matters as much as its start)."""
    if len(text) <= budget:
        return text
    marker = f"\n... [{len(text) - budget} characters cut] ...\n"
    keep = max(budget - len(marker), 0)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head):]


async def _read_text(sandbox: Sandbox, path: str) -> str:
    try:
        data = await sandbox.read_file(path)
    except FileNotFoundError:
        raise ToolError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ToolError(f"{path} is a directory; use run with ls to list it") from None
    except (NotADirectoryError, PermissionError, ConfigError) as e:
        raise ToolError(f"cannot read {path}: {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not UTF-8 text ({len(data)} bytes)") from None


async def _write_text(sandbox: Sandbox, path: str, text: str) -> None:
    try:
        await sandbox.write_file(path, text)
    except (IsADirectoryError, NotADirectoryError, PermissionError, ConfigError) as e:
        raise ToolError(f"cannot write {path}: {e}") from None


async def read_file(sandbox: Sandbox, limits: ToolLimits, path: str) -> str:
    return truncate(await _read_text(sandbox, path), limits.output_chars)


async def write_file(sandbox: Sandbox, limits: ToolLimits, path: str, content: str) -> str:
    await _write_text(sandbox, path, content)
    return f"wrote {len(content.encode())} bytes to {path}"


async def edit_file(sandbox: Sandbox, limits: ToolLimits, path: str, old: str, new: str) -> str:
    """Replace `old` with `new` where `old` occurs exactly once: an ambiguous edit is refused
    rather than guessed, so the model learns to quote enough context."""
    if not old:
        raise ToolError("edit_file: old must not be empty; use write_file to create a file")
    text = await _read_text(sandbox, path)
    count = text.count(old)
    if count == 0:
        raise ToolError(f"old text not found in {path}; read the file and copy the text exactly")
    if count > 1:
        raise ToolError(f"old text occurs {count} times in {path}; include more lines to make it unique")
    await _write_text(sandbox, path, text.replace(old, new, 1))
    return f"edited {path}"


async def run(sandbox: Sandbox, limits: ToolLimits, command: str, timeout: float | None = None) -> str:
    """`bash -c command` in the sandbox; the result shows the exit code, then stdout, then stderr."""
    wall = limits.default_timeout if timeout is None else min(max(float(timeout), 0.1), limits.max_timeout)
    try:
        rc, out, err = await sandbox.exec(command, timeout=wall)
    except CommandTimeout as e:
        partial = truncate((e.stdout + e.stderr).strip(), limits.output_chars // 2)
        raise ToolError(f"command timed out after {wall:g} s and was killed" +
                        (f"; its output so far:\n{partial}" if partial else "")) from None
    text = f"exit code {rc}\n{out}"
    if err:
        text += ("" if not out or out.endswith("\n") else "\n") + f"[stderr]\n{err}"
    return truncate(text, limits.output_chars)


SANDBOX_TOOLS = {"read_file": read_file, "write_file": write_file, "edit_file": edit_file, "run": run}
"""The tools that act on the sandbox alone; `finish` and `subagent` act on the agent's loop."""


async def execute_sandbox_tool(sandbox: Sandbox, limits: ToolLimits, name: str, arguments: dict) -> ToolResult:
    """Run a checked sandbox-tool call. Tool errors become an error result; `SandboxError`
    and anything else unexpected propagate."""
    try:
        return ToolResult(await SANDBOX_TOOLS[name](sandbox, limits, **arguments))
    except ToolError as e:
        return ToolResult(str(e), is_error=True)
