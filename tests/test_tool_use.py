"""examples/tool_use: the model's Python runs in a bubblewrap sandbox under limits, whatever it
does comes back as an observation the model reads but is not trained on, a rollout resumes at
its last finished turn after a crash, and the tiny model learns the task after a warm start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from vime.config.args import parse_args
from vime.engine.client import GenerateOutput
from vime.envs.base import EnvContext, GroupInput, GroupOutput
from vime.envs.tool_use.activities import ToolUseActivities
from vime.envs.tool_use.task import DECLINE, Problem, write_prompts
from vime.envs.tool_use.tool import ToolLimits, run_code, tool_sandbox
from vime.envs.tool_use.workflow import ToolUseGroupWorkflow
from vime.errors import ConfigError, ServiceError
from vime.store import SampleStore

LIMITS = ToolLimits(timeout=1.0, memory_mb=128, tmp_mb=8)
REPO = Path(__file__).resolve().parent.parent


# ---- the sandbox: limits, and every outcome an observation ------------------------------------


async def run_once(code: str, limits: ToolLimits = LIMITS):
    async with tool_sandbox("bwrap", limits) as sandbox:
        t0 = time.monotonic()
        run = await run_code(sandbox, code, limits)
        return run, run.observation(limits), time.monotonic() - t0


async def test_the_models_code_runs_and_its_output_is_the_observation():
    run, obs, _ = await run_once("print(37*58)")
    assert (run.rc, obs) == (0, "<output>\n2146\n</output>\n")


async def test_the_network_is_refused():
    run, obs, _ = await run_once("import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert run.rc != 0 and "Network is unreachable" in obs


@pytest.mark.parametrize("code", ["while True: pass", "import time; time.sleep(60)"])
async def test_a_hanging_program_ends_at_the_time_bound_as_an_observation(code):
    run, obs, seconds = await run_once(code)
    assert run.timed_out and "TimeoutError: the code ran past 1 s and was stopped" in obs
    assert seconds < LIMITS.timeout + 3


@pytest.mark.parametrize("code,error", [
    ("x = bytearray(1 << 30)", "MemoryError"),  # the address-space bound
    ("open('/tmp/big', 'wb').write(b'0' * (64 << 20))", "No space left on device"),  # the /tmp bound
])
async def test_a_memory_hog_is_stopped(code, error):
    run, obs, _ = await run_once(code)
    assert run.rc != 0 and error in obs


def test_bad_tool_flags_are_one_line_naming_the_flag_before_anything_starts():
    for flags, start in [(["--tool-timeout", "0"], "--tool-timeout"), (["--tool-max-turns", "0"], "--tool-max-turns"),
                         (["--tool-memory-mb", "4"], "--tool-memory-mb")]:
        with pytest.raises(ConfigError) as err:
            parse_args(["--rollout-env", "tool_use", *flags])
        assert str(err.value).startswith(start) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="needs --label-key"):
        parse_args(["--rollout-env", "tool_use", "--prompt-data", "p.jsonl"])


# ---- a group through Temporal, with a scripted policy ------------------------------------------


REPLIES = {"0": ["<code>while True: pass</code>", "Answer: 7"], "1": ["<code>print(12*34)</code>", "Answer: 408"]}
SOLVED = "<code>print(12*34)</code><output>\n408\n</output>\nAnswer: 408<|im_end|>"


class ScriptedPolicy:
    """Stands in for vLLM where what the model says must be chosen: rollout "0" writes code that
    hangs, rollout "1" writes the right code, and its engine dies once before its second turn.
    Replies are tokenized as vLLM returns them (a code turn ends at `</code>`)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls, self.crashed = tokenizer, [], False
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def __call__(self, args):
        return self

    async def generate(self, ids, params, session_id=None):
        rid = session_id.rsplit("-", 1)[1]
        turn = sum(1 for c in self.calls if c[0] == rid and c[1] != "crash")
        if rid == "1" and turn == 1 and not self.crashed:
            self.crashed = True
            self.calls.append((rid, "crash", list(ids)))
            raise ServiceError("the engine went away (scripted crash)")
        text = REPLIES[rid][turn]
        self.calls.append((rid, turn, list(ids)))
        out = list(self.tokenizer.encode(text, add_special_tokens=False))
        if not text.endswith("</code>"):
            out.append(self.end_id)
        return GenerateOutput(token_ids=out, log_probs=[-0.5] * len(out), finish_reason="stop")


