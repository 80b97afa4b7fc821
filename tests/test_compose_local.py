"""docker-compose.yml runs: its services' own commands, started here as local processes in the
order and on the conditions the file gives (tests/compose_local.py), fetch the model, start two
vLLM servers with vime's weight-sync backend, the router, the rollout worker and the
trainer under torchrun; `start-run` starts the run of deploy/vime.env, which trains 2 steps,
syncs the weights into both servers and saves its checkpoint. No Docker engine here, so what the
images provide stands in (`STAND_INS`), and the run is made small (`SMALL_RUN`); nothing else of
the file or the env file is changed."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests import compose
from tests.compose_local import LocalTopology, StandIn
from tests.runs import write_prompts
from vime.engine.weight_sync import live_weights
from vime.procs import spawn
from vime.store import SampleStore
from vime.temporal.dev_server import temporal_cli_path

pytestmark = [pytest.mark.vllm, pytest.mark.temporal]

STAND_INS = {
    "postgres": StandIn("the test's PostgreSQL (tests/postgres.py); VIME_STORE_URL names a fresh database on it"),
    "temporal-schema": StandIn("none: the dev server keeps its own schema"),
    "temporal": StandIn("`temporal server start-dev` on the service's gRPC and HTTP ports", health_check_applies=True),
    "temporal-ui": StandIn("none: the Web UI plays no part in training"),
}
SMALL_RUN = ["--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
             "--rollout-max-response-len", "8", "--vllm-max-model-len", "512"]
"""Appended to VIME_FLAGS (the last value of a flag wins): a run this machine trains in minutes."""


def test_the_compose_file_s_own_commands_train_two_steps_here(tiny_model_dir, postgres_server, tmp_path):
    services, env = compose.load()["services"], compose.env_file()
    store_url = postgres_server.create_database()
    topology = LocalTopology(services, tmp_path, STAND_INS, variables={
        "VIME_FLAGS": " ".join([env["VIME_FLAGS"], *SMALL_RUN]), "VIME_STORE_URL": store_url})
    (tmp_path / "models" / env["MODEL_REPO"]).parent.mkdir(parents=True)
    (tmp_path / "models" / env["MODEL_REPO"]).symlink_to(tiny_model_dir)  # `model` finds it: no download
    write_prompts(tmp_path / "data" / "prompts.jsonl", 8)
    temporal = f"127.0.0.1:{topology.port('temporal', 7233)}"
    run_dir = tmp_path / "runs" / env["RUN_ID"]  # ./runs on the host: the volume --run-dir and --save are on
    t0 = time.monotonic()
    try:
        topology.adopt("temporal", spawn(
            [str(temporal_cli_path()), "server", "start-dev", "--ip", "127.0.0.1", "--headless", "--log-level", "warn",
             "--port", str(topology.port("temporal", 7233)), "--http-port", str(topology.port("temporal", 7243))],
            topology.log("temporal"), run_dir=tmp_path))
        topology.up()
        topology.wait_healthy("temporal")  # its health check, against the stand-in: the namespace is served
        t_up = time.monotonic() - t0
        topology.run("start-run")
        with SampleStore.open(store_url) as store:
            topology.wait(lambda: len(store.trained_counts(env["RUN_ID"])) == 2, 900, "2 trained steps")
            trained = store.trained_counts(env["RUN_ID"])
        result = subprocess.run([str(temporal_cli_path()), "workflow", "result", "--address", temporal, "--workflow-id",
                                 f"train-{env['RUN_ID']}"], capture_output=True, text=True, timeout=300)
    finally:
        topology.stop()
        live_weights.remove(run_dir)  # the trainer's last weights, which it keeps in this host's /dev/shm
    print(f"\n[compose without Docker] services up in {t_up:.0f} s, 2 steps trained in "
          f"{time.monotonic() - t0 - t_up:.0f} s more")
    assert trained == {0: 4, 1: 4}
    assert result.returncode == 0 and "COMPLETED" in result.stdout, result.stdout + result.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert list((run_dir / "checkpoints").iterdir()), "the last step's checkpoint"
    for name in ("vllm-0", "vllm-1"):
        assert "vime_shm" in topology.log(name).read_text(), f"{name} loads the trainer's weights files"
    assert [m["weight_version"] for m in metrics] == [1, 2], "each step's weights synced"
    assert (tmp_path / "runs" / f"{env['RUN_ID']}.input.json").exists()  # what start-run handed Temporal
