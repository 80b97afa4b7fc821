"""A rollout heals a server that lost its run's LoRA adapter: it loads the adapter itself.

A LoRA run's rollouts request `model=<run>-v<version>` (`serving_adapter`), which the trainer's
`AdapterSync` loaded on every server. A server restarted outside the run's supervisor (a shared
fleet's, which knows no run's `lora-live.json`), or one whose restart raced a sync, does not hold
it and answers HTTP 404 "The model `<name>` does not exist." (vLLM 0.32, on
`/inference/v1/generate` as on `/v1/completions`). `healing` then loads that very adapter from
its directory (`lora_serving.adapters_dir(args.run_dir, run) / name`: the trainer writes each
version there) on every server of the run (`engine_urls(args)`: `--vllm-server-urls`, else the
one the router address names), logs one `lora.adapter_reloaded` warning, and sends the request
once more.

Invariants:
- the adapter loaded is the name the request asked for, never another version: the name carries
  the version, so the retried request samples the policy it named or fails;
- one load per name at a time in a process (an asyncio lock per name per event loop): concurrent
  requests that hit the same missing adapter wait for the first one's load, and a request sent
  before the last load finished only retries;
- a server that still holds the name is left as it is (no `load_inplace`: vLLM answers 400
  "already been loaded", which counts as loaded);
- a directory that is gone (an old version the trainer deleted, a finished run) is `AdapterGone`,
  an error of the request, not of the infrastructure: the sample fails once, nothing retries it.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp

from vime.engine.client import EngineRequestError
from vime.engine.weight_sync.checkpoint_load import engine_urls
from vime.engine.weight_sync.lora_serving import adapters_dir, load_adapter, run_of
from vime.errors import VimeError
from vime.log import get_logger

log = get_logger(__name__)
T = TypeVar("T")
LOAD_TIMEOUT = aiohttp.ClientTimeout(total=120.0)


class AdapterGone(VimeError):
    """A server lost a LoRA adapter whose directory is gone too: the request cannot be healed."""


@dataclass
class _Heals:
    """One event loop's loads: a lock per adapter name, and when each name was last loaded."""

    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    loaded_at: dict[str, float] = field(default_factory=dict)


_heals: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Heals] = weakref.WeakKeyDictionary()


def is_missing_model(exc: BaseException) -> bool:
    """Whether vLLM answered that the requested `model` (an adapter's name) does not exist."""
    return isinstance(exc, EngineRequestError) and exc.status == 404 and "does not exist" in exc.body


def adapter_dir(args: Any, name: str) -> Path:
    """Where the trainer wrote adapter `name` (`<run_dir>/lora-adapters/<run>/<name>`)."""
    run = run_of(name)
    if run is None or not args.run_dir:
        raise AdapterGone(f"LoRA adapter {name!r} is not loaded on the server, and its directory is unknown "
                          f"(run dir {args.run_dir!r}; an adapter's name is <run>-v<version>)")
    return adapters_dir(args.run_dir, run) / name


async def healing(args: Any, adapter: str | None, request: Callable[[], Awaitable[T]]) -> T:
    """`await request()`, which samples from `adapter` (None: the served model). When the server
    answers that the adapter does not exist, load it (`reload_adapter`) and call `request()` once
    more; a second refusal is raised as it is."""
    sent = time.monotonic()
    try:
        return await request()
    except EngineRequestError as exc:
        if adapter is None or not is_missing_model(exc):
            raise
        await reload_adapter(args, adapter, answered_by=_server(exc.url), since=sent)
    return await request()


def _server(url: str) -> str:
    """`http://host:port` of a request's URL: the server (or router) that answered."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


async def reload_adapter(args: Any, name: str, *, answered_by: str = "", since: float = -math.inf) -> bool:
    """Load adapter `name` from its directory on every server of the run, unless this process
    loaded it after `since` (`time.monotonic()`, when the refused request was sent). Returns
    whether it loaded. `AdapterGone` when the directory is gone."""
    heals = _heals.setdefault(asyncio.get_running_loop(), _Heals())
    async with heals.locks.setdefault(name, asyncio.Lock()):
        if heals.loaded_at.get(name, -math.inf) > since:
            return False
        path = adapter_dir(args, name)
        if not path.is_dir():
            raise AdapterGone(f"LoRA adapter {name!r} is not loaded on {answered_by or 'the server'} and its directory "
                              f"{path} is gone (an old version the trainer removed, or a finished run): the request "
                              "cannot be sampled from the policy it names")
        urls = engine_urls(args)
        async with aiohttp.ClientSession(timeout=LOAD_TIMEOUT) as http:
            async def post(url: str, route: str, payload: dict) -> tuple[int, str]:
                async with http.post(url.rstrip("/") + route, json=payload) as resp:
                    return resp.status, await resp.text()
            # not in place: a server that holds it already is left alone
            await asyncio.gather(*(load_adapter(post, url, name, path, inplace=False) for url in urls))
        heals.loaded_at[name] = time.monotonic()
    log.warning("lora.adapter_reloaded", adapter=name, server=answered_by, loaded_on=urls, directory=str(path))
    return True

