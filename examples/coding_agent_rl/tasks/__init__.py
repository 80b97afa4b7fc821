"""The task set vime ships for coding-agent RL: small buggy repositories, failing tests, gold patches.

`definitions/` is the table, `make_tasks.py` writes `repos/`, `patches/` and `tasks.jsonl`
from it (committed output), `grading.py` turns a diff into a reward, `prepare.py` checks the set.
"""
