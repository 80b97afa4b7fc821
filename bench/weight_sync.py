"""Weight sync engines side by side: file vs collective, dense vs delta, against a raw gloo broadcast.

    python bench/weight_sync.py [--sizes tiny,100m,500m] [--fraction 0.01] [--repeats 2]
                                [--file-server URL] [--collective-server URL]

For each size, a model of the tiny test model's architecture (Qwen2, tied embeddings): `tiny`
is `vime.testing.tiny_model`; `100m` and `500m` are built here from a config with random
weights (nothing downloads), saved in bf16. Each size gets two vLLM CPU servers, one per
engine (the backend is fixed at server start), unless `--file-server` / `--collective-server`
name running ones (one size only, serving that size's model). The trainer is the model in
transformers, in bf16; every sync is checked with `verify_sync`.

Rows per size:
- file dense: `WeightSync(engine="file")`, the file written to /dev/shm and loaded;
- collective dense: `WeightSync(engine="collective")`, bucketed gloo broadcast;
- collective delta: `update_mode="delta"` after a step that moves `--fraction` of the elements;
- raw broadcast: the dense bytes in one `torch.distributed` gloo broadcast between two plain
  processes (the floor: no vLLM, no load).

Columns: pause seconds, whole-sync seconds, wire bytes, changed/total elements, and the ratio
of the row's whole-sync seconds to the raw broadcast's (the goal for collective dense: <= 2x).
Median of `--repeats` syncs after a warm-up one per engine (server init, rendezvous). A failed
sync, in any size, fails the benchmark: one line on stderr, no table, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from vime.engine.weight_sync.collective import Rendezvous, SyncGroup, broadcast, join_group, open_store  # noqa: E402
from vime.engine.server import VLLMServer  # noqa: E402
from vime.engine.weight_sync.protocol import weight_sync_server_args  # noqa: E402
from vime.engine.weight_sync.staging import SyncReport  # noqa: E402
from vime.engine.weight_sync.sync import WeightSync  # noqa: E402
from vime.engine.weight_sync.verify import reference_logprobs, verify_sync  # noqa: E402
from vime.testing.tiny_model import tiny_model_dir  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SIZES = {  # hidden, layers, intermediate (head_dim 64, 2 KV heads)
    "100m": (768, 16, 2048),
    "500m": (1280, 28, 3584),
}
ATOL = 5e-2  # bf16 trainer vs bf16 server, as the trainer checks a bf16 run
PROBE = list(range(10, 42))


class SyncFailed(Exception):
    pass


@dataclass
class Row:
    name: str
    pause: float
    total: float
    wire_bytes: int
    changed: int
    total_elements: int


def build_model(size: str, root: Path) -> Path:
    """`size`'s model directory: the tiny model, or a bigger one of its architecture with random weights."""
    tiny = tiny_model_dir()
    if size == "tiny":
        return tiny
    from transformers import AutoConfig, Qwen2ForCausalLM

    hidden, layers, intermediate = SIZES[size]
    out = root / f"qwen2-{size}"
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True)
    for f in tiny.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "merges.txt", "generation_config.json"):
            shutil.copy(f, out / f.name)
    config = AutoConfig.from_pretrained(tiny)
    config.hidden_size, config.num_hidden_layers, config.intermediate_size = hidden, layers, intermediate
    config.num_attention_heads, config.num_key_value_heads = hidden // 64, 2
    config.layer_types = ["full_attention"] * layers
    config.max_window_layers = layers
    config.dtype = "bfloat16"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    return out


