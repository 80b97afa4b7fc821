"""One pool of workers serves any number of runs: the README's "Many runs on long-lived workers"
section, run literally by bash (ports swapped for free ones), starts a rollout worker and a
trainer that know nothing of any run, then two runs with different models and rewards from the
JSON of `vime config` through `temporal workflow start`, with no other setup step; both train.
`vime eval` given the pool's addresses runs on the same workers, starting nothing.

The pieces it relies on are specified beside it: a run's recorded flags become its config on
any worker (`RunArgs`), and a trainer is leased to one run at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from activities.train import LEASE_S, TrainerActivities
from tests.readme import bash_script, readme_block
from tests.runs import write_prompts
from vime.engine.server import free_port
from vime.config.args import parse_args
from vime.errors import ConfigError
from vime.config.run_args import RunArgs
from vime.rollout.policy_check import sampled_versions
from vime.store import SampleStore

REWARD_B = '''
async def rm(args, sample):
    """Run b's reward: shorter answers score higher (exact_match scores run a)."""
    return 1.0 / (1 + len(sample.response))
'''


REWARD_MODEL = '''
import json, os, aiohttp

async def rm(args, sample):
    """A second model's probability of its greedy token after the response, from the URL the run's
    --vllm-model-urls names "reward" (the worker was given none)."""
    url = args.vllm_model_routers["reward"]
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/v1/models") as r:
            model = (await r.json())["data"][0]["id"]
        body = {"model": model, "prompt": (sample.response or "") + " ok", "max_tokens": 1, "temperature": 0,
                "logprobs": 1}
        async with http.post(url + "/v1/completions", json=body) as r:
            r.raise_for_status()
            logprob = (await r.json())["choices"][0]["logprobs"]["token_logprobs"][0]
    with open(os.environ["REWARD_CALLS"], "a") as f:
        f.write(json.dumps({"url": url, "router": [args.vllm_router_ip, args.vllm_router_port]}) + "\\n")
    return 2.718281828 ** logprob
