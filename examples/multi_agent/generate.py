"""Moved to `vime.envs.multi_agent.generate` (installed with vime); this old path is that module, not a copy, so its
classes and flags are the same objects whichever path imported them."""

import sys

import vime.envs.multi_agent.generate as _moved

sys.modules[__name__] = _moved
