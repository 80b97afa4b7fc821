"""The seed page (`../shared/SEED.md`, upstream vime's agentic RL roadmap) is a contract: every
import, call, flag, `Sample` field and example it names works here as written.

Each check quotes the seed's sentence in its failure message, so a rename that breaks what our
users read fails CI saying which promise it broke. Where the page shows a call, the call is made
(the adapter against the real vLLM server, the flags through the real parser), not only looked up.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

REPO = Path(__file__).resolve().parents[1]


def seed(sentence: str) -> str:
    """The failure message: which sentence of the seed page no longer holds."""
    return f"the seed page promises: {sentence!r}"


def seed_import(module: str, name: str, sentence: str):
    """`from module import name`, failing with the seed's sentence when the path is gone."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{seed(sentence)}: from {module} import {name}: {type(exc).__name__}: {exc}")


def seed_parse(argv: list[str], sentence: str):
    """vime's flags parsed as a user's command line, failing with the seed's sentence on refusal."""
    from vime.config.args import parse_args
    from vime.errors import ConfigError

    try:
        return parse_args(argv)
    except ConfigError as exc:
        pytest.fail(f"{seed(sentence)}: {' '.join(argv)}: {exc}")


ADAPTERS = ("vime.agent.adapters.AnthropicAdapter: Anthropic Messages API ... "
            "vime.agent.adapters.OpenAIAdapter: OpenAI Chat Completions and Responses APIs")
SANDBOXES = ("The coding-agent example ships vime.agent.sandbox.E2BSandbox ... the provider-neutral "
             "vime.agent.sandbox.Sandbox protocol")


# ---- imports ---------------------------------------------------------------------------------


def test_the_adapters_import_from_the_seeds_path():
    from vime.agent.adapters.base import BaseAdapter

    for name in ("AnthropicAdapter", "OpenAIAdapter"):
        adapter = seed_import("vime.agent.adapters", name, ADAPTERS)
        assert inspect.isclass(adapter) and issubclass(adapter, BaseAdapter), seed(ADAPTERS)


def test_the_sandboxes_import_from_the_seeds_path_as_vime_sandbox_classes():
    import vime.sandbox

    for name in ("Sandbox", "E2BSandbox", "BwrapSandbox"):
        assert seed_import("vime.agent.sandbox", name, SANDBOXES) is getattr(vime.sandbox, name), seed(SANDBOXES)
    sandbox, e2b, bwrap = vime.sandbox.Sandbox, vime.sandbox.E2BSandbox, vime.sandbox.BwrapSandbox
    assert getattr(sandbox, "_is_protocol", False), seed(SANDBOXES)
    for method in ("boot", "exec", "destroy", "attach"):
        assert hasattr(e2b, method) and hasattr(bwrap, method), seed(SANDBOXES)
    import vime.agent.sandbox as seed_path

    assert set(seed_path.__all__) == set(vime.sandbox.__all__), seed(SANDBOXES)
    with pytest.raises(AttributeError):
        seed_path.NoSuchSandbox  # noqa: B018


# ---- the adapter's calls, against the real server -------------------------------------------


@pytest.fixture
async def recording_proxy(vllm_server):
    """A loopback HTTP hop in front of the real vLLM server that records each request's path and
    headers: the only way to see what the adapter sent, since vLLM does not echo them."""
    import aiohttp

    seen: list[tuple[str, dict[str, str]]] = []
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        seen.append((request.path, dict(request.headers)))
        async with session.request(request.method, f"{vllm_server.url}{request.path_qs}",
                                   data=await request.read(),
                                   headers={"Content-Type": request.headers.get("Content-Type", "")}) as r:
            return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), seen
    finally:
        await server.close()
        await session.close()


