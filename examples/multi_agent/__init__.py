"""Multi-agent RL on one policy: K solvers draft, a rewriter merges, a selector picks; every
role's turns train as one fan-out (see README.md).

`task` (the toy task, role prompts, rewards), `roles` (sampling each role's turns), `generate`
(all roles in one slime generate hook), `workflow`/`activities` (the durable environment, one
activity per role), `env`/`flags` (its registration and flags), `run` (the example's command).
"""
