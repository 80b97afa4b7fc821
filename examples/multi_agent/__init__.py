"""Multi-agent RL on one policy: K solvers draft, a rewriter merges, a selector picks; every
role's turns train as one fan-out (see README.md).

The environment itself is `vime.envs.multi_agent` (installed with vime, so `--rollout-env
multi_agent` works from any directory); here are `run` (the example's command) and the old
import paths `env` and `generate`, which are those modules.
"""
