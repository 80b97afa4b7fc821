"""A coding agent: tools over a `Sandbox`, a compact Messages-API agent loop with subagents,
compaction and resumable state, and a harness that runs Claude Code in a sandbox instead."""
