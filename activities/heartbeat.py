"""Re-export: the helper lives in `vime.temporal.heartbeat` (environments use it too)."""

from vime.temporal.heartbeat import heartbeating

__all__ = ["heartbeating"]
