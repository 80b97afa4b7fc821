"""What evaluating costs a fully async run: the same run with and without `--eval-interval`,
side by side in one run.

    .venv/bin/python bench/eval_cost.py [--steps 10] [--eval-interval 2] [--eval-prompts 32]
                                        [--n-samples-per-eval-prompt 4] [--vllm-url URL] [--out DIR]
                                        [-- VIME_FLAGS ...]

Both runs train the same task (the tiny model, 8 prompts x 4 samples per step, exact-match
reward) in fully async mode (`--max-staleness 1 --max-concurrent-rollouts 16`) on one shared
vLLM CPU server (started here, or `--vllm-url`); the second also evaluates `--eval-prompts`
held-out prompts every `--eval-interval` steps (flags after `--` go to both runs: a reward
hook, a longer response). In fully async mode the trainer goes on while a
round samples, its syncs held (`workflows.eval_beside`), so the cost is what the round's
sampling takes from the rollouts on the same servers, and the steps that wait for it past the
staleness bound.

Prints each run's training throughput in steps per minute, from the end of the first step to the
end of the last (start-up and the round after the last step left out of both: they are not
training time), the rounds' own seconds, and the ratio with/without. A run that failed, a
step with a failed sample, or an eval round with a failed sample fails the benchmark: no
figures, exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vime.metrics_log import read_metrics  # noqa: E402
from vime.store import SampleStore  # noqa: E402

ASYNC = ["--fully-async", "--max-staleness", "1", "--max-concurrent-rollouts", "16"]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run_mode(name: str, out: Path, model: Path, url: str, opts, flags: list[str]) -> dict:
    """One run to its end; its steps per minute, or SystemExit naming what failed."""
    run_dir = out / name
    argv = [sys.executable, "-m", "vime.cli", "train", "--hf-checkpoint", str(model),
            "--prompt-data", str(out / "prompts.jsonl"), "--input-key", "prompt", "--label-key", "label",
            "--rm-type", "exact_match", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
            "--num-rollout", str(opts.steps), "--rollout-max-response-len", "8", "--run-dir", str(run_dir),
            "--vllm-router-ip", url.split("//")[1].split(":")[0], "--vllm-router-port", url.rsplit(":", 1)[1],
            "--vllm-server-urls", url, *ASYNC, *flags]
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING",
           "PYTHONPATH": f"{Path.cwd()}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # hooks named after --
    with open(out / f"{name}.out", "w") as console:
        code = subprocess.run(argv, cwd=REPO, env=env, stdout=console, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise SystemExit(f"eval_cost: FAILED: the {name} run exited {code}; see {out / f'{name}.out'}")
    with SampleStore.open(run_dir) as store:
        manifests = [store.read_step_manifest(run_dir.name, s) for s in range(opts.steps)]
        rounds = store.eval_rounds(run_dir.name)
    errors = sum(m.meta.get("errors", 0) for m in manifests if m is not None)
    eval_failed = sum(v for r in rounds for k, v in r.metrics.items() if k.endswith("/failed"))
    if errors or eval_failed or any(m is None for m in manifests):
        raise SystemExit(f"eval_cost: FAILED: the {name} run has {errors} failed training samples, {eval_failed} "
                         f"failed eval samples or missing steps; see {out / f'{name}.out'}")
    steps = [m for m in read_metrics(run_dir) if not m.get("eval_only")]
    seconds = steps[-1]["finished_at"] - steps[0]["finished_at"]
    return {"steps_per_minute": 60 * (len(steps) - 1) / seconds, "seconds": seconds, "rounds": len(rounds),
            "eval_seconds": sum(r.metrics.get("eval_seconds", 0.0) for r in rounds),
            "held": sum(1 for m in steps if m.get("sync_held"))}


@contextlib.contextmanager
def rollout_server(opts, out: Path, model: Path):
    """The server both runs share: `--vllm-url`, or one started here."""
    if opts.vllm_url:
        yield opts.vllm_url
        return
    from vime.engine.server import VLLMServer
    from vime.engine.weight_sync.protocol import weight_sync_server_args

    server = VLLMServer(model, server_args=[*weight_sync_server_args(), "--max-model-len", "512", "--seed", "0"],
                        log_path=out / "vllm.log")
    with server:
        yield server.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-interval", type=int, default=2)
    parser.add_argument("--eval-prompts", type=int, default=32)
    parser.add_argument("--n-samples-per-eval-prompt", type=int, default=4)
    parser.add_argument("--vllm-url", default=None,
                        help="a running vLLM server of the tiny model (else one is started)")
    parser.add_argument("--out", default=str(REPO / "runs" / time.strftime("eval-cost-%Y%m%d-%H%M%S")))
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    opts = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "prompts.jsonl", [{"prompt": f"say {i}", "label": "1"} for i in range(64)])
    heldout = write_jsonl(out / "heldout.jsonl", [{"prompt": f"count {i}", "label": "1"}
                                                  for i in range(opts.eval_prompts)])
    eval_flags = ["--eval-interval", str(opts.eval_interval), "--eval-prompt-data", "heldout", str(heldout),
                  "--n-samples-per-eval-prompt", str(opts.n_samples_per_eval_prompt)]

    from vime.testing.tiny_model import tiny_model_dir

    model = tiny_model_dir()
    print(f"eval_cost: {opts.steps} fully async steps each, eval of {opts.eval_prompts} prompts x "
          f"{opts.n_samples_per_eval_prompt} every {opts.eval_interval} steps, in {out}", flush=True)
    with rollout_server(opts, out, model) as url:
        results = {"eval": run_mode("eval", out, model, url, opts, [*eval_flags, *extra]),
                   "no eval": run_mode("no-eval", out, model, url, opts, extra)}
    for name, r in reversed(results.items()):
        rounds = f", {r['rounds']} round(s) of {r['eval_seconds']:.1f} s, {r['held']} step(s) trained with syncs held" \
            if r["rounds"] else ""
        print(f"{name:>8}: {r['steps_per_minute']:.1f} steps/min ({opts.steps - 1} steps in {r['seconds']:.1f} s)"
              f"{rounds}", flush=True)
    ratio = results["eval"]["steps_per_minute"] / results["no eval"]["steps_per_minute"]
    print(f"eval_cost: with eval every {opts.eval_interval} steps, training runs at {ratio:.2f}x the steps/min "
          f"of the run without ({100 * (1 - ratio):+.0f}% cost)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
