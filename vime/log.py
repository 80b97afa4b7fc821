"""structlog, configured once per process: a console renderer for people, JSON lines for machines.

Standard-library loggers (vLLM, Temporal's `workflow.logger` / `activity.logger`, which are
replay-aware and must stay the ones used inside Temporal code) go through the same
`ProcessorFormatter`, so every line of a run looks alike whichever library wrote it.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import structlog

# structlog (with rich, which it imports) is a third of the CPU a pre-start check of `vime train`
# spends: it is imported when a process configures logging or first logs, not when a module
# merely names its logger (`log = get_logger(__name__)` at the top of most modules).

_configured: str | None = None


def configure_logging(fmt: str | None = None, level: str | int | None = None) -> None:
    """Configure structlog and the root logger; later calls with the same format do nothing.

    `fmt` is "console" or "json" (default: $VIME_LOG_FORMAT, else console on a terminal and
    JSON otherwise); `level` defaults to $VIME_LOG_LEVEL or INFO.
    """
    global _configured
    import structlog

    fmt = fmt or os.environ.get("VIME_LOG_FORMAT") or ("console" if sys.stderr.isatty() else "json")
    if fmt not in ("console", "json"):
        from vime.errors import ConfigError

        raise ConfigError(f"log format {fmt!r} is not one of console, json (set VIME_LOG_FORMAT)")
    level = level or os.environ.get("VIME_LOG_LEVEL", "INFO")
    if _configured == fmt:
        logging.getLogger().setLevel(level)
        return

    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    # Alembic says "setup plugin ..." and "Context impl SQLiteImpl." at INFO on every store open:
    # noise on the console of every command; its warnings and errors still show
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
    _configured = fmt


_deferred: tuple[str | None, str | int | None] | None = None


def configure_logging_on_first_log(fmt: str | None = None, level: str | int | None = None) -> None:
    """`configure_logging(fmt, level)` when a vime logger first logs, not now: for the commands
    that read a store and rarely log (`vime show`, `vime samples`), which answer in half the CPU
    without structlog's import. Standard-library loggers keep Python's default until then
    (warnings and errors to stderr)."""
    global _deferred
    _deferred = (fmt, level)


class _Logger:
    """structlog's logger for `name`, made on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._logger is None:
            import structlog

            if _deferred is not None and _configured is None:
                configure_logging(*_deferred)

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, attr)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return _Logger(name)  # type: ignore[return-value] - it acts as one
