"""`vime train` and `vime smoke`: start what a run needs (Temporal, vLLM, workers), start or attach
the training workflow, follow it on the console, supervise the children, recover from their deaths."""
