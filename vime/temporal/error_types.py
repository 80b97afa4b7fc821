"""The error types vime's workflows and activities agree on, and how a failure's message reaches
the user in one line.

Temporal matches `non_retryable_error_types` and `ApplicationError.type` on the exact type name,
so each name is spelled here once. Standard library + temporalio only: workflows import it
inside the sandbox.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

CONFIG_ERROR = "ConfigError"  # final: the user must change a flag, a hook or the data; never retried
WORKER_LOST = "WorkerLost"  # an activity the launcher failed because it saw its worker die


def final_error(message: str) -> ApplicationError:
    """A configuration error that ends the workflow (or activity) with `message`, untried again."""
    return ApplicationError(message, type=CONFIG_ERROR, non_retryable=True)


def own_message(error: BaseException) -> str:
    """An error's own message (Temporal's `str()` prefixes an ApplicationError's type)."""
    return getattr(error, "message", None) or str(error)


def root_message(error: BaseException) -> str:
    """The innermost cause's message: what the user's hook or the engine said."""
    while error.__cause__ is not None or getattr(error, "cause", None) is not None:
        error = getattr(error, "cause", None) or error.__cause__
    return own_message(error)


def failure_message(error: BaseException) -> str:
    """Why a workflow failed, in one line: its own error's message (which names the root cause),
    else the innermost cause's."""
    top = getattr(error, "cause", None)
    text = own_message(top) if isinstance(top, ApplicationError) and own_message(top) else root_message(error)
    return (text.splitlines() or [""])[0]
