"""`vime train`, `vime eval` and `vime smoke`: start what a run needs (Temporal, vLLM, workers), start or
attach its workflow, follow it on the console, supervise the children, recover from their deaths."""
