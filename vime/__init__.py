"""vime: agentic RL training with vLLM rollouts, a PyTorch trainer and Temporal orchestration."""

from vime.types import Sample

__all__ = ["Sample"]
__version__ = "0.1.0"
