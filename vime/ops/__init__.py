"""Operating runs from the shell: `vime runs`, `vime samples`, `vime show` read a run's store.

They read, never write: a store is opened only where one exists (no empty `vime.db` is left
behind by a typo), and a finished run's directory is all they need (no Temporal, no vLLM).
"""
