"""A run on a `--vllm-config` topology: an actor on two servers behind its router, and a frozen reward
model that the reward function calls through `args.vllm_model_routers`. The run trains; only the
actor's servers take weights; the reward model's server killed mid-run comes back on its
checkpoint and the rollouts that lost it are retried."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.runs import TrainRun
from vime.procs import leftover_processes
from vime.store import SampleStore

pytestmark = pytest.mark.vllm

REWARD_FUNCTION = '''
import json, os, aiohttp

async def score(args, sample, **kwargs):
    """The reward model's probability of its own greedy next token after the response: a number
    only the reward model's server can give, recorded with that server's weight version."""
    url = args.vllm_model_routers["reward"]
    async with aiohttp.ClientSession() as http:
        body = {"model": "rm", "prompt": (sample.response or "") + " ok", "max_tokens": 1, "temperature": 0,
                "logprobs": 1}
        async with http.post(url + "/v1/completions", json=body) as r:
            r.raise_for_status()
            logprob = (await r.json())["choices"][0]["logprobs"]["token_logprobs"][0]
        async with http.get(url + "/weight_info") as r:
            version = (await r.json())["weight_version"]
    with open(os.environ["REWARD_CALLS"], "a") as f:
        f.write(json.dumps({"url": url, "version": version, "actor": args.vllm_model_routers["actor"]}) + "\\n")
    return 2.718281828 ** logprob
'''


def test_an_actor_on_two_servers_trains_while_a_frozen_reward_model_scores(tiny_model_dir, tmp_path):
    reward_model = tmp_path / "rm"
    shutil.copytree(tiny_model_dir, reward_model)  # another checkpoint: frozen unless it says otherwise
    (tmp_path / "rm_client.py").write_text(REWARD_FUNCTION)
    topology = tmp_path / "serving.yaml"
    topology.write_text(f"""
vllm:
  - name: actor
    server_groups:
      - worker_type: regular
        num_gpus: 2
        overrides: {{max_num_seqs: 8}}
  - name: reward
    model_path: {reward_model}
    server_groups:
      - worker_type: regular
        num_gpus: 1
        overrides: {{max_model_len: 256}}
""")
    calls = tmp_path / "reward_calls.jsonl"
    steps = 12  # enough left after the kill at step 1 that the run needs the reward model again (a step is ~0.5 s)
    run = TrainRun(tmp_path, tiny_model_dir, "--vllm-config", str(topology), "--vllm-max-model-len", "512",
                   "--custom-rm-path", "rm_client.score", steps=steps, groups=2, n=2,
                   env={"REWARD_CALLS": str(calls)})
    try:
        run.start()
        run.wait_for_step(1)
        os.kill(server_of(run, reward_model), signal.SIGKILL)  # the reward model dies under the reward function
        assert run.wait(timeout=1200) == 0, run.tail()
        out = run.output()
        assert "starting 2 vLLM server(s) for actor" in out and "starting 1 vLLM server(s) for reward" in out
        assert "vLLM server reward 0" in out and "serving its checkpoint (a frozen model)" in out, run.tail()
        assert f"finished: {steps} steps" in out
        run.assert_trained_exactly_once()

        records = [json.loads(line) for line in calls.read_text().splitlines()]
        assert len(records) >= steps * 2 * 2  # every sample scored by the reward model's server (retries too)
        assert {r["version"] for r in records} == {records[0]["version"]}  # never updated
        actor_url = records[0]["actor"]
        assert actor_url not in {r["url"] for r in records}

        def weight_updates(log_name: str) -> int:
            return (run.run_dir / log_name).read_text().count('"POST /update_weights HTTP/1.1" 200')

        actor_updates = [weight_updates(f"vllm-actor-{i}.log") for i in range(2)]
        assert actor_updates[0] == actor_updates[1] >= steps  # both actor servers took every sync
        assert weight_updates("vllm-reward-0.log") == 0
        assert "'max_model_len': 256" in (run.run_dir / "vllm-reward-0.log").read_text()  # its group's override
        with SampleStore.open(run.run_dir) as store:
            samples = [sample for _, sample in store.iter_samples(run.run_id)]
        versions = {str(span["version"] if isinstance(span, dict) else span) for s in samples for span in s.weight_versions}
        assert all(0 < s.reward < 1 for s in samples)  # the reward model's probabilities
        assert len(versions) >= 2, versions  # rollouts sampled from weights that moved
        run.assert_nothing_left()
    finally:
        run.kill_all()


def server_of(run: TrainRun, model: Path) -> int:
    """The pid of the vLLM server of `model` that `run` started (not the guard in front of it)."""
    for pid in leftover_processes(run.run_dir):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vime.procguard" not in cmd and b"vllm.entrypoints.openai.api_server" in cmd and str(model).encode() in cmd:
            return pid
    raise AssertionError(f"no vLLM server of {model} is running")