async def test_the_adapter_is_used_as_the_seed_shows(tiny_model_dir, recording_proxy):
    from transformers import AutoTokenizer

    AnthropicAdapter = seed_import("vime.agent.adapters", "AnthropicAdapter", ADAPTERS)
    proxy_url, seen = recording_proxy
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    adapter = AnthropicAdapter(tokenizer=tokenizer, vllm_url=proxy_url, tool_parser="hermes",
                               reasoning_parser="think")
    assert isinstance(adapter.app, web.Application), seed("Agent client sends requests to adapter.app.")

    session_id = "seed-session-1"
    try:
        adapter.open_session(session_id, sampling_defaults={"max_tokens": 8, "temperature": 1.0, "seed": 0})
    except TypeError as exc:
        pytest.fail(f"{seed('adapter.open_session(session_id, sampling_defaults=sampling_params)')}: {exc}")
    client = TestClient(TestServer(adapter.app))
    await client.start_server()
    try:
        reply = await client.post("/v1/messages", headers={"x-api-key": session_id}, json={
            "model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]})
        assert reply.status == 200, await reply.text()
    finally:
        segments = await adapter.finish_session(session_id)
        await client.close()

    assert segments and all(s.token_ids and s.log_probs for s in segments), seed(
        "segments = await adapter.finish_session(session_id)")
    sampled = [headers for path, headers in seen if path.endswith(("/generate", "/completions"))]
    assert sampled and all(h.get("X-SMG-Routing-Key") == session_id for h in sampled), seed(
        "The adapters pass it as X-SMG-Routing-Key so vLLM can route one session to the same worker")


def test_the_adapters_take_the_seeds_keywords():
    for name in ("AnthropicAdapter", "OpenAIAdapter"):
        adapter = seed_import("vime.agent.adapters", name, ADAPTERS)
        params = inspect.signature(adapter).parameters
        for keyword in ("tokenizer", "vllm_url", "tool_parser", "reasoning_parser"):
            assert keyword in params, seed(f"AnthropicAdapter(tokenizer=..., vllm_url=..., tool_parser=..., "
                                           f"reasoning_parser=...): {adapter.__name__} lacks {keyword}")
        assert "sampling_defaults" in inspect.signature(adapter.open_session).parameters, seed(
            "adapter.open_session(session_id, sampling_defaults=sampling_params)")
        assert inspect.iscoroutinefunction(adapter.finish_session), seed(
            "segments = await adapter.finish_session(session_id)")


# ---- flags -------------------------------------------------------------------------------------


def test_the_hook_flags_reach_their_hooks():
    from vime.config.args import parse_args
    from vime.plugins import load_hook

    args = seed_parse([
        "--custom-generate-function-path", "vime.rollout.generate.generate",
        "--custom-rm-path", "vime.rollout.on_policy_distillation.reward_func",
        "--rollout-function-path", "vime.rollout.vllm_rollout.generate_rollout",
    ], "--custom-generate-function-path ... --custom-rm-path ... --rollout-function-path")
    for dest, flag in (("custom_generate_function_path", "--custom-generate-function-path"),
                       ("custom_rm_path", "--custom-rm-path"),
                       ("rollout_function_path", "--rollout-function-path")):
        hook = load_hook(args, dest)
        assert callable(hook), seed(f"{flag}: the hook it names is what vime calls")
    default = parse_args([])
    assert default.rollout_function_path == "vime.rollout.vllm_rollout.generate_rollout", seed(
        "the default vllm_rollout prompt-by-sample structure")
    assert callable(load_hook(default, "rollout_function_path"))


def test_vllm_flags_are_forwarded_as_the_seed_spells_them():

    sentence = ("vLLM's --max-model-len becomes --vllm-max-model-len, and --gpu-memory-utilization becomes "
                "--vllm-gpu-memory-utilization")
    args = seed_parse(["--vllm-max-model-len", "2048", "--vllm-gpu-memory-utilization", "0.3"], sentence)
    assert args.vllm_server_args == ["--max-model-len", "2048", "--gpu-memory-utilization", "0.3"], seed(sentence)


def test_router_policy_is_a_router_flag_with_cache_aware_by_default():
    from vime.config.args import parse_args

    assert parse_args([]).router_policy == "cache_aware", seed(
        "otherwise, vime uses the default cache_aware policy")
    args = seed_parse(["--router-policy", "consistent_hash"], "set --router-policy consistent_hash")
    assert args.router_policy == "consistent_hash" and args.router_args[:2] == ["--policy", "consistent_hash"], seed(
        "set --router-policy consistent_hash so requests for the same sample.session_id go to the same worker")


def test_vllm_config_describes_the_topology(tmp_path):
    from vime.engine.topology import topology_of

    for name in ("policy", "rm"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    path = tmp_path / "serving.yaml"
    path.write_text(f"""
vllm:
  - name: actor
    server_groups:
      - {{worker_type: regular, num_gpus: 2, overrides: {{max_model_len: 256}}}}
  - name: reward
    model_path: {tmp_path / 'rm'}
    server_groups:
      - {{worker_type: regular, num_gpus: 1}}
""")
    sentence = ("Use --vllm-config for more complex topologies: PD disaggregation, multi-model serving, "
                "heterogeneous server groups, and per-group vLLM overrides.")
    topology = topology_of(seed_parse(["--vllm-config", str(path), "--hf-checkpoint", str(tmp_path / "policy")],
                                      sentence))
    promise = seed(sentence)
    assert [(m.name, m.num_servers) for m in topology.models] == [("actor", 2), ("reward", 1)], promise
    assert topology.policy.name == "actor", promise
    assert topology.models[0].groups[0].server_args == ["--max-model-len", "256"], promise


# ---- Sample --------------------------------------------------------------------------------


def test_sample_has_the_fields_the_seed_names():
    from vime.types import Sample

    fields = {f.name for f in dataclasses.fields(Sample)}
    for name in ("tokens", "response_length", "loss_mask", "status", "reward", "rollout_id", "session_id"):
        assert name in fields, seed(f"fill tokens, response_length, loss_mask, and status, then either fill "
                                    f"reward ...; set the same rollout_id; sample.session_id: no Sample.{name}")
    sample = Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], reward=1.0, rollout_id="r",
                    session_id="s", status=Sample.Status.COMPLETED)
    assert Sample.from_dict(json.loads(json.dumps(sample.to_dict()))) == sample


# ---- examples ------------------------------------------------------------------------------


@pytest.mark.parametrize("example, sentence", [
    ("multi_agent", "For a smaller starting point, see examples/multi_agent for the multi-agent pattern."),
    ("fully_async", "Avoid blocking training on long-tail agent rollouts: examples/fully_async"),
    ("coding_agent_rl", "The full coding-agent example is examples/coding_agent_rl."),
])
def test_the_examples_the_seed_names_are_there(example, sentence):
    folder = REPO / "examples" / example
    assert (folder / "README.md").is_file(), seed(sentence)
    assert list(folder.glob("*.py")), seed(sentence)
