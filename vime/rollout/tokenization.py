"""The policy's tokenizer, loaded once per checkpoint path, and prompt rendering.

Loading a tokenizer takes seconds and every sample of a rollout needs one, so tokenizers are
cached per path for the life of the process. Prompts are rendered to text first and encoded
with `add_special_tokens=False`, the way the chat template already places every special token:
the ids sent to vLLM are exactly the rendered text's ids, whatever transformers version returns
from `apply_chat_template(tokenize=True)`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Any

from vime.cache import cache_root
from vime.errors import ConfigError


@functools.lru_cache(maxsize=8)
def get_tokenizer(path: str) -> Any:
    """The tokenizer `AutoTokenizer` gives for `path` (the `--hf-checkpoint`), loaded once per process."""
    if not path:
        raise ConfigError("--hf-checkpoint is not set; vime needs it for the policy's tokenizer")
    try:
        known = known_tokenizer_class(str(path))
        if known is not None:
            return known.from_pretrained(str(path))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--hf-checkpoint {str(path)!r}: cannot load a tokenizer from it ({exc})") from exc
    _remember_class(str(path), type(tokenizer))
    return tokenizer


# Which class `AutoTokenizer` picked for a checkpoint, remembered across processes. Importing
# `AutoTokenizer` imports torch and every model's configuration (~10 s of CPU on these machines),
# in rollout workers that otherwise need neither; the class it picks alone loads in ~2 s. Its
# choice depends on the checkpoint's two config files (and transformers' version), so those key
# the record; a checkpoint with remote code (its own tokenizer module) is never remembered.
CLASSES_FILE = "tokenizer-classes.json"


def _classes_path() -> Path:
    return cache_root() / CLASSES_FILE


def _checkpoint_key(path: str) -> str | None:
    import transformers

    directory = Path(path)
    digest = hashlib.sha256(transformers.__version__.encode())
    try:
        for name in ("tokenizer_config.json", "config.json"):
            digest.update((directory / name).read_bytes())
    except OSError:
        return None
    return f"{directory.resolve()}:{digest.hexdigest()[:16]}"


def _read_classes() -> dict[str, str]:
    try:
        known = json.loads(_classes_path().read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def known_tokenizer_class(path: str) -> type | None:
    """The class `AutoTokenizer` picked for this checkpoint before, as it is now; else None."""
    key = _checkpoint_key(path)
    name = _read_classes().get(key) if key else None
    if not isinstance(name, str) or ":" not in name:
        return None
    module, _, qualname = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) else None


def _remember_class(path: str, cls: type) -> None:
    """Record `cls` for the checkpoint (atomically; a read-only cache only costs the next start time)."""
    key = _checkpoint_key(path)
    if key is None or not cls.__module__.startswith("transformers."):
        return
    target = _classes_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        known = _read_classes()
        known[key] = f"{cls.__module__}:{cls.__qualname__}"
        temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(known, indent=1, sort_keys=True))
        os.replace(temporary, target)
    except OSError:
        pass


def tokenizer_for(args: Any) -> Any:
    return get_tokenizer(args.hf_checkpoint)


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
