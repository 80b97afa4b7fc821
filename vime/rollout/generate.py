"""The default generate function: one prompt in as token ids, one sampled response out.

`generate(args, sample, sampling_params)` is what runs when `--custom-generate-function-path`
is unset, and the model for a custom one: render the prompt with the policy's tokenizer, POST
the ids to `http://{--vllm-router-ip}:{--vllm-router-port}/inference/v1/generate`, and append
the sampled ids and their logprobs to the sample exactly as vLLM returned them. The response
text is decoded from those ids for rewards and display only; nothing re-tokenizes it.

A prompt that does not fit the context is not an exception (one long prompt must not kill a
batch): the sample comes back FAILED with the reason in `metadata["error"]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import re
import weakref
from collections.abc import Iterator
from typing import Any

from vime.engine.client import EngineClient, EngineRequestError, GenerateOutput
from vime.engine.lora_heal import healing
from vime.engine.weight_sync.lora_serving import adapter_name, adapter_sync, version_of
from vime.errors import ConfigError
from vime.rollout import tokenization
from vime.rollout.phase_times import timed
from vime.types import Sample

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, EngineClient]] = weakref.WeakKeyDictionary()

# The LoRA adapter the current rollout samples from (`serving_adapter`); None: the served model.
_adapter: contextvars.ContextVar[str | None] = contextvars.ContextVar("vime_lora_adapter", default=None)

_CONTEXT_ERROR = re.compile(
    r"maximum (context|model) length|max_model_len|longer than the maximum",
    re.IGNORECASE,
)


@contextlib.contextmanager
def serving_adapter(args: Any, run_id: str, weight_version: int) -> Iterator[str | None]:
    """Within it, `generate` (and every task started inside) samples a LoRA run's adapter of
    `weight_version` (`<run>-v<version>`, loaded by the trainer's `AdapterSync`); version 0 is the
    base model (a fresh adapter is zero). Nothing changes for a run without `--lora-rank`, or one
    that syncs merged weights (`lora_serving.adapter_sync`)."""
    name = adapter_name(run_id, weight_version) if adapter_sync(args) and int(weight_version) > 0 else None
    token = _adapter.set(name)
    try:
        yield name
    finally:
        _adapter.reset(token)


def current_adapter() -> str | None:
    """The adapter name `generate` requests now (see `serving_adapter`), or None."""
    return _adapter.get()


def adapter_versions(spans: list[Any], adapter: str | None) -> list[Any]:
    """vLLM's weight-version spans of a response sampled from `adapter`: with LoRA vLLM says
    `default` (the base's version), so the version is the one in the adapter's name, which the
    server serves or refuses (404), never another."""
    version = version_of(adapter) if adapter else None
    if version is None:
        return list(spans)
    return [{**span, "version": str(version), "adapter": adapter} if isinstance(span, dict) else str(version)
            for span in spans]


def router_url(args: Any) -> str:
    """Where generate requests go: the router, or the one vLLM server."""
    ip, port = args.vllm_router_ip, args.vllm_router_port
    if not ip or not port:
        raise ConfigError(
            "--vllm-router-ip and --vllm-router-port are not set; they name the router (or the one vLLM "
            "server) that generate functions call"
        )
    return f"http://{ip}:{port}"


def get_engine_client(args: Any) -> EngineClient:
    """The `EngineClient` for `router_url(args)` on the running event loop, created once and reused.

    aiohttp sessions belong to one event loop, so clients are kept per loop; a loop that goes
    away takes its clients with it (call `close_engine_clients` first to close them cleanly).
    """
    url = router_url(args)
    loop = asyncio.get_running_loop()
    per_loop = _clients.setdefault(loop, {})
    client = per_loop.get(url)
    if client is None:
        client = per_loop[url] = EngineClient(url, progress_timeout=args.engine_progress_timeout)
    return client


async def close_engine_clients() -> None:
    """Close the clients of the running loop (at the end of a rollout worker or a test)."""
    per_loop = _clients.pop(asyncio.get_running_loop(), {})
    for client in per_loop.values():
        await client.close()


def prompt_token_ids(args: Any, sample: Sample) -> list[int]:
    """The prompt's ids: text encoded as is; chat messages rendered with the template first
    (with `metadata["tools"]` and `--apply-chat-template-kwargs`)."""
    tokenizer = tokenization.tokenizer_for(args)
    text = tokenization.render_prompt(
        tokenizer,
        sample.prompt,
        tools=(sample.metadata or {}).get("tools"),
        chat_template_kwargs=args.apply_chat_template_kwargs,
    )
    return tokenization.encode(tokenizer, text)


def max_model_len(args: Any) -> int | None:
    """`--vllm-max-model-len` as forwarded to the servers, when it was set (else the server decides)."""
    tokens = list(args.vllm_server_args or [])
    for i, tok in enumerate(tokens):
        value = None
        if tok.startswith("--max-model-len="):
            value = tok.split("=", 1)[1]
        elif tok == "--max-model-len" and i + 1 < len(tokens):
            value = tokens[i + 1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None  # vLLM's "4k" style; the server enforces it
    return None


def fail(sample: Sample, reason: str, **metadata: Any) -> Sample:
    """Mark `sample` FAILED with `reason` in `metadata["error"]` (a model-side or data failure)."""
    sample.status = Sample.Status.FAILED
    sample.metadata["error"] = reason
    sample.metadata.update(metadata)
    return sample


def status_of(output: GenerateOutput) -> Sample.Status:
    if output.truncated:
        return Sample.Status.TRUNCATED
    if output.aborted:
        return Sample.Status.ABORTED
    return Sample.Status.COMPLETED


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False) -> Sample:
    """Sample one response for `sample` and fill `tokens`, `response`, `response_length`,
    `loss_mask` (all 1), `rollout_log_probs`, `weight_versions` and `status`.

    A sample whose `tokens` are already set is generated from those ids (a pre-tokenized prompt,
    or an aborted partial rollout handed back, which is continued: `max_tokens` shrinks by the
    response it already has).
    """
    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise ConfigError(
            f"generate: sample {sample.index} has status {sample.status.value}; only pending or aborted "
            "samples are generated"
        )
    if not sample.tokens:
        with timed("tokenize"):
            sample.tokens = prompt_token_ids(args, sample)
        sample.response_length = 0
    if not sample.tokens:
        return fail(sample, "the prompt renders to zero tokens")
    params = dict(sampling_params)
    if params.get("max_tokens") is not None:
        params["max_tokens"] = int(params["max_tokens"]) - sample.response_length
        if params["max_tokens"] <= 0:
            sample.status = Sample.Status.TRUNCATED
            return sample
    limit = max_model_len(args)
    if limit is not None and len(sample.tokens) >= limit:
        return fail(sample, f"the context is {len(sample.tokens)} tokens; the model takes {limit} "
                    "(--vllm-max-model-len)", prompt_too_long=True)
    if limit is not None and params.get("max_tokens") is not None:
        params["max_tokens"] = min(params["max_tokens"], limit - len(sample.tokens))
    try:
        with timed("http"):
            adapter, client = current_adapter(), get_engine_client(args)
            output = await healing(args, adapter, lambda: client.generate(  # a server that lost the adapter gets it
                sample.tokens, params, session_id=sample.session_id, **({"model": adapter} if adapter else {})))
    except EngineRequestError as exc:
        if exc.status == 400 and _CONTEXT_ERROR.search(exc.body):
            return fail(sample, f"vLLM rejected the context of {len(sample.tokens)} tokens: {exc.body[:300]}",
                        prompt_too_long=True)
        raise
    with timed("tokenize"):
        tokenizer = tokenization.tokenizer_for(args)
        text = tokenizer.decode(output.token_ids, skip_special_tokens=bool(params.get("skip_special_tokens", False)))
    sample.append_response_tokens(output.token_ids, output.log_probs, loss_mask=1, text=text)
    sample.weight_versions.extend(adapter_versions(output.weight_versions, adapter))
    sample.status = status_of(output)
    sample.metadata["finish_reason"] = output.finish_reason
    return sample