'''


@pytest.mark.vllm
def test_two_runs_from_vime_config_json_train_on_workers_started_once(training_server, tiny_model_dir, tmp_path,
                                                                      sandbox_base):
    """... and then serve more: a coding-agent run and a `--vllm-config` run whose reward calls a
    second model, on the same workers; two bad runs fail in one line each, leaving the trainer
    free for a last run, which `vime cancel` stops with its rollouts in flight."""
    from vime.testing.tiny_model import tiny_model_dir as build_tiny_model

    model_b = build_tiny_model(seed=1)  # same architecture and tokenizer, other weights
    temporal_port = free_port()
    script = readme_block("### Many runs on long-lived workers")
    script = script.replace("7233", str(temporal_port)).replace("8000", str(training_server.port))
    assert training_server.host == "127.0.0.1"
    start_temporal = (f".venv/bin/temporal server start-dev --port {temporal_port} --headless "
                      f"--ui-port {free_port()} &\n"
                      f"until .venv/bin/temporal operator cluster health --address 127.0.0.1:{temporal_port} "
                      ">/dev/null 2>&1; do sleep 1; done\n")
    write_prompts(tmp_path / "prompts.jsonl", 8)
    (tmp_path / "reward_b.py").write_text(REWARD_B)
    env = {**os.environ, "MODEL_A": str(tiny_model_dir), "MODEL_B": str(model_b), "VIME_LOG_FORMAT": "json",
           "VIME_LOG_LEVEL": "WARNING", "TMPDIR": str(sandbox_base),  # the agent's bubblewrap sandboxes
           "REWARD_CALLS": str(tmp_path / "reward_calls.jsonl")}
    t0 = time.monotonic()
    with bash_script(tmp_path, start_temporal + script, env) as (proc, log):
        proc.wait(timeout=900)
        out = log.read_text()
        if proc.returncode == 0:  # the same workers serve more runs: two bad ones, then one `vime cancel` stops
            pool = Pool(tmp_path, temporal_port, training_server.port, tiny_model_dir)
            agent = a_coding_agent_run(pool)
            two_models = a_vllm_config_run_whose_reward_calls_a_second_model(pool)
            t_eval = time.monotonic()
            evaluated = a_vime_eval_of_an_hf_checkpoint(pool)
            t_eval = time.monotonic() - t_eval
            bad_runs_fail_in_one_line_and_free_the_trainer(pool)
            cancelled = cancel_a_run_in_flight(pool)
            states = pool.vime("runs", "--store-url", pool.store, "--temporal-address", pool.address, "--json")
    assert proc.returncode == 0, out[-4000:]
    assert len(re.findall(r"Status +COMPLETED", out)) == 2, out[-4000:]
    assert out.count("ready: any run") == 2  # neither worker was given a run
    with SampleStore.open(f"sqlite:///{tmp_path}/runs/vime.db") as store:
        assert store.trained_counts("exp-a") == {0: 8, 1: 8}
        assert store.trained_counts("exp-b") == {0: 8, 1: 8}
        rewards_b = {s.reward for s in store.read_step_samples("exp-b", 0)}
    assert all(0 < r <= 1 for r in rewards_b) and rewards_b - {0.0, 1.0}  # run b's own reward code
    for run in ("exp-a", "exp-b"):  # each run's metrics in its own run directory
        assert (tmp_path / "runs" / run / "metrics.jsonl").read_text().count("\n") == 2
    print(f"\n[long-lived workers] two runs trained in {time.monotonic() - t0:.0f} s")
    assert agent.returncode == 0 and "COMPLETED" in agent.stdout, agent.stdout[-2000:]
    with SampleStore.open(f"sqlite:///{tmp_path}/runs/vime.db") as store:
        graded = [s.metadata.get("grade") for s in store.read_step_samples("exp-agent", 0)]
        assert graded and all(g and g["outcome"] for g in graded), graded  # the agent's rollouts, graded
        assert two_models.returncode == 0 and "COMPLETED" in two_models.stdout, two_models.stdout[-2000:]
        assert store.trained_counts("exp-rm") == {0: 8}
    calls = [json.loads(line) for line in (tmp_path / "reward_calls.jsonl").read_text().splitlines()]
    port = training_server.port  # the reward model under another name than the actor's: the run's URLs, not a worker's
    assert calls and {c["url"] for c in calls} == {f"http://localhost:{port}"}, calls[:3]
    assert {tuple(c["router"]) for c in calls} == {("127.0.0.1", port)}  # generate: the actor's URL
    assert evaluated.returncode == 0, evaluated.stdout[-2000:] + evaluated.stderr[-2000:]
    assert "poll vime-rollout" in evaluated.stdout and "starting none" in evaluated.stdout, evaluated.stdout
    assert "vLLM server" not in evaluated.stdout and not list((tmp_path / "runs" / "exp-eval").glob("worker-*.log"))
    assert re.search(r"^checkpoint +step +set .*\n\S+ +0 +heldout ", evaluated.stdout, re.M), evaluated.stdout
    with SampleStore.open(f"sqlite:///{tmp_path}/runs/vime.db") as store:
        evals = [s for _, s in store.iter_samples("exp-eval", evaluation=True, eval_step=0)]
    assert len(evals) == 3 * 2 and all(set(sampled_versions(s)) == {0} for s in evals)  # the checkpoint's version
    print(f"[long-lived workers] vime eval of a checkpoint on the pool: {len(evals)} eval samples in {t_eval:.0f} s")
    assert re.fullmatch(r"run exp-c: canceled \(train-exp-c and the rollouts.*\n", cancelled["stdout"]), cancelled
    assert "starts it again from scratch (no step was trained)" in cancelled["stdout"]  # what a restart does
    assert cancelled["status"] == "CANCELED"
    followed = cancelled["followed"]  # `vime status exp-w --follow`: it waited for exp-c's trainer, then trained
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-3000:]
    assert re.search(r"^\[wait\] run exp-w: waits for a free trainer: run exp-c holds trainer \S+", followed.stdout,
                     re.M), followed.stdout
    assert re.findall(r"^\[#+ *\] step (\d)/2 \| reward", followed.stdout, re.M) == ["1", "2"], followed.stdout
    assert followed.stdout.rstrip().endswith("[vime] run exp-w finished: 2 steps"), followed.stdout
    print("[long-lived workers] vime status --follow:\n" + followed.stdout)
    listed = {r["run_id"]: r["state"] for r in json.loads(states.stdout)}
    assert {run: listed[run] for run in ("exp-a", "exp-boom", "exp-c", "exp-w")} == {
        "exp-a": "finished", "exp-boom": "failed", "exp-c": "cancelled", "exp-w": "finished"}, listed
    # the rollouts in flight were cancelled (with their cleanup), not terminated with the parent
    assert set(cancelled["children"].values()) == {"CANCELED"}, cancelled
    print(f"[long-lived workers] vime cancel: {list(cancelled['children'].values()).count('CANCELED')} rollouts "
          "in flight cancelled")


class Pool:
    """The README script's Temporal and workers, still running after it: more runs, by the CLI."""

    def __init__(self, tmp_path: Path, temporal_port: int, engine_port: int, model: Path) -> None:
        self.tmp_path, self.model, self.engine_port = tmp_path, model, engine_port
        self.address = f"127.0.0.1:{temporal_port}"
        self.bin = tmp_path / ".venv" / "bin"
        self.store = f"sqlite:///{tmp_path}/runs/vime.db"

    def vime(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "vime"), *argv], cwd=self.tmp_path, capture_output=True, text=True,
                              timeout=timeout)

    def start(self, run_id: str, *flags: str, router: bool = True) -> None:
        """`vime config` (the README's flags, `flags` on top; without `router`, no --vllm-router-*)
        > RUN.json; `temporal workflow start`."""
        routes = ["--vllm-router-ip", "127.0.0.1", "--vllm-router-port", str(self.engine_port)] if router else []
        config = subprocess.run(
            [str(self.bin / "vime"), "config", "--run-id", run_id, "--hf-checkpoint", str(self.model),
             "--prompt-data", str(self.tmp_path / "prompts.jsonl"), "--input-key", "prompt", "--label-key", "label",
             "--rm-type", "exact_match", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
             "--rollout-max-response-len", "8", "--num-rollout", "2",
             "--store-url", f"sqlite:///{self.tmp_path}/runs/vime.db", *routes,
             "--vllm-server-urls", f"http://127.0.0.1:{self.engine_port}",
             *flags], cwd=self.tmp_path, capture_output=True, text=True, check=True)
        (self.tmp_path / f"{run_id}.json").write_text(config.stdout)
        subprocess.run([str(self.bin / "temporal"), "workflow", "start", "--address", self.address, "--type",
                        "TrainingWorkflow", "--task-queue", "vime-rollout", "--workflow-id", f"train-{run_id}",
                        "--input-file", f"{run_id}.json"], cwd=self.tmp_path, check=True, capture_output=True)

    def result(self, run_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "temporal"), "workflow", "result", "--address", self.address,
                               "--workflow-id", f"train-{run_id}"], capture_output=True, text=True, timeout=600)

    def statuses(self, *workflow_ids: str) -> dict[str, str]:
        """Each workflow's status (those not started yet left out)."""
        from temporalio.client import Client
        from temporalio.service import RPCError

        async def describe() -> dict[str, str]:
            client, found = await Client.connect(self.address), {}
            for workflow_id in workflow_ids:
                try:
                    found[workflow_id] = (await client.get_workflow_handle(workflow_id).describe()).status.name
                except RPCError:
                    pass
            return found
        return asyncio.run(describe())


def a_coding_agent_run(pool: Pool) -> subprocess.CompletedProcess[str]:
    """A coding-agent run (one task, two agent rollouts of two short turns) on the same workers:
    its task, session, sandboxes and grading read the run's flags, which only its JSON carries."""
    from examples.coding_agent_rl.gold_edits import write_prompts
    from examples.coding_agent_rl.tasks.prepare import load_tasks

    tasks = write_prompts(load_tasks()[:1], pool.tmp_path / "tasks.jsonl")
    pool.start("exp-agent", "--rollout-env", "coding_agent", "--prompt-data", str(tasks), "--rollout-batch-size", "1",
               "--n-samples-per-prompt", "2", "--num-rollout", "1", "--agent-max-turns", "2", "--agent-max-tokens", "16",
               "--agent-command-timeout", "20")
    return pool.result("exp-agent")


def a_vllm_config_run_whose_reward_calls_a_second_model(pool: Pool) -> subprocess.CompletedProcess[str]:
    """A `--vllm-config` run (an actor and a frozen reward model) on servers already running, named
    by `--vllm-model-urls`: generation goes to the actor's, the reward function calls the reward
    model's. Both names point at the suite's one server (no new server in CI), the reward model's
    as `localhost`, so the URL the reward function used can only be the run's."""
    port = pool.engine_port
    (pool.tmp_path / "rm_model.py").write_text(REWARD_MODEL)
    (pool.tmp_path / "serving.yaml").write_text(
        f"vllm:\n  - name: actor\n    server_groups: [{{worker_type: regular, num_gpus: 1}}]\n"
        f"  - name: reward\n    model_path: {pool.model}\n    update_weights: false\n"
        f"    server_groups: [{{worker_type: regular, num_gpus: 1}}]\n")
    pool.start("exp-rm", "--vllm-config", str(pool.tmp_path / "serving.yaml"), "--custom-rm-path", "rm_model.rm",
               "--num-rollout", "1", "--vllm-model-urls", f"actor=http://127.0.0.1:{port}",
               f"reward=http://localhost:{port}", router=False)
    return pool.result("exp-rm")


def a_vime_eval_of_an_hf_checkpoint(pool: Pool) -> subprocess.CompletedProcess[str]:
    """`vime eval` of an HF checkpoint given the pool's Temporal, store and server: it starts no
    service and no worker; the pool's rollout worker checks the eval run's flags (no
    --prompt-data: it has eval sets) and runs its round."""
    heldout = pool.tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"prompt": f"count {i}", "label": "1"}) + "\n" for i in range(3)))
    return subprocess.run(
        [str(pool.bin / "vime"), "eval", "--hf-checkpoint", str(pool.model), "--eval-prompt-data", "heldout",
         str(heldout), "--input-key", "prompt", "--label-key", "label", "--rm-type", "exact_match",
         "--n-samples-per-eval-prompt", "2", "--eval-max-response-len", "4", "--run-id", "exp-eval",
         "--run-dir", str(pool.tmp_path / "runs" / "exp-eval"),
         "--store-url", f"sqlite:///{pool.tmp_path}/runs/vime.db",
         "--temporal-address", pool.address, "--vllm-router-ip", "127.0.0.1", "--vllm-router-port",
         str(pool.engine_port), "--vllm-server-urls", f"http://127.0.0.1:{pool.engine_port}"],
        cwd=pool.tmp_path, capture_output=True, text=True, timeout=300)


def bad_runs_fail_in_one_line_and_free_the_trainer(pool: Pool) -> None:
    """A run whose data is missing fails at its start, before a trainer is leased and with
    nothing recorded; a run whose reward raises fails after it leased the trainer, and frees it
    (`cancel_a_run_in_flight` after this needs it)."""
    pool.start("exp-nodata", "--prompt-data", str(pool.tmp_path / "missing.jsonl"))
    nodata = pool.result("exp-nodata")
    message = next(line for line in nodata.stdout.splitlines() if "Message" in line)
    assert nodata.returncode != 0 and re.search(r"run 'exp-nodata': --prompt-data .*missing\.jsonl", message), nodata
    with SampleStore.open(f"sqlite:///{pool.tmp_path}/runs/vime.db") as store:
        assert store.run_argv("exp-nodata") is None
    (pool.tmp_path / "boom.py").write_text("async def rm(args, sample):\n    raise ValueError('boom')\n")
    pool.start("exp-boom", "--custom-rm-path", "boom.rm")
    boom = pool.result("exp-boom")
    assert boom.returncode != 0 and "boom" in boom.stdout, boom
    for done in (nodata, boom):
        print("[long-lived workers]", next(line.strip() for line in done.stdout.splitlines() if "Message" in line))


def cancel_a_run_in_flight(pool: Pool) -> dict:
    """Start run exp-c (its reward takes ten minutes, so its rollouts stay in flight: they end
    only if the cancel reaches them; one of a minute ended on its own under load), and run exp-w
    (2 steps), which waits for the trainer exp-c holds, followed by `vime status --follow`; cancel
    exp-c with `vime cancel` while both of its step's rollout workflows run (exp-w then trains),
    and report how they and exp-c's rollouts ended."""
    (pool.tmp_path / "slow_rm.py").write_text("import asyncio\n\nasync def rm(args, sample):\n"
                                              "    await asyncio.sleep(600)\n    return 1.0\n")
    pool.start("exp-c", "--custom-rm-path", "slow_rm.rm")
    rollouts = ("exp-c-rollout-0", "exp-c-rollout-1")  # step 0's groups (workflow ids by data position)
    deadline = time.monotonic() + 300
    while list(pool.statuses(*rollouts).values()) != ["RUNNING", "RUNNING"] and time.monotonic() < deadline:
        time.sleep(0.5)
    pool.start("exp-w")
    follow_log = pool.tmp_path / "follow.log"
    with open(follow_log, "w") as out:
        follow = subprocess.Popen([str(pool.bin / "vime"), "status", "exp-w", "--follow", "--store-url", pool.store,
                                   "--temporal-address", pool.address], cwd=pool.tmp_path, stdout=out,
                                  stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while "[wait]" not in follow_log.read_text() and follow.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    result = pool.vime("cancel", "exp-c", "--temporal-address", pool.address, "--store-url", pool.store)
    cancelled = {"stdout": result.stdout, "stderr": result.stderr,
                 "status": pool.statuses("train-exp-c")["train-exp-c"], "children": pool.statuses(*rollouts)}
    try:
        _, stderr = follow.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        follow.kill()
        _, stderr = follow.communicate()
    return {**cancelled, "followed": subprocess.CompletedProcess(follow.args, follow.returncode,
                                                                 follow_log.read_text(), stderr)}


# ---- a run's config on any worker ---------------------------------------------------------------

def worker_args(tmp_path: Path, *extra: str):
    return parse_args(["--store-url", f"sqlite:///{tmp_path}/vime.db", "--temporal-address", "127.0.0.1:7233",
                       *extra])


def test_a_worker_reads_a_recorded_run_s_flags_and_keeps_its_own_connections(tmp_path):
    recorded = {"exp": ["--hf-checkpoint", "/models/a", "--n-samples-per-prompt", "4", "--run-id", "exp",
                        "--store-url", "sqlite:////elsewhere/vime.db", "--temporal-address", "10.0.0.1:7233"]}
    runs = RunArgs(worker_args(tmp_path), recorded.get)
    args = runs.args("exp")
    assert (args.hf_checkpoint, args.n_samples_per_prompt, args.run_id) == ("/models/a", 4, "exp")
    assert args.store_url == f"sqlite:///{tmp_path}/vime.db"  # where the worker read the flags from
    assert args.temporal_address == "127.0.0.1:7233"
    assert runs.args("exp") is args  # parsed once while the flags stay the same
    recorded["exp"] = [*recorded["exp"], "--n-samples-per-prompt", "8"]  # the run restarted with other flags
    assert runs.args("exp").n_samples_per_prompt == 8


def test_an_environment_s_activities_read_the_run_s_config_and_a_long_lived_worker_serves_vime_s_environments(
        tmp_path):
    from vime.envs import EnvContext
    from workers.rollout import served_environments

    recorded = {"exp": ["--hf-checkpoint", "/models/a", "--rollout-env", "coding_agent", "--agent-max-turns", "3",
                        "--run-id", "exp"]}
    worker = worker_args(tmp_path)
    ctx = EnvContext(worker, store=None, client=None, runs=RunArgs(worker, recorded.get))
    args = asyncio.run(ctx.run_args("exp"))
    assert (args.hf_checkpoint, args.env_args.agent_max_turns) == ("/models/a", 3)  # the run's, not the worker's
    assert worker.hf_checkpoint is None
    assert [e.name for e in served_environments(worker)] == ["groups", "coding_agent", "tool_use", "multi_agent"]
    own = worker_args(tmp_path, "--hf-checkpoint", "/models/own", "--rollout-env", "coding_agent")
    assert [e.name for e in served_environments(own)] == ["coding_agent"]


def test_a_worker_started_with_a_run_s_flags_uses_them_for_that_run(tmp_path):
    own = worker_args(tmp_path, "--hf-checkpoint", "/models/own", "--run-id", "mine")
    runs = RunArgs(own, lambda run_id: ["--hf-checkpoint", "/models/recorded", "--run-id", run_id])
    assert runs.args("mine") is own  # this launch's engine addresses, not an earlier launch's
    assert runs.args("other").hf_checkpoint == "/models/recorded"
    unrecorded = RunArgs(own, lambda run_id: None)
    assert unrecorded.args("bench-1") is own  # a run started without its flags gets the worker's


def test_a_run_nobody_recorded_is_one_line_that_says_how_to_start_it(tmp_path):
    runs = RunArgs(worker_args(tmp_path), lambda run_id: None)
    with pytest.raises(ConfigError, match=r"run 'ghost' is not recorded in this worker's store .*vime config"):
        runs.args("ghost")


def test_a_starting_run_s_flags_are_checked_as_vime_train_checks_them(tmp_path, tiny_model_dir):
    runs = RunArgs(worker_args(tmp_path), lambda run_id: None)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "p", "label": "1"}\n')
    good = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(prompts), "--input-key", "prompt",
            "--rollout-batch-size", "1",
            "--num-rollout", "1", "--n-samples-per-prompt", "2", "--run-id", "exp"]
    assert runs.checked("exp", good).prompt_data == str(prompts)
    with pytest.raises(ConfigError, match=r"^run 'exp': --hf-checkpoint .*/nowhere"):
        runs.checked("exp", [*good, "--hf-checkpoint", str(tmp_path / "nowhere")])
    with pytest.raises(ConfigError, match=r"^run 'exp': its flags: unknown flag --rm-tpye"):
        runs.checked("exp", [*good, "--rm-tpye", "math"])


def test_an_eval_run_s_flags_are_parsed_not_refused_for_their_missing_prompt_data(tmp_path, tiny_model_dir):
    """`vime eval` checked its run before starting it (eval sets, no --prompt-data) and holds its run
    directory: a long-lived worker registering it parses its flags, and still refuses bad ones."""
    runs = RunArgs(worker_args(tmp_path), lambda run_id: None)
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text('{"prompt": "p", "label": "1"}\n')
    flags = ["--hf-checkpoint", str(tiny_model_dir), "--eval-prompt-data", "heldout", str(heldout),
             "--run-id", "m-eval-1", "--run-dir", str(tmp_path / "m-eval-1")]
    with pytest.raises(ConfigError, match=r"^run 'm-eval-1': vime train needs --prompt-data"):
        runs.checked("m-eval-1", flags)  # as a training run it would be refused
    assert runs.checked("m-eval-1", flags, evaluation=True).eval_prompt_data == ["heldout", str(heldout)]
    with pytest.raises(ConfigError, match=r"^run 'm-eval-1': its flags: unknown flag --eval-tpye"):
        runs.checked("m-eval-1", [*flags, "--eval-tpye", "x"], evaluation=True)


def test_the_store_keeps_a_run_s_latest_flags_and_config_and_creates_the_run(tmp_path):
    with SampleStore.open(tmp_path) as store:
        assert store.run_argv("exp") is None
        store.register_run("exp", ["--num-rollout", "2"], {"num_rollout": 2})
        store.register_run("exp", ["--num-rollout", "3"], {"num_rollout": 3})
        assert store.run_argv("exp") == ["--num-rollout", "3"]
        assert store.ensure_run("exp") == {"argv": ["--num-rollout", "3"], "num_rollout": 3}


# ---- a trainer leased to one run at a time ------------------------------------------------------

class NoModel:
    trainer = None
    tenants: dict = {}


def test_a_trainer_serves_one_run_until_it_is_released_or_its_lease_runs_out():
    from temporalio.exceptions import ApplicationError

    trainer = TrainerActivities(NoModel(), "q")
    trainer._hold("a")
    trainer._hold("a")  # its own run renews the lease
    with pytest.raises(ApplicationError, match="is training run 'a'; run 'b' waits") as busy:
        trainer._hold("b")
    assert busy.value.type == "TrainerBusy" and not busy.value.non_retryable  # Temporal retries the pick
    trainer._leases["a"] -= LEASE_S + 1  # a run that stopped calling (terminated)
    trainer._hold("b")
    asyncio.run(trainer.release_trainer("b"))  # run b ended
    trainer._hold("c")


class BlockingGroup(NoModel):
    """A trainer group whose commands run until the test lets them end, noting each start and end."""

    def __init__(self) -> None:
        import threading
        self.release = threading.Event()
        self.events: list[str] = []

    def call(self, name, *payload):
        self.events.append(f"{name} starts")
        if name == "train_step":
            self.release.wait(10)
        self.events.append(f"{name} ends")
        return name


def test_a_cancelled_trainer_command_holds_the_trainer_until_its_thread_ends():
    """A thread cannot be cancelled: a command whose activity was cancelled (its heartbeat timed
    out) must end before the next one starts, or a re-attach or a newer sync runs beside it."""
    group = BlockingGroup()
    trainer = TrainerActivities(group, "q")

    async def main():
        step = asyncio.create_task(trainer._run("train_step", "run", 3))
        await asyncio.sleep(0.2)
        step.cancel()  # again and again: the wait for the thread is not cut short either
        await asyncio.sleep(0.05)
        step.cancel()
        sync = asyncio.create_task(trainer._run("state_dict_and_probe", "run"))
        await asyncio.sleep(0.3)
        assert group.events == ["train_step starts"]  # the next command waits for the thread
        group.release.set()
        assert await sync == "state_dict_and_probe"
        with pytest.raises(asyncio.CancelledError):
            await step

    asyncio.run(main())
    assert group.events == ["train_step starts", "train_step ends", "state_dict_and_probe starts",
                            "state_dict_and_probe ends"]


def test_a_trainer_call_its_workflow_gave_up_on_does_nothing_once_a_newer_call_of_its_run_came():
    """A workflow makes one trainer call at a time, unless it gave up on one (a timeout, a
    `trainer_lost` signal); a call of the run that came later means so, and the older call,
    still running here until Temporal's cancel reaches it, stops before it changes anything.
    (Found in CI: a sync given up on while it waited for a starting server pushed version 2 after
    the workflow's newer sync of version 3.)"""
    from temporalio.exceptions import ApplicationError

    from workflows.trainer_calls import SUPERSEDED

    group = BlockingGroup()
    group.release.set()
    trainer = TrainerActivities(group, "q")
    given_up = trainer._calls.admit("run")
    newest = trainer._calls.admit("run")  # the workflow re-attached: pick_trainer, attach_trainer, ...
    other_run = trainer._calls.admit("another run")  # another tenant's calls do not count

    with pytest.raises(ApplicationError, match="a newer trainer call came") as refused:
        asyncio.run(trainer._run("train_step", "run", 3, check=given_up))
    assert refused.value.type == SUPERSEDED and refused.value.non_retryable
    assert group.events == []  # the command never started
    assert asyncio.run(trainer._run("train_step", "run", 3, check=newest)) == "train_step"
    assert asyncio.run(trainer._run("save", "another run", check=other_run)) == "save"
