"""`CodingAgent`: a compact tool-use loop on the Anthropic Messages API, built to be trained.

The agent talks to a protocol adapter (`AnthropicAdapter`) through the official `anthropic`
SDK, so every turn it takes is recorded as token ids the policy sampled. Three choices make
its trajectories trainable and its rollouts durable:

- Chains. The main agent and each subagent are separate conversations ("chains": `"main"`,
  `"sub-1"`, `"sub-2"`, ...), each sent as its own adapter session. The agent asks the
  caller's `open_chain(name) -> session id` for each, so the caller owns the sessions and can
  turn each chain's segments into samples that share one `rollout_id`.
- Steps and checkpoints. A step is one model response plus the execution of its tool calls
  (a whole subagent run is part of the step of the call that started it). After every step
  `on_step(state)` is awaited; `AgentState` is plain JSON (`to_dict` / `from_dict`), and
  `run` on a restored state continues from that step. The caller restores the sandbox's
  files and the adapter session on its side.
- Compaction. When a response's `usage.input_tokens` exceeds `compact_at_tokens`, the model
  is asked (a sampled turn in the same chain, so it is trained too) to summarise its
  progress, and the chain's history becomes [the task, the summary]. The adapter then starts
  a new segment: the old one ends with the summary turn.

Stop reasons: "finish" (the model called finish), "max_turns", "no_tool_call" (a reply with
no tool call ends the chain), "max_tokens" (such a reply was cut at max_tokens), "rejected"
(the adapter refused the request, e.g. the context is full; `error` says why). A failing
sandbox or adapter (`SandboxError`, `ServiceError`) is raised: that is infra, not a score.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import anthropic

from vime.agent.adapters.core import Segment
from vime.envs.coding_agent.tools import (MAIN_TOOLS, SUBAGENT_TOOLS, ToolError, ToolLimits, ToolResult,
                                     check_arguments, execute_sandbox_tool, tool_definitions)
from vime.sandbox.base import Sandbox
from vime.errors import ServiceError

DEFAULT_SYSTEM_PROMPT = ("You are a coding agent. The repository is in /workspace. Use the tools to read code, "
                         "edit it and run tests; call finish when the task is done.")
COMPACT_PROMPT = ("Your context is nearly full. Summarize your progress for yourself: what you found, what you "
                  "changed, what is left to do. Reply with text only.")
SUMMARY_PREFIX = "Summary of earlier work:\n"
FORMAT_REMINDER = "Reply with a tool call. Call finish when the task is done."

OpenChain = Callable[[str], str | Awaitable[str]]
OnStep = Callable[["AgentState"], Any | Awaitable[Any]]


@dataclass
class AgentConfig:
    """How the agent samples and what bounds it.

    `max_turns` bounds model responses per chain (compaction summaries not counted);
    `subagent_max_turns` a subagent's (default: `max_turns`); `max_tokens` each response;
    `compact_at_tokens` the prompt size that triggers compaction (None: never);
    `max_subagents` the subagents one rollout may start; `max_format_errors` how many replies
    without a tool call are answered with FORMAT_REMINDER instead of ending the chain (a weak
    policy early in RL rarely calls a tool on its first try). `sampling` goes to the request body
    as is (vLLM names: `top_p`, `top_k`, `seed`, ...). `max_retries` is the SDK's: the
    adapter answers 503 when vLLM paused a turn for a weight update, and a retry is safe
    because a failed request records nothing.
    """

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    model: str = "vime"
    max_turns: int = 50
    subagent_max_turns: int | None = None
    max_tokens: int = 2048
    compact_at_tokens: int | None = None
    max_subagents: int = 4
    tool_output_chars: int = 8000
    command_timeout: float = 60.0
    max_command_timeout: float = 600.0
    temperature: float | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_retries: int = 4
    request_timeout: float = 3600.0
    max_format_errors: int = 0


@dataclass
class ChainState:
    """One conversation: the Messages API `messages` as sent, and how far it got.

    `session_id` is what `open_chain` returned (the API key the chain sends); `summary` is the
    finish summary, or the last text of a chain that stopped without finishing.
    """

    name: str
    task: str
    session_id: str | None = None
    messages: list[dict] = field(default_factory=list)
    turns: int = 0
    compactions: int = 0
    format_errors: int = 0
    finished: bool = False
    summary: str | None = None
    stop_reason: str | None = None
    error: str | None = None


@dataclass
class AgentState:
    """Everything needed to continue a rollout after its last completed step, as JSON."""

    task: str
    chains: dict[str, ChainState] = field(default_factory=dict)
    subagents: int = 0

    @classmethod
    def new(cls, task: str) -> AgentState:
        return cls(task=task, chains={"main": ChainState(name="main", task=task)})

    @property
    def main(self) -> ChainState:
        return self.chains["main"]

    @property
    def finished(self) -> bool:
        return self.main.finished

    @property
    def summary(self) -> str | None:
        return self.main.summary

    @property
    def stop_reason(self) -> str | None:
        return self.main.stop_reason

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AgentState:
        chains = {name: ChainState(**chain) for name, chain in data["chains"].items()}
        return cls(task=data["task"], chains=chains, subagents=data.get("subagents", 0))


async def _call(fn: Callable, *args: Any) -> Any:
    """Call a plain or async callback (tolerant signatures for caller hooks)."""
    value = fn(*args)
    return await value if inspect.isawaitable(value) else value


def _text(content: list[dict]) -> str:
    return "".join(block.get("text", "") for block in content if block.get("type") == "text")


class CodingAgent:
    """Runs `AgentState`s against the adapter at `base_url`, with tools acting on `sandbox`."""

    def __init__(self, sandbox: Sandbox, base_url: str, open_chain: OpenChain,
                 config: AgentConfig | None = None) -> None:
        self.sandbox = sandbox
        self.base_url = base_url.rstrip("/")
        self.open_chain = open_chain
        self.config = config or AgentConfig()
        self.limits = ToolLimits(output_chars=self.config.tool_output_chars,
                                 default_timeout=self.config.command_timeout,
                                 max_timeout=self.config.max_command_timeout)

    async def run(self, state: AgentState, on_step: OnStep | None = None) -> AgentState:
        """Run the main chain until it stops, awaiting `on_step(state)` after every step;
        returns `state` (changed in place). A state that already stopped is returned as is."""
        await self._run_chain(state, state.main, MAIN_TOOLS, self.config.max_turns, on_step)
        return state

    async def _run_chain(self, state: AgentState, chain: ChainState, tools: tuple[str, ...],
                         max_turns: int, on_step: OnStep | None) -> None:
        if chain.stop_reason is not None:
            return
        if chain.session_id is None:
            chain.session_id = await _call(self.open_chain, chain.name)
            if not isinstance(chain.session_id, str) or not chain.session_id:
                raise ValueError(f"open_chain({chain.name!r}) returned {chain.session_id!r}; "
                                 "it must return the adapter session id (a non-empty string)")
        if not chain.messages:
            chain.messages = [{"role": "user", "content": chain.task}]
        client = anthropic.AsyncAnthropic(base_url=self.base_url, api_key=chain.session_id,
                                          max_retries=self.config.max_retries, timeout=self.config.request_timeout)
        try:
            while chain.stop_reason is None:
                if chain.turns >= max_turns:
                    chain.stop_reason = "max_turns"
                    break
                await self._step(state, chain, client, tools)
                if on_step is not None:
                    await _call(on_step, state)
        finally:
            await client.close()

    async def _step(self, state: AgentState, chain: ChainState, client: anthropic.AsyncAnthropic,
                    tools: tuple[str, ...]) -> None:
        response = await self._create(client, chain, chain.messages, tools)
        if response is None:
            return
        chain.turns += 1
        content = [block.model_dump(exclude_none=True) for block in response.content]
        chain.messages.append({"role": "assistant", "content": content})
        calls = [block for block in content if block["type"] == "tool_use"]
        if not calls:
            chain.summary = _text(content)
            if chain.format_errors < self.config.max_format_errors:
                chain.format_errors += 1
                chain.messages.append({"role": "user", "content": FORMAT_REMINDER})
                return
            chain.stop_reason = "max_tokens" if response.stop_reason == "max_tokens" else "no_tool_call"
            return
        results = [(await self._call_tool(state, chain, call, tools)).block(call["id"]) for call in calls]
        chain.messages.append({"role": "user", "content": results})
        if chain.finished:
            chain.stop_reason = "finish"
        elif self.config.compact_at_tokens is not None and response.usage.input_tokens > self.config.compact_at_tokens:
            await self._compact(chain, client, tools)

    async def _call_tool(self, state: AgentState, chain: ChainState, call: dict,
                         tools: tuple[str, ...]) -> ToolResult:
        name, arguments = call["name"], call.get("input")
        try:
            check_arguments(name, arguments, tools)
        except ToolError as e:
            return ToolResult(str(e), is_error=True)
        if name == "finish":
            chain.finished, chain.summary = True, arguments["summary"]
            return ToolResult("finished")
        if name == "subagent":
            return await self._subagent(state, arguments["task"])
        return await execute_sandbox_tool(self.sandbox, self.limits, name, arguments)

    async def _subagent(self, state: AgentState, task: str) -> ToolResult:
        """A fresh chain on the same sandbox with every tool but `subagent`; its finish summary
        is the result. It runs to its end inside the parent's step (no checkpoint inside)."""
        if state.subagents >= self.config.max_subagents:
            return ToolResult(f"no more subagents: this task may start {self.config.max_subagents}; "
                              "do the work yourself", is_error=True)
        state.subagents += 1
        sub = ChainState(name=f"sub-{state.subagents}", task=task)
        state.chains[sub.name] = sub
        await self._run_chain(state, sub, SUBAGENT_TOOLS, self.config.subagent_max_turns or self.config.max_turns,
                              on_step=None)
        if sub.finished:
            return ToolResult(sub.summary or "")
        said = f"; its last message: {sub.summary}" if sub.summary else ""
        return ToolResult(f"the subagent stopped without finishing ({sub.stop_reason}){said}", is_error=True)

    async def _compact(self, chain: ChainState, client: anthropic.AsyncAnthropic, tools: tuple[str, ...]) -> None:
        """Ask for a summary with the same system prompt and tools (so the request extends the
        chain's segment and the summary is trained), then restart the history from it."""
        last = chain.messages[-1]
        ask = [*chain.messages[:-1],
               {"role": "user", "content": [*last["content"], {"type": "text", "text": COMPACT_PROMPT}]}]
        response = await self._create(client, chain, ask, tools, tool_choice={"type": "none"})
        if response is None:
            return
        summary = _text([block.model_dump(exclude_none=True) for block in response.content]).strip()
        chain.messages = [{"role": "user", "content": chain.task},
                          {"role": "user", "content": SUMMARY_PREFIX + summary}]
        chain.compactions += 1

    async def _create(self, client: anthropic.AsyncAnthropic, chain: ChainState, messages: list[dict],
                      tools: tuple[str, ...], tool_choice: dict | None = None) -> anthropic.types.Message | None:
        """One Messages API request. A refused request (400: the context is full, the session's
        turns are used up) stops the chain; any other failure is the adapter's: `ServiceError`."""
        cfg = self.config
        kwargs: dict[str, Any] = {"model": cfg.model, "max_tokens": cfg.max_tokens, "system": cfg.system_prompt,
                                  "messages": messages, "tools": tool_definitions(tools)}
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        if cfg.sampling:
            kwargs["extra_body"] = dict(cfg.sampling)
        try:
            return await client.messages.create(**kwargs)
        except anthropic.BadRequestError as e:
            chain.stop_reason, chain.error = "rejected", str(e)[:1000]
            return None
        except anthropic.APIError as e:
            raise ServiceError(f"chain {chain.name!r} (session {chain.session_id!r}): the adapter at "
                               f"{self.base_url} failed: {type(e).__name__}: {str(e)[:500]}") from e


@dataclass
class CodingRun:
    """A finished run: the agent's state and each chain's segments, by chain name."""

    state: AgentState
    segments: dict[str, list[Segment]]


async def run_coding_agent(adapter: Any, sandbox: Sandbox, task: str, *, session_prefix: str,
                           config: AgentConfig | None = None, sampling_defaults: dict | None = None,
                           on_step: OnStep | None = None) -> CodingRun:
    """Run a fresh agent on `task` against `adapter` (started if it is not), one adapter
    session per chain named `{session_prefix}/{chain}`; every session it opened is finished,
    also when the run fails."""
    base_url = await adapter.start()
    opened: list[tuple[str, str]] = []

    def open_chain(name: str) -> str:
        session_id = f"{session_prefix}/{name}"
        adapter.open_session(session_id, sampling_defaults=sampling_defaults)
        opened.append((name, session_id))
        return session_id

    state = AgentState.new(task)
    segments: dict[str, list[Segment]] = {}
    try:
        await CodingAgent(sandbox, base_url, open_chain, config).run(state, on_step)
    finally:
        for name, session_id in opened:
            segments[name] = await adapter.finish_session(session_id)
    return CodingRun(state, segments)
