"""Protocol adapters that let unmodified agent runtimes sample from vLLM while vime records
the exact sampled tokens; see docs/adapters.md."""

from vime.agent.adapters.base import BaseAdapter
from vime.agent.adapters.core import (AdapterCore, AdapterError, ParsedOutput, Segment, ToolCall,
                                      TurnBoundary, TurnResult)

__all__ = ["AdapterCore", "AdapterError", "BaseAdapter", "ParsedOutput", "Segment", "ToolCall",
           "TurnBoundary", "TurnResult"]


def __getattr__(name: str):
    """The protocol adapters load on first use, so the core imports without them."""
    if name == "AnthropicAdapter":
        from vime.agent.adapters.anthropic import AnthropicAdapter

        return AnthropicAdapter
    if name == "OpenAIAdapter":
        from vime.agent.adapters.openai import OpenAIAdapter

        return OpenAIAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
