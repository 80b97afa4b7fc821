"""One agent session of a coding rollout, resumable: the body of the `agent_session` activity.

The harness (`--agent-harness`) talks to the worker's adapter; every chain of the run is an
adapter session named `<run>/<rollout>@<activity>.<attempt>/<chain>`, fresh per attempt, so a retry in the
same process never collides with the sessions of the attempt it replaces.

- builtin (`CodingAgent`): after every step `checkpoint(chains, agent_state)` stores the step;
  a retry gets the stored steps back (`restored`): the agent continues from its stored state and
  each chain's adapter session is reopened with its stored segments, so the next turn extends
  them as if nothing had happened.
- claude_code (the CLI in the sandbox): the CLI keeps its conversation to itself, so the session
  is stored once, when the CLI exits; a retry of an unfinished session starts it over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from vime.agent.adapters.core import Segment
from vime.envs.coding_agent.agent import AgentState, CodingAgent
from vime.envs.coding_agent.config import agent_config, sampling_defaults
from vime.envs.coding_agent.flags import coding_flags
from vime.agent.recorder import Restored
from vime.sandbox.base import Sandbox
from vime.envs.coding_agent.workflow import AgentTask, SessionOutput

Checkpoint = Callable[[dict[str, list[Segment]], dict], Awaitable[None]]


async def run_session(args: Any, adapter: Any, sandbox: Sandbox, run_id: str, task: AgentTask, restored: Restored,
                      checkpoint: Checkpoint, *, attempt: str, evaluation: bool = False) -> SessionOutput:
    prefix = f"{run_id}/{task.rollout_id}@{attempt}"
    defaults = sampling_defaults(args, evaluation)
    if coding_flags(args).agent_harness == "claude_code":
        return await _claude_code(args, adapter, sandbox, prefix, task, restored, checkpoint, defaults)
    state = AgentState.from_dict(restored.agent_state) if restored.agent_state else AgentState.new(task.prompt)
    sessions: dict[str, str] = {}
    for name, chain in state.chains.items():  # reopen the chains of the stored steps, segments and all
        if chain.session_id is not None:
            chain.session_id = sessions[name] = f"{prefix}/{name}"
            adapter.core.restore_session(chain.session_id, restored.chains.get(name, []), defaults)

    def open_chain(name: str) -> str:
        sessions[name] = f"{prefix}/{name}"
        adapter.open_session(sessions[name], defaults)
        return sessions[name]

    async def on_step(state: AgentState) -> None:
        chains = {name: adapter.core.session_segments(sid) for name, sid in sessions.items()
                  if adapter.core.has_session(sid)}
        await checkpoint(chains, state.to_dict())

    try:
        await CodingAgent(sandbox, await adapter.start(), open_chain, agent_config(args)).run(state, on_step)
    finally:
        for sid in sessions.values():
            if adapter.core.has_session(sid):
                await adapter.finish_session(sid)
    return SessionOutput(sum(c.turns for c in state.chains.values()), state.stop_reason or "", state.finished)


async def _claude_code(args: Any, adapter: Any, sandbox: Sandbox, prefix: str, task: AgentTask, restored: Restored,
                       checkpoint: Checkpoint, defaults: dict[str, Any]) -> SessionOutput:
    from vime.envs.coding_agent.claude_code import run_claude_code

    if restored.agent_state is not None:  # stored when the CLI exited: the session is done
        stored = restored.agent_state
        return SessionOutput(stored.get("turns", 0), stored.get("stop_reason", ""), stored.get("finished", False))
    session_id = f"{prefix}/main"
    adapter.open_session(session_id, defaults)
    try:
        result = await run_claude_code(sandbox, await adapter.start(), session_id, task.prompt,
                                       max_turns=coding_flags(args).agent_max_turns)
    finally:
        segments = await adapter.finish_session(session_id)
    turns = sum(len(s.turns) for s in segments)
    state = {"harness": "claude_code", "turns": turns, "finished": result.rc == 0,
             "stop_reason": "exit" if result.rc == 0 else f"exit {result.rc}"}
    await checkpoint({"main": segments}, state)
    return SessionOutput(turns, state["stop_reason"], state["finished"])
