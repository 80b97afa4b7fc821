"""What a LoRA run's launcher, trainer and rollouts agree on (no torch: the launcher imports it).

- `lora_server_args`: the flags a LoRA run's policy servers start with (`--enable-lora`,
  `--max-lora-rank`, `--max-loras`), each only where the user did not set it through `--vllm-*`
  or `--vllm-config`, and `RUNTIME_LORA_ENV`, which opens `/v1/load_lora_adapter`.
- `adapter_name(run, version)`: the served name of the run's adapter at a policy version, what
  its rollouts send as `model`; `version_of` reads the version back (vLLM's `weight_versions`
  spans say `default` for a LoRA request: the base's version, not the adapter's).
- the live adapters (`<run_dir>/lora-live.json`): the adapters the servers hold after the last
  sync every server took, which a restarted server loads at boot (`--lora-modules`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
LIVE_FILE = "lora-live.json"
ADAPTERS_DIR = "lora-adapters"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's choices for --max-lora-rank
DEFAULT_ROLLOUT_FUNCTION = "vime.rollout.vllm_rollout.generate_rollout"  # vime.config.resolve's, without its imports
MAX_LORAS = 2  # adapters in one batch: a group's version and the one after it, around a sync


def adapter_name(run: str, version: int) -> str:
    """The served name of a run's adapter at `version`: what its rollouts send as `model`."""
    return f"{run}-v{int(version)}"


def version_of(name: str) -> int | None:
    """The policy version in an adapter's served name (`adapter_name`), None for another name."""
    m = re.search(r"-v(\d+)$", name or "")
    return int(m.group(1)) if m else None


def run_of(name: str) -> str | None:
    """The run in an adapter's served name (`adapter_name`), None for another name."""
    m = re.fullmatch(r"(.+)-v\d+", name or "")
    return m.group(1) if m else None


LOAD_ROUTE = "/v1/load_lora_adapter"


async def load_adapter(post: Any, url: str, name: str, path: str | Path, *, inplace: bool) -> None:
    """Ask the server at `url` to serve the adapter directory `path` as `name`; `post(url, route,
    payload)` sends a request and returns `(status, text)`. `inplace` replaces a name already
    loaded; without it, a server that holds the name (HTTP 400 "already been loaded") is left as it
    is. Any other answer is a `ServiceError`."""
    from vime.errors import ServiceError

    payload = {"lora_name": name, "lora_path": str(path), **({"load_inplace": True} if inplace else {})}
    status, text = await post(url, LOAD_ROUTE, payload)
    if status == 200 or (not inplace and status == 400 and "already been loaded" in text):
        return
    hint = (" (start it with --vllm-enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
            if status == 404 and "lora" not in text.lower() else "")
    raise ServiceError(f"{url} POST {LOAD_ROUTE} {name} (from {path}): HTTP {status} {text.strip()[:300]}{hint}")


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def lora_server_args(rank: int, user_args: Sequence[str]) -> list[str]:
    """Server flags for a run training a rank-`rank` adapter, without those the user set."""
    if rank <= 0:
        return []
    out: list[str] = []
    if not _has_flag(user_args, "--enable-lora"):
        out.append("--enable-lora")
    if not _has_flag(user_args, "--max-lora-rank"):
        out += ["--max-lora-rank", str(next((r for r in VLLM_LORA_RANKS if r >= rank), rank))]
    if not _has_flag(user_args, "--max-loras"):
        out += ["--max-loras", str(MAX_LORAS)]
    return out


def live_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LIVE_FILE


def publish(run_dir: str | Path, version: int, adapters: dict[str, str]) -> None:
    """Record the adapters (`name -> directory`) every server holds at policy `version`."""
    path = live_path(run_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": int(version), "adapters": adapters}))
    os.replace(tmp, path)


def current(run_dir: str | Path | None) -> dict[str, Any] | None:
    """`{"version": v, "adapters": {name: dir}}` of the last sync, or None (no LoRA sync yet);
    adapters whose directory is gone are left out."""
    if run_dir is None:
        return None
    try:
        live = json.loads(live_path(run_dir).read_text())
    except (OSError, ValueError):
        return None
    live["adapters"] = {n: p for n, p in live.get("adapters", {}).items() if Path(p).is_dir()}
    return live


def lora_modules_args(live: dict[str, Any] | None) -> list[str]:
    """`--lora-modules name=dir ...`: a server started with them serves the adapters at boot."""
    if not live or not live.get("adapters"):
        return []
    return ["--lora-modules", *(f"{n}={p}" for n, p in live["adapters"].items())]


def without_lora_modules(args: Sequence[str]) -> list[str]:
    """`args` without a `--lora-modules` flag and its values (a restart sets its own)."""
    out: list[str] = []
    skipping = False
    for a in args:
        if a == "--lora-modules" or a.startswith("--lora-modules="):
            skipping = a == "--lora-modules"
            continue
        if skipping and not a.startswith("--"):
            continue
        skipping = False
        out.append(a)
    return out


def adapters_dir(run_dir: str | Path, run: str) -> Path:
    """Where a run's trainer writes the adapter versions its servers load."""
    return Path(run_dir) / ADAPTERS_DIR / run


def adapter_sync(args: Any) -> bool:
    """Whether a run syncs only its adapter: `--lora-rank` > 0 on the default rollout path
    (`--rollout-env groups` with vime's own rollout and eval functions, not `--fully-async`), whose
    groups request their version's adapter. Other environments and custom whole-step functions do
    not name the adapter yet, so a LoRA run of theirs syncs the merged weights, as before."""
    default = [None, DEFAULT_ROLLOUT_FUNCTION]
    return (int(args.lora_rank or 0) > 0
            and args.rollout_env == "groups"
            and args.rollout_workflow in (None, "RolloutWorkflow")
            and args.rollout_function_path in default
            and args.eval_function_path in default
            and not args.fully_async)


def remove(run_dir: str | Path) -> None:
    """Forget a launch's adapters (the launcher, at its start and end, as with the live weights)."""
    import shutil

    live_path(run_dir).unlink(missing_ok=True)
    shutil.rmtree(Path(run_dir) / ADAPTERS_DIR, ignore_errors=True)
