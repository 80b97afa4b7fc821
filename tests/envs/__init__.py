"""Rollout environments that live outside the vime package (tests/test_environments.py)."""
