"""Error types whose message is meant for the user as it stands.

`vime` commands print a `VimeError` as one line (no traceback): the message names the bad
input and what to do about it. Anything else escaping is a bug and keeps its traceback.
"""


class VimeError(Exception):
    """An error caused by input or environment, with a message that says what to fix."""


class ConfigError(VimeError, ValueError):
    """A flag, path or config value that cannot be used."""


class ServiceError(VimeError, RuntimeError):
    """A service (vLLM, Temporal, a router) that failed to start or cannot be reached."""
