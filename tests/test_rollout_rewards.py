"""The reward hub and the dynamic-sampling filters (no vLLM needed)."""

from __future__ import annotations

import itertools
import json
import textwrap

import pytest
from aiohttp import web

from vime.config.args import parse_args
from vime.errors import ConfigError, ServiceError
from vime.rollout import rewards
from vime.rollout.filters import DynamicFilterOutput, apply_dynamic_filter, check_reward_nonzero_std
from vime.rollout.rewards import RewardError, group_rewards, reward, reward_value
from vime.types import Sample

_ids = itertools.count()


def make_args(tmp_path, *extra):
    return parse_args(["--run-dir", str(tmp_path / "run"), *extra])


@pytest.fixture
def hook_module(tmp_path, monkeypatch):
    """Write `source` as a fresh top-level module on sys.path; return its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(source: str) -> str:
        name = f"rm_hooks_{next(_ids)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return make


@pytest.mark.parametrize(
    ("rm_type", "response", "label", "expected"),
    [
        ("exact_match", " Paris ", "Paris", 1.0),
        ("exact_match", "Paris.", "Paris", 0.0),
        ("math", "so the answer is \\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("math", "we get 1,234 apples", 1234, 1.0),
        ("math", "we get 12", "13", 0.0),
        ("math", "no answer here", "3", 0.0),
        ("boxed_exact_match", "thinking... \\boxed{B}", "B", 1.0),
        ("f1", "the cat sat", "cat sat down", pytest.approx(2 / 3)),
    ],
)
async def test_built_in_reward_types(tmp_path, rm_type, response, label, expected):
    args = make_args(tmp_path, "--rm-type", rm_type)
    assert await reward(args, Sample(response=response, label=label)) == expected


async def test_a_samples_metadata_can_pick_its_reward_type(tmp_path):
    args = make_args(tmp_path, "--rm-type", "exact_match")
    sample = Sample(response="x = 4", label="4", metadata={"rm_type": "math"})
    assert await reward(args, sample) == 1.0


async def test_missing_or_unknown_reward_types_say_what_to_set(tmp_path):
    with pytest.raises(ConfigError, match="no reward function: set --custom-rm-path, --rm-url or --rm-type"):
        await reward(make_args(tmp_path), Sample(response="a"))
    with pytest.raises(ConfigError, match="--rm-type 'deepscaler' is not a built-in reward"):
        await reward(make_args(tmp_path, "--rm-type", "deepscaler"), Sample(response="a"))


async def test_a_slime_reward_function_runs_unchanged(tmp_path, hook_module):
    mod = hook_module("""
        from vime.types import Sample

        async def reward_func(args, sample: Sample, **kwargs):
            return 1.0 if sample.response.strip() == sample.label else 0.0

        def sync_rm(args, sample):
            return len(sample.response)

        async def wrong(args, sample):
            return "good"

        async def broken(args, sample):
            raise KeyError("label")
    """)
    args = make_args(tmp_path, "--custom-rm-path", f"{mod}.reward_func")
    assert await reward(args, Sample(response=" 42", label="42")) == 1.0
    assert await reward(make_args(tmp_path, "--custom-rm-path", f"{mod}.sync_rm"), Sample(response="abc")) == 3.0
    with pytest.raises(ConfigError, match=rf"--custom-rm-path '{mod}.wrong' returned str 'good'; a reward is a number"):
        await reward(make_args(tmp_path, "--custom-rm-path", f"{mod}.wrong"), Sample())
    with pytest.raises(RewardError, match=rf"--custom-rm-path '{mod}.broken' raised KeyError: 'label' on sample 7 "
                                          rf"\(.*{mod}.py:\d+\)"):
        await reward(make_args(tmp_path, "--custom-rm-path", f"{mod}.broken"), Sample(index=7))


async def test_a_reward_function_whose_model_server_is_gone_fails_as_infrastructure_and_is_retried(
        tmp_path, hook_module):
    """A reward function calling a reward model (`args.vllm_model_routers`) whose server died is
    not a bug in the function: the rollout is retried once the server is back, not the run stopped."""
    from vime.engine.server import free_port

    mod = hook_module(f"""
        import aiohttp

        async def reward_model(args, sample):
            async with aiohttp.ClientSession() as http:
                async with http.post("http://127.0.0.1:{free_port()}/v1/completions", json={{}}) as r:
                    return (await r.json())["score"]
    """)
    with pytest.raises(ServiceError, match=rf"--custom-rm-path '{mod}.reward_model' could not reach its service: "
                                           r"ClientConnectorError: .* on sample 3"):
        await reward(make_args(tmp_path, "--custom-rm-path", f"{mod}.reward_model"), Sample(index=3))


async def test_a_reward_that_is_nan_or_infinite_is_a_final_error_naming_the_hook(tmp_path, hook_module):
    mod = hook_module("""
        async def nan(args, sample):
            return float("nan")

        async def inf(args, sample):
            return float("-inf")
    """)
    for name in ("nan", "inf"):
        with pytest.raises(RewardError, match=rf"--custom-rm-path '{mod}.{name}' returned .*; a reward must be a finite"):
            await reward(make_args(tmp_path, "--custom-rm-path", f"{mod}.{name}"), Sample())


async def test_a_numpy_reward_counts_like_the_python_number_it_holds(tmp_path, hook_module):
    """A reward computed with numpy (`np.mean(...)`, `pred == label` on arrays) is a number: bools,
    ints and floats of numpy's become Python floats, as Python's do (`np.bool_` is not a
    `numbers.Real`, and was refused as "returned bool")."""
    mod = hook_module("""
        import numpy as np

        VALUE = None

        async def score(args, sample):
            return VALUE

        async def batch(args, samples):
            return np.array([1.0, 0.0, 0.5], dtype=np.float32)
    """)
    import importlib

    import numpy as np

    hooks = importlib.import_module(mod)
    args = make_args(tmp_path, "--custom-rm-path", f"{mod}.score")
    for value, expected in [(np.bool_(True), 1.0), (np.bool_(False), 0.0), (True, 1.0), (np.int64(3), 3.0),
                            (np.float32(0.25), 0.25), (np.float64(-1.5), -1.5), (np.array(0.5), 0.5)]:
        hooks.VALUE = value
        got = await reward(args, Sample())
        assert got == expected and type(got) is float, (value, got)
    hooks.VALUE = {"acc": np.bool_(True), "len": np.int32(7)}
    got = await reward(args, Sample())
    assert got == {"acc": True, "len": 7} and json.dumps(got), "a dict of numpy scores stores as JSON"
    group = make_args(tmp_path, "--custom-rm-path", f"{mod}.batch", "--group-rm")
    got = await group_rewards(group, [Sample(), Sample(), Sample()])
    assert got == [1.0, 0.0, 0.5] and all(type(v) is float for v in got)


@pytest.mark.parametrize(("value", "refused"), [
    ("np.str_('good')", "returned str 'good'; a reward is a number"),
    ("np.float32('nan')", "returned nan; a reward must be a finite number"),
    ("np.float64('inf')", "returned inf; a reward must be a finite number"),
    ("np.complex128(1j)", "returned complex '1j'; a reward is a number"),
    ("np.array([1.0, 0.0])", "returned ndarray '[1. 0.]'; a reward is a number"),
], ids=["str", "nan", "inf", "complex", "array"])
async def test_a_numpy_value_that_is_not_one_finite_number_is_refused_naming_the_hook(
        tmp_path, hook_module, value, refused):
    mod = hook_module(f"""
        import numpy as np

        async def score(args, sample):
            return {value}
    """)
    with pytest.raises(RewardError) as info:
        await reward(make_args(tmp_path, "--custom-rm-path", f"{mod}.score"), Sample())
    assert str(info.value).startswith(f"--custom-rm-path '{mod}.score' {refused}"), str(info.value)


async def test_group_rm_calls_the_batched_function_once_per_group(tmp_path, hook_module):
    mod = hook_module("""
        CALLS = []

        async def rank(args, samples):
            CALLS.append(len(samples))
            order = sorted(range(len(samples)), key=lambda i: len(samples[i].response))
            return [float(order.index(i)) for i in range(len(samples))]

        async def short(args, samples):
            return [1.0]
    """)
    args = make_args(tmp_path, "--custom-rm-path", f"{mod}.rank", "--group-rm")
    samples = [Sample(response="ccc"), Sample(response="a"), Sample(response="bb")]
    assert await group_rewards(args, samples) == [2.0, 0.0, 1.0]
    import importlib

    assert importlib.import_module(mod).CALLS == [3]
    with pytest.raises(ConfigError, match=r"must return a list of 3 rewards, one per sample; got 1 values"):
        await group_rewards(make_args(tmp_path, "--custom-rm-path", f"{mod}.short", "--group-rm"), samples)


async def test_dict_rewards_are_kept_and_reward_key_picks_the_scalar(tmp_path, hook_module):
    mod = hook_module("""
        async def scores(args, sample, **kwargs):
            return {"acc": 1.0, "format": 0.5}
    """)
    args = make_args(tmp_path, "--custom-rm-path", f"{mod}.scores", "--reward-key", "acc")
    value = await reward(args, Sample())
    assert value == {"acc": 1.0, "format": 0.5}
    assert reward_value(args, value) == 1.0
    args = args.replace(reward_key=None)
    with pytest.raises(ConfigError, match=r"keys \['acc', 'format'\]; set --reward-key"):
        reward_value(args, value)


@pytest.fixture
async def rm_server():
    """A reward service: 1.0 when the posted response equals the label; `/flaky` fails once first."""
    seen: list[dict] = []
    failures = {"flaky": 1}

    async def score(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        return web.json_response({"reward": float(body["response"] == body["label"])})

    async def number(request: web.Request) -> web.Response:
        return web.Response(text="0.25", content_type="application/json")

    async def flaky(request: web.Request) -> web.Response:
        if failures["flaky"]:
            failures["flaky"] -= 1
            return web.Response(status=503, text="warming up")
        return web.json_response({"reward": 0.5})

    async def bad(request: web.Request) -> web.Response:
        return web.Response(status=422, text="missing field")

    app = web.Application()
    app.add_routes([web.post("/score", score), web.post("/number", number), web.post("/flaky", flaky),
                    web.post("/bad", bad)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_rm_url_posts_the_sample_and_reads_the_reward(tmp_path, rm_server, monkeypatch):
    monkeypatch.setattr(rewards, "REMOTE_RM_BACKOFF_S", 0.01)
    url, seen = rm_server
    args = make_args(tmp_path, "--rm-url", f"{url}/score")
    sample = Sample(index=3, prompt="2+2?", response="4", label="4", tokens=[1, 2, 3], response_length=1)
    assert await reward(args, sample) == 1.0
    assert seen[-1] == json.loads(json.dumps(sample.to_dict()))
    assert await reward(make_args(tmp_path, "--rm-type", "remote_rm", "--rm-url", f"{url}/number"), sample) == 0.25
    assert await reward(make_args(tmp_path, "--rm-url", f"{url}/flaky"), sample) == 0.5
    with pytest.raises(ConfigError, match=rf"reward service --rm-url {url}/bad answered HTTP 422: missing field"):
        await reward(make_args(tmp_path, "--rm-url", f"{url}/bad"), sample)
    with pytest.raises(ServiceError, match=r"reward service --rm-url http://127.0.0.1:1/x failed 3 times"):
        await reward(make_args(tmp_path, "--rm-url", "http://127.0.0.1:1/x"), sample)


def rewarded(*values, infra=()):
    out = []
    for i, v in enumerate(values):
        s = Sample(index=i, reward=v)
        if i in infra:
            s.metadata["infra_failure"] = "engine down"
        out.append(s)
    return out


def test_zero_spread_groups_are_dropped(tmp_path):
    args = make_args(tmp_path)
    assert check_reward_nonzero_std(args, rewarded(1.0, 0.0, 1.0)) == DynamicFilterOutput(True, None)
    assert check_reward_nonzero_std(args, rewarded(1.0, 1.0, 1.0)) == DynamicFilterOutput(False, "zero_std_1.0")
    assert check_reward_nonzero_std(args, rewarded(0.0, 0.0, None, infra=(2,))).reason == "zero_std_0.0"
    assert check_reward_nonzero_std(args, rewarded(1.0, None, infra=(1,))).reason == "too_few_rewards"
    fan_out = [rewarded(1.0, 1.0), rewarded(0.0)]  # a fan-out's siblings share its reward
    assert check_reward_nonzero_std(args, fan_out).keep
    args = args.replace(reward_key="acc")
    assert not check_reward_nonzero_std(args, rewarded({"acc": 1.0, "len": 1}, {"acc": 1.0, "len": 9})).keep


def test_apply_dynamic_filter_loads_the_flag_and_takes_slimes_output_forms(tmp_path, hook_module):
    args = make_args(tmp_path, "--dynamic-sampling-filter-path", "vime.rollout.filters.check_reward_nonzero_std")
    assert apply_dynamic_filter(args, [[s] for s in rewarded(1.0, 1.0)]) == (False, "zero_std_1.0")
    assert apply_dynamic_filter(args, rewarded(1.0, 0.0)) == (True, None)
    assert apply_dynamic_filter(make_args(tmp_path), rewarded(1.0, 1.0)) == (True, None)
    mod = hook_module("""
        def at_least_one_long(args, samples, **kwargs):
            return any(len(s.response) > 3 for s in samples)

        async def is_async(args, samples):
            return True

        def bad(args, samples):
            return "yes"
    """)
    group = [[Sample(response="long answer")], [Sample(response="ok")]]
    assert apply_dynamic_filter(make_args(tmp_path, "--dynamic-sampling-filter-path", f"{mod}.at_least_one_long"),
                                group) == (True, None)
    with pytest.raises(ConfigError, match="is async; a filter must be a plain function"):
        apply_dynamic_filter(make_args(tmp_path, "--dynamic-sampling-filter-path", f"{mod}.is_async"), group)
    with pytest.raises(ConfigError, match=rf"'{mod}.bad' returned str; return an object with `keep` and `reason`"):
        apply_dynamic_filter(make_args(tmp_path, "--dynamic-sampling-filter-path", f"{mod}.bad"), group)
