"""The rollout phase at the engine's speed? One step's rollouts through `vime train` vs the same
requests sent straight to the same vLLM server, alternating in one run (issue #25, item 2).

    .venv/bin/python bench/rollout_overhead.py [--rounds 3] [--steps 3] [--max-response-len 16]
                                               [--floor] [--vllm-url URL] [--out DIR] [-- QUICKSTART_FLAGS ...]

One vLLM CPU server of the tiny model (started here, or `--vllm-url`, which must take weight
syncs). Each round:

(a) vime: the quickstart (`python -m examples.quickstart.run`, 8 prompts x 8 samples, 16 tokens,
    synchronous) for `--steps` steps on that server: its own Temporal dev server, rollout worker
    and trainer, the training workflow starting a child `RolloutWorkflow` per group, each
    generating, rewarding and storing its group in one local activity. The figure is each step's
    `rollout_wait_seconds` from `metrics.jsonl` (what the training workflow waited for the step's
    groups), steps after the first (the first warms caches);
(b) direct: for each of those steps, its 64 requests again, straight to the server with
    concurrent HTTP (`asyncio.gather`): the stored samples' prompt ids (after the chat
    template), their seeds (`--rollout-seed + index`) and the run's sampling parameters, through
    the same `EngineClient` vime's generate uses, after a `/reset_prefix_cache` (vime's requests
    of that step found none of their prompts cached either). The figure is the batch's wall time.

With `--floor`, `--rounds` more runs follow the rounds (last, as they train on fixed tokens and
sync those weights into the server too):

(c) vime without an engine: the same quickstart with a generate hook that samples nothing
    (`fixed_generate`: the prompt's ids and `--max-response-len` fixed tokens, no HTTP); its
    rollout wait is what the orchestration alone costs a step (8 child workflows, their local
    activities, the reward, the store writes), the part of (a) that no engine speed removes.

Prints the medians of each side, the mean response length of (a) and (b) (the weights differ
between the two: each vime step samples from the weights of the step before, the direct side from
the round's last), and the ratio vime/direct against the goal of 1.3. A vime run that failed, a
step with a failed sample, or a failed direct request fails the bench: one line, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GOAL = 1.3


class BenchFailed(Exception):
    """A rollout or a request failed; the message says which and where to look."""


def server_flags(url: str) -> list[str]:
    host, port = url.split("//")[1].rsplit(":", 1)
    return ["--vllm-router-ip", host, "--vllm-router-port", port, "--vllm-server-urls", url]


async def fixed_generate(args, sample, sampling_params):
    """A generate hook that samples nothing (`--floor`): the prompt's ids, then `max_tokens`
    fixed response tokens, each with log-prob -1; no request leaves the rollout worker."""
    from vime.rollout.generate import prompt_token_ids
    from vime.types import Sample

    if not sample.tokens:
        sample.tokens = prompt_token_ids(args, sample)
    n = int(sampling_params.get("max_tokens") or 16)
    sample.tokens = [*sample.tokens, *((sample.index * 7 + i) % 200 + 10 for i in range(n))]
    sample.response_length, sample.loss_mask, sample.rollout_log_probs = n, [1] * n, [-1.0] * n
    sample.status = Sample.Status.COMPLETED
    return sample


def run_vime(run_dir: Path, url: str, steps: int, max_len: int, extra: list[str]) -> list[float]:
    """The quickstart for `steps` steps on `url`; each step's rollout wait after the first."""
    from vime.metrics_log import read_metrics
    from vime.store import SampleStore

    argv = [sys.executable, "-m", "examples.quickstart.run", "--run-dir", str(run_dir), "--num-rollout", str(steps),
            "--rollout-max-response-len", str(max_len), "--save-interval", str(steps + 1), *server_flags(url),
            *extra]
    console = run_dir.with_suffix(".out")
    with open(console, "w") as log:
        code = subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}"},
                              stdout=log,
                              stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise BenchFailed(f"the vime run exited {code}; see {console}")
    with SampleStore.open(run_dir) as store:
        manifests = [store.read_step_manifest(run_dir.name, s) for s in range(steps)]
    errors = sum(m.meta.get("errors", 0) for m in manifests if m is not None)
    metrics = [m for m in read_metrics(run_dir) if not m.get("eval_only") and "rollout_wait_seconds" in m]
    if errors or any(m is None for m in manifests) or len(metrics) != steps:
        raise BenchFailed(f"the vime run stored {errors} failed samples or is missing steps "
                          f"({len(metrics)}/{steps} in metrics.jsonl); see {console}")
    return [m["rollout_wait_seconds"] for m in sorted(metrics, key=lambda m: m["step"])[1:]]


def step_requests(run_dir: Path, url: str, step: int, max_len: int, extra: list[str]) -> list[tuple[list[int], dict]]:
    """Step `step`'s requests as vime sent them: (prompt ids, sampling params with the sample's seed)."""
    from examples.quickstart.run import default_flags
    from vime.config.args import parse_args
    from vime.rollout.generate import max_model_len
    from vime.rollout.sampling import params_for_sample, sampling_params_from_args
    from vime.store import SampleStore
    from vime.testing.tiny_model import tiny_model_dir

    args = parse_args([*default_flags(run_dir, str(tiny_model_dir())), "--rollout-max-response-len", str(max_len),
                       *server_flags(url), *extra])
    base, limit = sampling_params_from_args(args), max_model_len(args)
    with SampleStore.open(run_dir) as store:
        samples = store.read_step_samples(run_dir.name, step)
    requests = []
    for s in samples:
        prompt = s.tokens[:len(s.tokens) - s.response_length]
        params = params_for_sample(base, args, s)
        if limit is not None:
            params["max_tokens"] = min(params["max_tokens"], limit - len(prompt))
        requests.append((prompt, params))
    return requests


