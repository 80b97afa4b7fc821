"""Re-export: the helper lives in `vime.temporal.store_calls` (environments use it too)."""

from vime.temporal.store_calls import MAX_THREADS, store_call

__all__ = ["MAX_THREADS", "store_call"]
