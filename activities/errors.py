"""Re-export: how vime's errors cross into Temporal lives in `vime.temporal.retry`."""

from vime.temporal.retry import CONFIG_ERROR, as_final, final_config_errors

__all__ = ["CONFIG_ERROR", "as_final", "final_config_errors"]
