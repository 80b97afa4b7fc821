"""Fully async vs synchronous training on heavy-tailed episodes, side by side in one run.

    .venv/bin/python bench/async_speedup.py [--steps 12] [--scale 0.25] [--sigma 1.5] [--out DIR]

Both runs train the quickstart task (tiny model, 8 prompts x 8 samples per step, the capitals
reward) for the same number of steps, so they consume the same number of samples, on one shared
vLLM CPU server. Every episode first waits out a declared environment latency drawn from a
seeded lognormal (`scale x lognormal(0, sigma)` seconds, the same draw for the same sample in
both runs: a stand-in for a tool call or a slow sandbox whose cost has a long tail), then
generates on vLLM.

- sync: `--max-staleness 0`, each step gathers all of its groups (the slowest episode holds it);
- async: `--fully-async --max-staleness 1 --max-concurrent-rollouts 16`: steps take groups in the
  order they finish, and the next step's groups generate while the trainer trains.

Prints, for each: seconds for the steps after the first (start-up left out of both), median
seconds per step, mean reward of the first and last 3 steps, and the wall-time ratio. A run that
failed, or any step with a failed sample, fails the benchmark: no figures, exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vime.store import SampleStore  # noqa: E402

HOOK = """
import asyncio, math, random
from vime.rollout.generate import generate as vllm_generate

SCALE, SIGMA = {scale}, {sigma}

def latency(sample) -> float:
    rng = random.Random(f"{{sample.group_index}}-{{sample.index}}")
    return SCALE * rng.lognormvariate(0.0, SIGMA)

async def generate(args, sample, sampling_params):
    await asyncio.sleep(latency(sample))  # the declared environment latency of this episode
    return await vllm_generate(args, sample, sampling_params)
"""

MODES = {
    "sync": ["--max-staleness", "0"],
    "async": ["--fully-async", "--max-staleness", "1", "--max-concurrent-rollouts", "16"],
}


def run_mode(name: str, out: Path, server, steps: int) -> dict:
    run_dir = out / name
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING",
           "PYTHONPATH": f"{out}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-m", "examples.quickstart.run", "--run-dir", str(run_dir), "--num-rollout", str(steps),
            "--save-interval", str(steps), "--use-tis", "--custom-generate-function-path", "heavy_tail.generate",
            "--vllm-router-ip", server.host, "--vllm-router-port", str(server.port), "--vllm-server-urls", server.url,
            *MODES[name]]
    with open(out / f"{name}.out", "w") as console:
        code = subprocess.run(argv, cwd=REPO, env=env, stdout=console, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise SystemExit(f"async_speedup: FAILED: the {name} run exited {code}; see {out / f'{name}.out'}")
    metrics = json.loads((run_dir / "summary.json").read_text())["metrics"]
    with SampleStore.open(run_dir) as store:
        manifests = [store.read_step_manifest(run_dir.name, s) for s in range(steps)]
    errors = sum(m.meta.get("errors", 0) for m in manifests if m is not None)
    if errors or any(m is None for m in manifests):
        raise SystemExit(f"async_speedup: FAILED: the {name} run has {errors} failed samples "
                         f"or missing steps; see {out / f'{name}.out'}")
    done = [m["finished_at"] for m in metrics]
    rewards = [m["reward_mean"] for m in metrics]
    return {"seconds": done[-1] - done[0], "per_step": statistics.median(b - a for a, b in zip(done, done[1:])),
            "first": sum(rewards[:3]) / 3, "last": sum(rewards[-3:]) / 3,
            "staleness": statistics.mean(m.get("staleness_mean", 0.0) for m in metrics),
            "dropped": sum(m.get("dropped_groups", 0) for m in metrics)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--scale", type=float, default=0.25, help="seconds: the lognormal's median latency")
    parser.add_argument("--sigma", type=float, default=1.5, help="the lognormal's shape: larger, longer tail")
    parser.add_argument("--out", default=str(REPO / "runs" / time.strftime("async-speedup-%Y%m%d-%H%M%S")))
    opts = parser.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "heavy_tail.py").write_text(HOOK.format(scale=opts.scale, sigma=opts.sigma))

    from vime.engine.server import VLLMServer
    from vime.engine.weight_sync.protocol import weight_sync_server_args
    from vime.testing.tiny_model import tiny_model_dir

    model = tiny_model_dir()
    server = VLLMServer(model, server_args=[*weight_sync_server_args(), "--max-model-len", "512", "--seed", "0"],
                        log_path=out / "vllm.log")
    print(f"async_speedup: {opts.steps} steps each, latency {opts.scale} x lognormal(0, {opts.sigma}) s per "
          f"episode, in {out}", flush=True)
    with server:
        results = {name: run_mode(name, out, server, opts.steps) for name in MODES}
    for name, r in results.items():
        print(f"{name:>5}: {opts.steps - 1} steps in {r['seconds']:.1f} s (median {r['per_step']:.2f} s/step), "
              f"reward {r['first']:.2f} -> {r['last']:.2f}, mean staleness {r['staleness']:.2f}, "
              f"{r['dropped']} groups dropped", flush=True)
    ratio = results["sync"]["seconds"] / results["async"]["seconds"]
    print(f"async_speedup: fully async is {ratio:.2f}x faster than sync on the same samples "
          f"(final reward sync {results['sync']['last']:.2f}, async {results['async']['last']:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
