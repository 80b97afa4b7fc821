"""A LoRA run's wiring, without a server: the launcher starts the policy's servers with LoRA on
(unless the user set the flags), rollouts request the group's adapter and report its version, a
restarted server boots with the live adapters."""

from __future__ import annotations

import asyncio

import pytest

from vime.engine.model_fleets import model_fleets
from vime.engine.topology import topology_of
from vime.engine.weight_sync import lora_serving
from vime.engine.weight_sync.lora_serving import (adapter_name, lora_modules_args, lora_server_args,
                                                  run_of, version_of, without_lora_modules)
from vime.rollout.generate import adapter_versions, current_adapter, serving_adapter
from vime.rollout.policy_check import sampled_versions
from vime.types import Sample


def test_server_flags_for_a_rank_and_only_those_the_user_left_unset():
    assert lora_server_args(0, []) == []
    assert lora_server_args(8, []) == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]
    assert lora_server_args(4, [])[2] == "8"  # vLLM takes 1, 8, 16, ...: the smallest that fits
    assert lora_server_args(20, [])[2] == "32"
    user = ["--enable-lora", "--max-lora-rank=64", "--max-loras", "4"]
    assert lora_server_args(8, user) == []


def test_the_launcher_starts_a_lora_runs_policy_servers_with_lora(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    from vime.config.args import parse_args

    topology = topology_of(parse_args(["--hf-checkpoint", str(tmp_path / "m")]))
    plain = model_fleets(topology, run_server_args=[], router_args=[], run_dir=tmp_path)
    server = plain.fleets[topology.policy.name].slots[0].server
    assert "--enable-lora" not in server.command() and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in server._extra_env
    lora = model_fleets(topology, run_server_args=["--max-loras", "3"], router_args=[], run_dir=tmp_path, lora_rank=8)
    server = lora.fleets[topology.policy.name].slots[0].server
    cmd = server.command()
    assert "--enable-lora" in cmd and cmd[cmd.index("--max-lora-rank") + 1] == "8"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--max-loras"] == ["3"]  # the user's, once
    assert server.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_rollouts_request_the_groups_adapter_and_report_its_version(tiny_model_dir):
    from vime.config.args import parse_args

    base = ["--hf-checkpoint", str(tiny_model_dir)]
    lora = parse_args([*base, "--lora-rank", "8"])
    assert current_adapter() is None
    with serving_adapter(lora, "run", 3) as name:
        assert name == adapter_name("run", 3) == "run-v3" and version_of(name) == 3

        async def inner():  # tasks started inside see it too
            return current_adapter()
        assert asyncio.run(inner()) == "run-v3"
    assert current_adapter() is None
    with serving_adapter(lora, "run", 0) as name:
        assert name is None  # version 0: the base model (a fresh adapter is zero)
    with serving_adapter(parse_args(base), "run", 3) as name:
        assert name is None
    with serving_adapter(parse_args([*base, "--lora-rank", "8", "--rollout-env", "tool_use"]), "run", 3) as name:
        assert name is None  # another environment does not name the adapter: its run syncs merged weights
    spans = [{"version": "default", "start": 0, "end": 8}]
    sample = Sample(weight_versions=adapter_versions(spans, "run-v3"))
    assert sampled_versions(sample) == [3] and sample.weight_versions[0]["adapter"] == "run-v3"
    assert adapter_versions(spans, None) == spans
    assert version_of("my-run-v12") == 12 and version_of("Qwen") is None
    assert run_of("my-run-v12") == "my-run" and run_of(adapter_name("a-v2", 3)) == "a-v2" and run_of("Qwen") is None


def test_a_restarted_server_boots_with_the_live_adapters(tmp_path):
    assert lora_serving.current(tmp_path) is None
    (tmp_path / "run-v2").mkdir()
    lora_serving.publish(tmp_path, 2, {"run-v1": str(tmp_path / "gone"), "run-v2": str(tmp_path / "run-v2")})
    live = lora_serving.current(tmp_path)
    assert live == {"version": 2, "adapters": {"run-v2": str(tmp_path / "run-v2")}}  # a removed one is left out
    assert lora_modules_args(live) == ["--lora-modules", f"run-v2={tmp_path / 'run-v2'}"]
    args = ["--enable-lora", "--lora-modules", "run-v1=/a", "run-v0=/b", "--max-loras", "2"]
    assert without_lora_modules(args) == ["--enable-lora", "--max-loras", "2"]


@pytest.mark.parametrize("keep", [1, 2])
def test_adapter_sync_keeps_the_newest_versions_loaded(tmp_path, keep):
    torch = pytest.importorskip("torch")
    from vime.engine.weight_sync.adapter import AdapterSync

    posts = []

    async def go():
        async with AdapterSync(["http://x"], "run", tmp_path, keep=keep) as sync:
            async def fake_post(url, route, payload):
                posts.append((route, payload["lora_name"]))
                return 200, "ok"
            sync._post = fake_post
            for v in (1, 2, 3):
                await sync.sync({"a.lora_A.weight": torch.zeros(2, 2)}, {"r": 2}, v)
            return sync.adapters()
    adapters = asyncio.run(go())
    want = ["run-v2", "run-v3"][-keep:]
    assert list(adapters) == want and all((tmp_path / n).is_dir() for n in want)
    assert not (tmp_path / "run-v1").exists()
    assert ("/v1/unload_lora_adapter", "run-v1") in posts


async def test_a_lora_runs_restarted_server_is_started_with_the_live_adapters(tmp_path):
    """The supervisor restarts a dead policy server with `--lora-modules` naming the adapters the
    last sync left loaded, so it serves `<run>-v<version>` from its first request (the base weights
    stay the checkpoint's: a LoRA run publishes no full live weights)."""
    from tests.test_engine_fleet import SleepingServer, kill, restarted
    from vime.engine.fleet import EngineFleet

    class Server(SleepingServer):
        server_args = ["--enable-lora", "--lora-modules", "run-v1=/old"]

        def relaunch(self, model):
            back = Server(model, self.log_path, self.port)
            back.server_args = list(self.server_args)
            return back

    (tmp_path / "run-v2").mkdir()
    lora_serving.publish(tmp_path, 2, {"run-v2": str(tmp_path / "run-v2")})
    with EngineFleet([Server("base-model", tmp_path / "vllm-0.log", 4251)], run_dir=tmp_path) as fleet:
        kill(fleet.slots[0].server)
        lines = await restarted(fleet)
        back = fleet.slots[0].server
    assert back.model == "base-model"
    assert back.server_args == ["--enable-lora", "--lora-modules", f"run-v2={tmp_path / 'run-v2'}"]
    assert "weight version 2" in lines[-1]


def test_only_the_default_rollout_path_syncs_the_adapter(tiny_model_dir):
    from vime.config.args import parse_args
    from vime.engine.weight_sync.lora_serving import adapter_sync

    base = ["--hf-checkpoint", str(tiny_model_dir)]
    assert not adapter_sync(parse_args(base))
    assert adapter_sync(parse_args([*base, "--lora-rank", "8"]))
    assert not adapter_sync(parse_args([*base, "--lora-rank", "8", "--rollout-function-path", "my.rollout"]))
    assert not adapter_sync(parse_args([*base, "--lora-rank", "8", "--rollout-env", "tool_use"]))
