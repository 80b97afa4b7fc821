"""The coding-agent RL example: agents fix bugs in small repositories, graded by their tests."""
