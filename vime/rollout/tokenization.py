"""The policy's tokenizer, loaded once per checkpoint path, and prompt rendering.

Loading a tokenizer takes seconds and every sample of a rollout needs one, so tokenizers are
cached per path for the life of the process. Prompts are rendered to text first and encoded
with `add_special_tokens=False`, the way the chat template already places every special token:
the ids sent to vLLM are exactly the rendered text's ids, whatever transformers version returns
from `apply_chat_template(tokenize=True)`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from vime.errors import ConfigError


@functools.lru_cache(maxsize=8)
def get_tokenizer(path: str) -> Any:
    """`AutoTokenizer` for `path` (the `--hf-checkpoint`), loaded once per process."""
    if not path:
        raise ConfigError("--hf-checkpoint is not set; vime needs it for the policy's tokenizer")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--hf-checkpoint {str(path)!r}: cannot load a tokenizer from it ({exc})") from exc


def tokenizer_for(args: Any) -> Any:
    return get_tokenizer(getattr(args, "hf_checkpoint", None))


def parse_tools(value: Any, where: str) -> list[dict[str, Any]] | None:
    """Tools as the chat template wants them: a list of dicts (JSON text is decoded)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: tools are a string but not JSON ({exc.msg})") from exc
    if hasattr(value, "tolist"):  # numpy arrays from Parquet readers
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError(f"{where}: tools must be a list of JSON objects, got {type(value).__name__}")
    return value


def is_messages(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)


def render_prompt(
    tokenizer: Any,
    prompt: str | list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Chat messages rendered with the tokenizer's template (generation prompt added); text as is."""
    if isinstance(prompt, str):
        return prompt
    if not is_messages(prompt):
        raise ConfigError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    return tokenizer.apply_chat_template(
        prompt, tools=tools, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))