def load_trainer(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()


def step(model: torch.nn.Module, seed: int, fraction: float) -> None:
    """An optimizer-like step: `fraction` of each parameter's elements move by ~1e-2 relative."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=gen) < fraction
            p.add_((torch.randn(p.shape, generator=gen) * 0.02 * mask).to(p.dtype))


async def checked_sync(sync: WeightSync, model, url: str) -> SyncReport:
    try:
        report = await sync.sync(model.state_dict())
        await verify_sync(url, PROBE, reference_logprobs(model, PROBE), atol=ATOL)
    except Exception as e:
        raise SyncFailed(f"{sync.engine} {sync.update_mode} sync to {url}: {' '.join(str(e).split())[:400]}") from e
    return report


def row(name: str, reports: list[SyncReport]) -> Row:
    last = reports[-1]
    return Row(name, statistics.median(r.pause_seconds for r in reports),
               statistics.median(r.total_seconds for r in reports), last.wire_bytes, last.changed, last.total)


async def measure(model, file_url: str, collective_url: str, repeats: int, fraction: float) -> list[Row]:
    """Each engine's first sync (server init, the collective rendezvous) is a warm-up, not counted."""
    rows = []
    async with WeightSync(file_url, dtype=torch.bfloat16) as sync:
        await checked_sync(sync, model, file_url)
        rows.append(row("file dense", [await checked_sync(sync, model, file_url) for _ in range(repeats)]))
    async with WeightSync(collective_url, engine="collective", dtype=torch.bfloat16) as sync:
        await checked_sync(sync, model, collective_url)
        rows.append(row("collective dense", [await checked_sync(sync, model, collective_url) for _ in range(repeats)]))
    async with WeightSync(collective_url, engine="collective", update_mode="delta", dtype=torch.bfloat16) as sync:
        await checked_sync(sync, model, collective_url)  # the first sync of delta mode is dense
        deltas = []
        for i in range(repeats):
            step(model, seed=100 + i, fraction=fraction)
            deltas.append(await checked_sync(sync, model, collective_url))
        rows.append(row("collective delta", deltas))
    return rows


def _raw_receiver(info: dict, nbytes: int) -> None:
    rz = Rendezvous(info["host"], info["port"], info["world_size"], info["prefix"], info["timeout_s"])
    store = open_store(rz.host, rz.port, is_master=False, world_size=2, timeout_s=rz.timeout_s)
    group = join_group(store, rz, 1, torch.device("cpu"))
    buf = torch.empty(nbytes, dtype=torch.uint8)
    for _ in range(2):
        broadcast(group, buf)
        broadcast(group, torch.zeros(1, dtype=torch.uint8))


def raw_broadcast_seconds(nbytes: int) -> float:
    """One gloo broadcast of `nbytes` between this process and a plain child, the second of two."""
    group = SyncGroup(2, advertise_host="127.0.0.1", timeout_s=120)
    proc = mp.get_context("spawn").Process(target=_raw_receiver, args=(group.init_info(1), nbytes))
    proc.start()
    try:
        group.join()
        data, done = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8)
        seconds = []
        for _ in range(2):
            t0 = time.perf_counter()
            broadcast(group.group, data)
            broadcast(group.group, done)  # returns on the root once the receiver took the data
            seconds.append(time.perf_counter() - t0)
    finally:
        proc.join(timeout=60)
    return seconds[-1]


def start_server(model_dir: Path, engine: str, log_dir: Path) -> VLLMServer:
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    return VLLMServer(model_dir, server_args=[*weight_sync_server_args(engine), "--max-model-len", "512",
                                              "--seed", "0"],
                      log_path=log_dir / f"vllm-{engine}.log", env=env).start()


def run_size(size: str, args, root: Path) -> list[Row]:
    model_dir = build_model(size, root)
    model = load_trainer(model_dir)
    servers = []
    try:
        if args.file_server and args.collective_server:
            urls = (args.file_server, args.collective_server)
        else:
            servers = [start_server(model_dir, e, root) for e in ("file", "collective")]
            for s in servers:
                s.wait_healthy(900)
            urls = (servers[0].url, servers[1].url)
        rows = asyncio.run(measure(model, *urls, repeats=args.repeats, fraction=args.fraction))
    finally:
        for s in servers:
            s.stop()
    dense_bytes = rows[1].wire_bytes
    raw = raw_broadcast_seconds(dense_bytes)
    return [*rows, Row("raw gloo broadcast", 0.0, raw, dense_bytes, rows[1].changed, rows[1].total_elements)]


def print_table(size: str, params: int, rows: list[Row]) -> None:
    raw = rows[-1].total
    print(f"\n{size} ({params / 1e6:.1f}M parameters)")
    print(f"{'engine':<20} {'pause s':>8} {'sync s':>8} {'wire MB':>9} {'changed/total':>24} {'ratio to raw':>12}")
    for r in rows:
        print(f"{r.name:<20} {r.pause:>8.3f} {r.total:>8.3f} {r.wire_bytes / 1e6:>9.2f} "
              f"{f'{r.changed}/{r.total_elements}':>24} {r.total / raw:>11.1f}x")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="tiny,100m", help="comma-separated: tiny, 100m, 500m")
    parser.add_argument("--fraction", type=float, default=0.01, help="share of elements a delta step moves")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--file-server", help="a running server with the file engine (one size only)")
    parser.add_argument("--collective-server", help="a running server with the collective engine (one size only)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s != "tiny" and s not in SIZES]
    if unknown:
        parser.error(f"unknown size {unknown[0]!r}; choose from tiny, {', '.join(SIZES)}")
    if (args.file_server or args.collective_server) and (len(sizes) != 1 or not (args.file_server and
                                                                                 args.collective_server)):
        parser.error("--file-server and --collective-server go together, with one --sizes")
    results: dict[str, list[Row]] = {}
    with tempfile.TemporaryDirectory(prefix="vime-bench-weight-sync-") as tmp:
        root = Path(os.environ.get("VIME_BENCH_MODELS", tmp))
        for size in sizes:
            try:
                results[size] = run_size(size, args, root)
            except SyncFailed as e:  # no figures at all: a failed sync makes the others suspect too
                print(f"weight_sync: FAILED ({size}): {e}", file=sys.stderr)
                return 1
    for size, rows in results.items():
        print_table(size, rows[1].total_elements, rows)
    print(f"\nload: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps({k: [r.__dict__ for r in v] for k, v in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
