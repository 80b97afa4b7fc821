"""The policy weights the rollout servers hold now, as a model directory a restarted server boots from.

A vLLM server that dies mid-run must come back serving the *current* policy, not the base
checkpoint: sampling from other weights than the trainer's is silent off-policy data. So after
every successful weight sync the trainer publishes the file it just pushed (`publish`): the
safetensors file moves (a rename, no copy) into a live directory next to symlinks of the base
checkpoint's config and tokenizer files, which makes it a complete HF model directory. The
launcher restarts a dead server with `--model <live dir>` (`current`), so the server's first
request already runs on the current weights; the file's metadata carries the weight version,
which the launcher then tells the server (`/update_weight_version`).

The directory lives in /dev/shm (the weight-sync file is written there already, so publishing is
a rename) under a name derived from the run directory, and is removed when the launch ends
(`remove`): the next launch syncs its servers when the trainer attaches.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

WEIGHTS_FILE = "model.safetensors"
BASE_VERSION = "default"  # the weight version vLLM reports until it is first told one
VERSION_KEY = "vime_weight_version"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")


def live_dir(run_dir: str | Path, root: str | Path = "/dev/shm") -> Path:
    """Where the live weights of the run in `run_dir` are published."""
    key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    base = Path(root) if Path(root).is_dir() else Path(run_dir)
    return base / f"vime-live-{key}"


def _link_model_files(base_checkpoint: Path, target: Path) -> None:
    """Symlink every file of the base checkpoint except weights (and their index) into `target`."""
    target.mkdir(parents=True, exist_ok=True)
    for src in base_checkpoint.iterdir():
        if src.name.endswith(_WEIGHT_SUFFIXES) or src.name.endswith(".index.json") or not src.is_file():
            continue
        link = target / src.name
        if not link.exists():
            tmp = target / f".{src.name}.{os.getpid()}.link"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(src.resolve())
            os.replace(tmp, link)


def publish(weights_file: str | Path, run_dir: str | Path, base_checkpoint: str | Path) -> Path:
    """Move `weights_file` (a safetensors file whose metadata names its version) into the live
    directory of `run_dir`, replacing the previous one atomically; returns the directory."""
    target = live_dir(run_dir, Path(weights_file).parent)
    _link_model_files(Path(base_checkpoint), target)
    os.replace(weights_file, target / WEIGHTS_FILE)
    return target


def read_version(path: str | Path) -> int | None:
    """The weight version in a safetensors file's metadata (read from its JSON header only)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        return int(header.get("__metadata__", {})[VERSION_KEY])
    except (OSError, ValueError, KeyError, struct.error):
        return None


def current(run_dir: str | Path) -> tuple[Path, int] | None:
    """`(model directory, weight version)` of the live weights, or None before the first sync."""
    for root in ("/dev/shm", run_dir):
        directory = live_dir(run_dir, root)
        version = read_version(directory / WEIGHTS_FILE)
        if version is not None and (directory / "config.json").exists():
            return directory, version
    return None


def remove(run_dir: str | Path) -> None:
    for root in ("/dev/shm", run_dir):
        shutil.rmtree(live_dir(run_dir, root), ignore_errors=True)