async def test_a_hanging_rollout_is_an_observation_and_a_crashed_one_resumes_at_its_last_turn(
        temporal_env, tiny_model_dir, tmp_path):
    from temporalio.worker import Worker

    from vime.rollout.tokenization import get_tokenizer

    prompts = write_prompts(tmp_path / "prompts.jsonl", [Problem(12, "*", 34)])
    run_id = f"tool-{uuid.uuid4().hex[:6]}"
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(prompts), "--input-key", "prompt",
                       "--label-key", "label", "--apply-chat-template", "--rollout-env", "tool_use",
                       "--tool-timeout", "1", "--rollout-batch-size", "1", "--n-samples-per-prompt", "2",
                       "--rollout-max-response-len", "64", "--run-id", run_id, "--run-dir", str(tmp_path / "run")])
    tokenizer = get_tokenizer(str(tiny_model_dir))
    policy = ScriptedPolicy(tokenizer)
    queue = f"tool-use-{run_id}"
    with SampleStore.open(tmp_path / "run") as store:
        store.ensure_run(run_id)
        acts = ToolUseActivities(EnvContext(args, store, temporal_env.client), engine=policy)
        async with Worker(temporal_env.client, task_queue=queue, workflows=[ToolUseGroupWorkflow],
                          activities=[acts.tool_use_rollout, acts.store_tool_use_group]):
            out = await temporal_env.client.execute_workflow(
                "ToolUseGroupWorkflow", GroupInput(run_id, 0, 0, 0, n_samples_per_prompt=2, heartbeat_seconds=30),
                id=f"{run_id}-group", task_queue=queue, result_type=GroupOutput)
        samples = {rid: store.read_rollout(run_id, rid)[0] for rid in out.rollout_ids}
    memo = await (await temporal_env.client.get_workflow_handle(f"{run_id}-group").describe()).memo()

    assert out.status == "completed" and out.samples == 2 and out.errors == 0 and out.infra == 0
    # the Web UI's view (the group's memo): each rollout's turns and reward, and the activity
    # attempts that sampled them: rollout 1's second turn by the retry that followed the crash
    previews = {p["sample"]: p for p in memo["samples"]}
    assert [(previews[k]["turns"], previews[k]["reward"]) for k in ("0/0", "1/0")] == [(2, 0.0), (2, 1.0)]
    assert [a.split("#")[1] for a in previews["1/0"]["sampled_by"].split(",")] == ["1", "2"]
    assert previews["1/0"]["worker"] == temporal_env.client.identity
    hung, solved = samples["0"], samples["1"]
    # the hanging code: stopped at the time bound, shown to the model, the rollout went on to its answer
    assert hung.status.value == "completed" and hung.reward == 0.0
    assert "TimeoutError: the code ran past 1 s" in hung.metadata["turns"][0]["observation"]
    assert hung.metadata["turns"][1]["text"] == "Answer: 7<|im_end|>"
    # the crash: turn 0 was sampled once, turn 1 asked again on the context turn 0 left
    turns = [(rid, t) for rid, t, _ in policy.calls if rid == "1"]
    assert turns == [("1", 0), ("1", "crash"), ("1", 1)]
    crashed_on, resumed_on = [ids for rid, t, ids in policy.calls if rid == "1" and t in ("crash", 1)]
    assert crashed_on == resumed_on
    assert solved.reward == 1.0 and solved.response == SOLVED
    # observation tokens are masked, with logprob 0; sampled tokens keep the engine's logprobs
    for s in (hung, solved):
        response = s.tokens[-s.response_length:]
        masked = tokenizer.decode([t for t, m in zip(response, s.loss_mask) if m == 0])
        sampled = tokenizer.decode([t for t, m in zip(response, s.loss_mask) if m == 1])
        assert masked == "".join(t["observation"] for t in s.metadata["turns"])
        assert sampled == "".join(t["text"] for t in s.metadata["turns"])
        assert all(lp == (-0.5 if m else 0.0) for lp, m in zip(s.rollout_log_probs, s.loss_mask))


