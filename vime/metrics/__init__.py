"""Where a run's metrics lines go besides `metrics.jsonl` (`vime.metrics_log` writes the file and
feeds these): `tags` (a line's keys as grouped tags), `tensorboard_sink`, `wandb_sink`, and
`prometheus` (the rollout worker's scrape endpoint)."""
