"""A tiny Qwen2 chat model with random weights, built here with no network access.

Tests and `vime smoke` need a model that both transformers and vLLM (CPU) load, whose chat
template has tool calls and reasoning, and that takes seconds to build rather than a hub
download. This module makes one: a byte-level BPE tokenizer trained with `tokenizers` on the
Python standard library, a ChatML template in the style of Qwen2.5/Qwen3 (hermes
`<tool_call>` blocks, `<tool_response>` turns, `<think>` reasoning), and a 2-layer Qwen2
with random weights.

Invariants:
- Same build parameters (seed, vocab size) and same library versions give byte-identical
  files; `tiny_model_dir()` caches one build per parameter set under `$VIME_CACHE`
  (default `~/.cache/vime`).
- The embedding has exactly one row per tokenizer id, so the model never samples an id
  the tokenizer cannot decode.
- Rendering a conversation with `add_generation_prompt=True` gives a prefix of rendering it
  with the assistant's reply appended: what the model sampled is what later turns see.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from vime.cache import cache_root  # noqa: F401 - the examples import it from here too
from vime.errors import ConfigError
from vime.log import get_logger

log = get_logger(__name__)

BUILD_VERSION = 1
"""Bump whenever the build changes its output; old cache entries are then ignored."""

DEFAULT_VOCAB_SIZE = 8192
MIN_VOCAB_SIZE = 512

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Control tokens: `skip_special_tokens=True` removes them from decoded text."""

MARKUP_TOKENS = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
"""Single-id tokens that stay in decoded text, as in Qwen's tokenizers: vLLM decodes with
`skip_special_tokens=True` by default, and its tool-call and reasoning parsers look for these
tags in the decoded text."""

CORPUS_FILE_STRIDE = 4
CORPUS_MAX_CHARS = 4_000_000
"""Every 4th standard-library file, up to 4M characters: trains in ~1-3 s on 2 cores and
compresses code and prose as well as the whole library does (2.9 characters per token)."""

QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors",
               "tokenizer.json", "tokenizer_config.json")

CHAT_TEMPLATE = r"""
{%- macro render_content(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content | string -}}
    {%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_message = render_content(messages[0].content) -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set system_message = none -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if system_message -%}
        {{- system_message + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' -}}
    {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system_message is not none -%}
    {{- '<|im_start|>system\n' + system_message + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message.role == 'assistant' -%}
        {%- set content = render_content(message.content) -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if message.reasoning_content is string and message.reasoning_content -%}
            {{- '<think>\n' + message.reasoning_content.strip('\n') + '\n</think>\n\n' -}}
            {%- set content = content.lstrip('\n') -%}
        {%- endif -%}
        {{- content -}}
        {%- for tool_call in message.tool_calls or [] -%}
            {%- if tool_call.function is defined -%}
                {%- set tool_call = tool_call.function -%}
            {%- endif -%}
            {%- if content or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {{- '<tool_call>\n{"name": ' + (tool_call.name | tojson) + ', "arguments": ' -}}
            {%- if tool_call.arguments is string -%}
                {{- tool_call.arguments -}}
            {%- else -%}
                {{- (tool_call.arguments if tool_call.arguments is defined else {}) | tojson -}}
            {%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()
"""ChatML as Qwen2.5/Qwen3 write it, with two deliberate differences: reasoning is kept in
every assistant turn (Qwen3 drops it before the last user message, which would change the
tokens of earlier turns between one request and the next), and there is no default system
prompt."""


def stdlib_corpus(stride: int = CORPUS_FILE_STRIDE, max_chars: int = CORPUS_MAX_CHARS) -> list[str]:
    """The tokenizer's training texts: a sorted, strided subset of the standard library's
    `.py` files, the one corpus every machine has offline. Installed packages are left out
    so the corpus depends only on the Python version."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    texts, total = [], 0
    for path in files[::stride]:
        if total >= max_chars:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
    if total < 100_000:
        raise ConfigError(
            f"found only {total} characters of Python source under {root} to train the tiny "
            "model's tokenizer; install the full Python standard library (not a stripped one)"
        )
    return texts


def train_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Train a byte-level BPE (GPT-2/Qwen style) with exactly `vocab_size` ids.

    A real-size vocabulary matters: agent clients send 40-50k-character prompts, which this
    tokenizer encodes in ~13k tokens (a byte-sized vocabulary would need ~33k) and so stay
    within a context that vLLM on CPU serves in about a second. The special tokens take ids
    0-2; the markup tokens are appended after the merges, as in Qwen's tokenizers.

    The normalizer and pre-tokenizer are exactly Qwen2's: transformers 5 loads the tokenizer
    of any `qwen2` checkpoint as `Qwen2Tokenizer`, which rebuilds them from its own code
    whatever tokenizer.json says; with the same pipeline, transformers 4 and 5, vLLM and the
    raw `tokenizers` file all produce the same ids.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(
            f"tiny model vocab_size {vocab_size!r} is too small; use an int >= {MIN_VOCAB_SIZE} "
            f"(default {DEFAULT_VOCAB_SIZE}): the byte alphabet alone takes 256 ids"
        )
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKUP_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_corpus(), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    if tok.get_vocab_size() != vocab_size:
        raise ConfigError(
            f"tiny model vocab_size {vocab_size} is more than the training corpus supports "
            f"({tok.get_vocab_size()} tokens); use a smaller vocab_size such as {DEFAULT_VOCAB_SIZE}"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=65536,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_config(vocab_size: int, eos_token_id: int, pad_token_id: int):
    """The Qwen2 shape: small enough to run anywhere, shaped like the real thing.

    head_dim is 64 (hidden 128 / 2 heads) because vLLM's CPU attention rejects small heads
    ("Unsupported CPU attention configuration" at 16); one KV head makes it grouped-query
    attention like every Qwen; 65536 positions let agent-length prompts through.
    """
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=65536,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        dtype="float32",
        architectures=["Qwen2ForCausalLM"],
    )


