"""docker-compose.yml with deploy/vime.env: valid for docker-compose, and every vime command its
services run parses with vime's own flags, so a deployment fails on the cluster for no reason
this machine could have found. No Docker engine here: `docker-compose config` needs none."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vime.config.args import parse_args

REPO = Path(__file__).resolve().parent.parent
ENV_FILE = REPO / "deploy" / "vime.env"
VIME_SERVICES = {"vllm-0", "vllm-1", "router", "rollout-worker", "trainer", "start-run"}


def env_file() -> dict[str, str]:
    lines = [line for line in ENV_FILE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.fixture(scope="module")
def compose() -> dict:
    docker_compose = shutil.which("docker-compose")
    assert docker_compose, "docker-compose is not installed (Debian: apt-get install docker-compose; scripts/setup.sh does)"
    done = subprocess.run([docker_compose, "--env-file", str(ENV_FILE), "--profile", "tools", "config"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def command_argv(service: dict, env: dict[str, str]) -> list[str]:
    """The service's command as the container's shell runs it, with the env file's values."""
    command = service["command"]
    command = " ".join(command) if isinstance(command, list) else command
    script = shlex.split(command)
    if script[:2] == ["sh", "-c"]:
        script = shlex.split(re.sub(r"\$\$?(\w+)", lambda m: env[m.group(1)], script[2]))
    return script


def vime_flags(argv: list[str], after: str) -> list[str]:
    """The flags given to the `after` command in `argv`, up to a shell `&&` or redirection."""
    rest = argv[argv.index(after) + 1:]
    stop = next((i for i, word in enumerate(rest) if word in ("&&", ">", "|")), len(rest))
    return rest[:stop]


def test_docker_compose_config_accepts_the_file_and_names_every_part(compose):
    assert set(compose["services"]) == VIME_SERVICES | {"postgres", "temporal", "temporal-ui"}
    assert compose["services"]["temporal"]["environment"]["DB"] == "postgres12", "Temporal's history on PostgreSQL"
    assert compose["services"]["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    for name in ("trainer", "vllm-0", "vllm-1"):
        (device,) = compose["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
    gpus = [compose["services"][name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
            for name in ("trainer", "vllm-0", "vllm-1")]
    assert len({tuple(ids) for ids in gpus}) == 3, f"the trainer and each vLLM server get their own GPU: {gpus}"


@pytest.mark.parametrize(("service", "command"), [
    ("rollout-worker", "workers.rollout"),
    ("trainer", "workers.trainer"),
    ("vllm-0", "engine"),
    ("vllm-1", "engine"),
    ("start-run", "config"),
])
def test_each_service_s_vime_command_parses_with_the_env_file_s_flags(compose, service, command):
    env = env_file()
    argv = command_argv(compose["services"][service], env)
    args = parse_args(vime_flags(argv, command))
    assert args.run_id == env["RUN_ID"]
    if service in ("rollout-worker", "trainer"):
        assert args.store_url == env["VIME_STORE_URL"], "the store is the compose file's PostgreSQL"
        assert args.temporal_address == "temporal:7233"


def test_the_workers_reach_the_servers_the_file_starts(compose):
    env = env_file()
    services = compose["services"]
    rollout = parse_args(vime_flags(command_argv(services["rollout-worker"], env), "workers.rollout"))
    trainer = parse_args(vime_flags(command_argv(services["trainer"], env), "workers.trainer"))
    router = command_argv(services["router"], env)
    assert (rollout.vllm_router_ip, str(rollout.vllm_router_port)) == ("router", router[router.index("--port") + 1])
    engines = [f"http://{name}:{parse_args(vime_flags(command_argv(services[name], env), 'engine')).engine_port}"
               for name in ("vllm-0", "vllm-1")]
    assert trainer.vllm_server_urls == engines == vime_flags(router, "--worker-urls")
    assert env["POSTGRES_PASSWORD"] in env["VIME_STORE_URL"], "one password for the store and its server"


def test_the_image_copies_what_exists():
    copied = re.findall(r"^COPY (.+) \S+$", (REPO / "Dockerfile").read_text(), re.M)
    for paths in copied:
        for path in paths.split():
            assert (REPO / path).exists(), path