async def send_direct(url: str, requests: list[tuple[list[int], dict]]) -> tuple[float, float]:
    """All requests at once; (wall seconds, mean response tokens). A failed request raises BenchFailed."""
    from vime.engine.client import EngineClient

    client = EngineClient(url)
    try:
        try:
            await client.post_json("/reset_prefix_cache")  # the step's prompts were just sent by vime
        except Exception as e:
            raise BenchFailed(f"POST {url}/reset_prefix_cache failed ({e}); the server needs VLLM_SERVER_DEV_MODE=1")
        t0 = time.perf_counter()
        results = await asyncio.gather(*(client.generate(ids, params) for ids, params in requests),
                                       return_exceptions=True)
        wall = time.perf_counter() - t0
    finally:
        await client.close()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise BenchFailed(f"{len(failed)}/{len(requests)} direct requests failed; first error: {failed[0]!r}")
    return wall, statistics.mean(len(r.token_ids) for r in results)


def mean_response_len(run_dir: Path, steps: list[int]) -> float:
    from vime.store import SampleStore

    with SampleStore.open(run_dir) as store:
        return statistics.mean(s.response_length for step in steps
                               for s in store.read_step_samples(run_dir.name, step))


@contextlib.contextmanager
def rollout_server(url: str | None, out: Path):
    """`--vllm-url`, or a server of the tiny model started here (it takes the runs' weight syncs)."""
    if url:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
                r.read()
        except OSError as e:
            raise BenchFailed(f"cannot reach vLLM at {url}/health ({e})") from None
        yield url
        return
    from vime.engine.server import VLLMServer
    from vime.engine.weight_sync.protocol import weight_sync_server_args
    from vime.testing.tiny_model import tiny_model_dir

    server = VLLMServer(tiny_model_dir(), server_args=[*weight_sync_server_args(), "--max-model-len", "512",
                                                       "--seed", "0"], log_path=out / "vllm.log")
    with server:
        yield server.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="vime/direct pairs, alternating")
    parser.add_argument("--steps", type=int, default=3, help="quickstart steps per round (the first is not counted)")
    parser.add_argument("--max-response-len", type=int, default=16)
    parser.add_argument("--vllm-url", default=None, help="a running vLLM server of the tiny model that takes "
                        "weight syncs (else one is started)")
    parser.add_argument("--floor", action="store_true", help="also run the quickstart with a generate hook that "
                        "samples nothing: the rollout phase's orchestration alone")
    parser.add_argument("--out", default=str(REPO / "runs" / time.strftime("rollout-overhead-%Y%m%d-%H%M%S")))
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    opts = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if opts.steps < 2:
        parser.error("--steps must be >= 2 (the first step is not counted)")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)

    from vime.testing.tiny_model import tiny_model_dir

    tiny_model_dir()
    print(f"rollout_overhead: {opts.rounds} round(s) of {opts.steps - 1} counted quickstart step(s) (8 prompts x 8 "
          f"samples, {opts.max_response_len} tokens), then the same requests direct; runs in {out}", flush=True)
    vime: list[float] = []
    direct: list[float] = []
    floor: list[float] = []
    vime_len: list[float] = []
    direct_len: list[float] = []
    try:
        with rollout_server(opts.vllm_url, out) as url:
            for i in range(1, opts.rounds + 1):
                run_dir = out / f"round-{i}"
                waits = run_vime(run_dir, url, opts.steps, opts.max_response_len, extra)
                counted = list(range(1, opts.steps))
                vime += waits
                vime_len.append(mean_response_len(run_dir, counted))
                walls = []
                for step in counted:
                    wall, tokens = asyncio.run(send_direct(url, step_requests(
                        run_dir, url, step, opts.max_response_len, extra)))
                    walls.append(wall)
                    direct_len.append(tokens)
                direct += walls
                print(f"round {i}: vime rollout " + " ".join(f"{w:.2f}" for w in waits) + " s; direct " +
                      " ".join(f"{w:.2f}" for w in walls) + " s", flush=True)
            for i in range(1, opts.rounds + 1 if opts.floor else 1):  # after the others: their weights are synced too
                waits = run_vime(out / f"floor-{i}", url, opts.steps, opts.max_response_len,
                                 [*extra, "--custom-generate-function-path", "rollout_overhead.fixed_generate"])
                floor += waits
                print(f"floor {i}: vime rollout without an engine " + " ".join(f"{w:.2f}" for w in waits) + " s",
                      flush=True)
    except BenchFailed as e:
        print(f"rollout_overhead: FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    v, d = statistics.median(vime), statistics.median(direct)
    print(f"vime rollout phase (median of {len(vime)} steps): {v:.2f} s, {statistics.mean(vime_len):.1f} "
          "response tokens per sample")
    print(f"direct, same requests (median of {len(direct)} batches): {d:.2f} s, {statistics.mean(direct_len):.1f} "
          "response tokens per sample")
    if floor:
        f = statistics.median(floor)
        print(f"vime without an engine (median of {len(floor)} steps): {f:.2f} s: the orchestration alone, "
              f"{f / d:.2f}x the direct batch")
    print(f"rollout_overhead: vime/direct {v / d:.2f}x (goal <= {GOAL}x: {'met' if v / d <= GOAL else 'missed'}); "
          f"{v - d:+.2f} s a step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