@pytest.mark.temporal
async def test_a_rollout_worker_starting_removes_the_sandboxes_a_worker_killed_with_sigkill_left(
        temporal_env, tiny_model_dir, tmp_path, sandbox_base):
    # kill -9 of a tool-use rollout worker left its in-flight sandboxes' workdirs in /tmp (a drill
    # found 21); the next rollout worker, of any environment, removes those of dead processes
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = sandbox_base / f"vime-sbx-{gone.pid}-0123456789ab"
    (stale / "workspace").mkdir(parents=True)
    live = sandbox_base / f"vime-sbx-{os.getpid()}-ba9876543210"  # a running process's: kept
    (live / "workspace").mkdir(parents=True)
    log = tmp_path / "worker.log"
    argv = [sys.executable, "-m", "workers.rollout", "--hf-checkpoint", str(tiny_model_dir),
            "--prompt-data", str(write_prompts(tmp_path / "prompts.jsonl", [Problem(12, "*", 34)])),
            "--input-key", "prompt", "--label-key", "label", "--rollout-env", "tool_use",
            "--run-dir", str(tmp_path / "run"), "--rollout-task-queue", f"q-{uuid.uuid4().hex[:8]}",
            "--temporal-address", temporal_env.client.service_client.config.target_host,
            "--vllm-router-ip", "127.0.0.1", "--vllm-router-port", "9"]
    with open(log, "w") as out:
        worker = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "TMPDIR": str(sandbox_base)})
    try:
        deadline = time.monotonic() + 180
        while "worker rollout ready" not in log.read_text():
            assert time.monotonic() < deadline and worker.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        assert not stale.exists() and live.exists()
    finally:
        worker.terminate()
        worker.wait(60)


@pytest.mark.parametrize("argv, error", [
    (["--sft-steps", "abc"], "error: --sft-steps abc: expected a whole number"),
    (["--traces"], "error: --traces needs a value"),
])
def test_a_bad_option_of_the_example_is_one_line_before_anything_starts(argv, error, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "examples.tool_use.run", "--run-dir", str(tmp_path / "run"), *argv],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == error, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # nothing made, nothing started


# ---- the example, short, on the suite's vLLM server --------------------------------------------

RL_STEPS = 2
RL_FLAGS = ["--rollout-batch-size", "8", "--n-samples-per-prompt", "4"]  # the warm start is the README's (cached)


@pytest.mark.vllm
def test_the_example_warm_starts_then_learns_with_masked_observations_and_exact_logprobs(training_server, tmp_path):
    from tests.conftest import engine_flags
    from vime.rollout.tokenization import get_tokenizer

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "examples.tool_use.run", "--run-dir", str(run_dir), "--num-rollout", str(RL_STEPS),
         *RL_FLAGS, *engine_flags(training_server)],
        cwd=REPO, env={**os.environ, "VIME_LOG_LEVEL": "WARNING"}, capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "warm start:" in out  # SFT built here or cached
    assert (run_dir / "reward_curve.png").exists() and (run_dir / "tool_use_curve.png").exists()
    assert "share of rollouts using the tool:" in (run_dir / "summary.txt").read_text()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [m["reward_mean"] for m in metrics]
    assert len(rewards) == RL_STEPS
    # the trainer's logprobs of the sampled tokens are vLLM's: the observations between turns are masked
    assert all(m["train_rollout_logprob_abs_diff"] < 1e-3 for m in metrics), metrics

    tokenizer = get_tokenizer(str(run_dir / "sft-model"))
    with SampleStore.open(run_dir) as store:
        samples = [s for _, s in store.iter_samples(run_dir.name)]
    used_tool = [s for s in samples if s.metadata["tool_calls"]]
    # the warm start taught the format, and both of its policies: the tool, and declining (which RL unlearns)
    assert len(used_tool) >= len(samples) / 4 and any(DECLINE in s.response for s in samples)
    for s in used_tool:
        response = s.tokens[-s.response_length:]
        masked = tokenizer.decode([t for t, m in zip(response, s.loss_mask) if m == 0])
        assert masked == "".join(t["observation"] for t in s.metadata["turns"]) and masked.startswith("<output>")
        assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m == 0)
    # the random base model never writes code (reward 0); after the warm start answers are right
    assert max(rewards) > 0, rewards