def build_tiny_model(out_dir: Path | None = None, *, seed: int = 0,
                     vocab_size: int = DEFAULT_VOCAB_SIZE) -> Path:
    """Build the tokenizer and a randomly initialised model into `out_dir` and return it.

    `out_dir` defaults to a new temporary directory; an existing one is written into.
    Prefer `tiny_model_dir()`, which builds once per parameter set and caches the result.
    The caller's torch RNG state is left as it was.
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"tiny model seed {seed!r} is not an int; pass an integer such as 0")
    t0 = time.monotonic()
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="vime-tiny-model-"))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"tiny model output {str(out)!r} is a file; pass a directory path")
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(vocab_size)
    tokenizer.save_pretrained(out)
    _finish_tokenizer_config(out / "tokenizer_config.json")

    config = tiny_config(len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
        _perturb_constant_tensors(model)
    model.generation_config = GenerationConfig(
        bos_token_id=None,
        eos_token_id=[config.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    log.info("built tiny model", path=str(out), seed=seed, vocab_size=len(tokenizer),
             parameters=sum(p.numel() for p in model.parameters()),
             seconds=round(time.monotonic() - t0, 1))
    return out


def _perturb_constant_tensors(model) -> None:
    """Give the biases (initialised to 0) and norm weights (to 1) random values too, so every
    tensor matters: a loader or weight sync that skips one changes the logits, and a test
    comparing vLLM with transformers notices."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)


def _finish_tokenizer_config(path: Path) -> None:
    """Make tokenizer_config.json readable by transformers 4.x as well as 5.x: name the generic
    fast-tokenizer class (5.x writes `TokenizersBackend`, unknown to 4.x) and embed the chat
    template (5.x writes it only to chat_template.jinja, which it keeps reading first)."""
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False, sort_keys=True) + "\n")


def cache_key(seed: int = 0, vocab_size: int = DEFAULT_VOCAB_SIZE) -> str:
    """Hash of everything the built files depend on: the parameters, BUILD_VERSION, the
    Python version (the corpus is its standard library) and the tokenizers/transformers
    versions (training and file formats)."""
    params = {
        "build_version": BUILD_VERSION,
        "seed": seed,
        "vocab_size": vocab_size,
        "python": platform.python_version(),
        "tokenizers": importlib.metadata.version("tokenizers"),
        "transformers": importlib.metadata.version("transformers"),
    }
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in MODEL_FILES)


def tiny_model_dir(seed: int = 0, *, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Path:
    """The cached tiny model for these parameters, built on first use.

    Safe when several processes (pytest-xdist workers, a test and a server) ask at once: one
    builds under an `fcntl` lock into a temporary directory and renames it into place, so a
    model directory either does not exist or is complete; the others wait and reuse it.
    """
    root = cache_root()
    final = root / f"tiny-model-{cache_key(seed, vocab_size)}"
    if is_complete(final):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the vime cache {str(root)!r} ({e}); "
                          "set VIME_CACHE to a writable directory") from e
    with _file_lock(root / f".{final.name}.lock"):
        if is_complete(final):
            return final
        if final.exists():
            log.warning("removing an incomplete tiny model directory", path=str(final))
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        try:
            build_tiny_model(tmp, seed=seed, vocab_size=vocab_size)
            for path in (tmp, *tmp.iterdir()):  # mkdtemp and safetensors create owner-only
                path.chmod(0o755 if path.is_dir() else 0o644)
            os.rename(tmp, final)
        except OSError:
            if not is_complete(final):
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    """`python -m vime.testing.tiny_model [--out DIR] [--seed N]`: print the model directory."""
    parser = argparse.ArgumentParser(
        prog="python -m vime.testing.tiny_model",
        description="Build (or find in $VIME_CACHE) the tiny test model and print its directory.",
    )
    parser.add_argument("--out", type=Path, help="build into this directory instead of the cache")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help=f"tokenizer size (default {DEFAULT_VOCAB_SIZE})")
    args = parser.parse_args(argv)
    from vime.log import configure_logging

    configure_logging()
    if args.out is not None:
        path = build_tiny_model(args.out, seed=args.seed, vocab_size=args.vocab_size)
    else:
        path = tiny_model_dir(args.seed, vocab_size=args.vocab_size)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def cached_build(name: str, params: dict, build: Callable[[Path], None]) -> Path:
    """A model directory derived from others (a warm start, a teacher), cached like the tiny model
    under `<cache>/<name>-<hash of params>`: `build(out)` writes it on first use, under a lock and
    into a temporary directory renamed into place, so a killed build leaves nothing half-written."""
    key = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]
    root = cache_root()
    final = root / f"{name}-{key}"
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{final.name}.lock"):
        if not is_complete(final):
            work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
            build(work / "model")
            if final.exists():  # an incomplete earlier build
                shutil.rmtree(final)
            os.rename(work / "model", final)
            shutil.rmtree(work, ignore_errors=True)
    return final
