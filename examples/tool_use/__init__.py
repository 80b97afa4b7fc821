"""Tool use (retool-style): the model's Python runs in a sandbox, its output a masked observation
(see README.md).

The environment itself is `vime.envs.tool_use` (installed with vime, so `--rollout-env tool_use`
works from any directory); here are `run` (the example's command), `sft_traces` (its warm start)
and the old import paths `env` and `activities`, which are those modules.
"""
