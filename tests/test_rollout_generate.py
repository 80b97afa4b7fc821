"""Generation and whole groups: the default generate on the shared vLLM server, slime-style hooks
loaded by flag, fan-outs, failures as data, and the default rollout function.

Tests marked `vllm` use the session's vLLM server; the others replace generation with hooks
that need no engine (or point at a port where none listens).
"""

from __future__ import annotations

import copy
import importlib
import itertools
import json
import textwrap
import uuid

import pytest

from vime.config.args import parse_args
from vime.errors import ConfigError
from vime.rollout import vllm_rollout
from vime.rollout.data_source import RolloutDataSource
from vime.rollout.generate import close_engine_clients, generate, max_model_len, prompt_token_ids
from vime.rollout.group import FAILED_REWARD, run_group
from vime.rollout.sampling import sampling_params_from_args
from vime.rollout.tokenization import get_tokenizer
from vime.sample_summary import failure_class
from vime.types import Sample

_ids = itertools.count()

FAKE_GENERATE = """
from vime.types import Sample

async def fake(args, sample, sampling_params):
    sample.tokens = [1, 2, 3]
    sample.append_response_tokens([4, 5], [-0.1, -0.2], text=f"r{sample.index}")
    sample.status = Sample.Status.COMPLETED
    return sample

async def by_index(args, sample, **kwargs):
    # drops even groups (equal rewards), keeps odd ones (rewards differ within the group)
    return 1.0 if sample.group_index % 2 == 0 else float(sample.index % 2)
"""


@pytest.fixture(scope="module", autouse=True)
async def _close_clients():
    """The default generate keeps one engine client per event loop; close the session loop's."""
    yield
    await close_engine_clients()


@pytest.fixture
def hook_module(tmp_path, monkeypatch):
    """Write `source` as a fresh top-level module on sys.path; return its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(source: str) -> str:
        # unique per process: another test module importing this fixture gets its own counter
        name = f"gen_hooks_{next(_ids)}_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return make


def make_args(tmp_path, *extra, server=None, model=None):
    argv = ["--run-dir", str(tmp_path / "run"), "--run-id", "t", "--rollout-max-response-len", "8"]
    if model is not None:
        argv += ["--hf-checkpoint", str(model)]
    host, port = (server.host, server.port) if server is not None else ("127.0.0.1", 1)
    return parse_args([*argv, "--vllm-router-ip", host, "--vllm-router-port", str(port), *extra])


def check_consistent(sample: Sample) -> None:
    sample.validate()
    assert sample.response_length > 0
    assert len(sample.rollout_log_probs) == len(sample.loss_mask) == sample.response_length
    assert sample.loss_mask == [1] * sample.response_length
    assert all(lp <= 0.0 for lp in sample.rollout_log_probs)


# ---- the default generate, on vLLM ----------------------------------------------------------------


@pytest.mark.vllm
async def test_default_generate_fills_every_field_consistently(tmp_path, vllm_server, tiny_model_dir):
    args = make_args(tmp_path, "--rm-type", "exact_match", "--n-samples-per-prompt", "2",
                     server=vllm_server, model=tiny_model_dir)
    group = [Sample(group_index=0, index=i, prompt="def add(a, b):", label="x") for i in range(2)]
    rollouts = await run_group(args, group, sampling_params={**sampling_params_from_args(args), "ignore_eos": True})
    tokenizer = get_tokenizer(str(tiny_model_dir))
    prompt_ids = tokenizer.encode("def add(a, b):", add_special_tokens=False)
    for i, [sample] in enumerate(rollouts):
        check_consistent(sample)
        assert sample.tokens[: sample.prompt_length] == prompt_ids
        assert sample.response_length == 8 and sample.status == Sample.Status.TRUNCATED
        assert sample.response == tokenizer.decode(sample.response_tokens)
        assert isinstance(sample.weight_versions, list)
        assert sample.rollout_id == str(i) and sample.session_id == f"t-{i}" and sample.group_index == 0
        assert sample.reward == 0.0 and sample.metadata["finish_reason"] == "length"


@pytest.mark.vllm
async def test_chat_messages_are_rendered_with_the_template_and_tools(tmp_path, vllm_server, tiny_model_dir):
    args = make_args(tmp_path, server=vllm_server, model=tiny_model_dir)
    tools = [{"type": "function", "function": {"name": "ls", "description": "list files", "parameters": {}}}]
    sample = Sample(index=0, prompt=[{"role": "user", "content": "list the files"}], metadata={"tools": tools})
    out = await generate(args, sample, sampling_params_from_args(args))
    tokenizer = get_tokenizer(str(tiny_model_dir))
    rendered = tokenizer.apply_chat_template(sample.prompt, tools=tools, tokenize=False, add_generation_prompt=True)
    assert out.tokens[: out.prompt_length] == tokenizer.encode(rendered, add_special_tokens=False)
    check_consistent(out)


@pytest.mark.vllm
async def test_a_retried_sample_draws_the_same_tokens(tmp_path, vllm_server, tiny_model_dir):
    args = make_args(tmp_path, "--rollout-max-response-len", "12", "--rm-type", "f1", server=vllm_server,
                     model=tiny_model_dir)
    first = await run_group(args, [Sample(group_index=0, index=5, prompt="Once upon")])
    again = await run_group(args, [Sample(group_index=0, index=5, prompt="Once upon")])
    assert first[0][0].tokens == again[0][0].tokens


@pytest.mark.vllm
async def test_a_prompt_longer_than_the_context_fails_the_sample_not_the_group(tmp_path, vllm_server, tiny_model_dir):
    args = make_args(tmp_path, "--rm-type", "exact_match", server=vllm_server, model=tiny_model_dir)
    long_prompt = " ".join(["word"] * 6000)  # the server runs with --max-model-len 4096
    group = [Sample(group_index=0, index=0, prompt="hello"), Sample(group_index=0, index=1, prompt=long_prompt)]
    ok, too_long = await run_group(args, group)
    check_consistent(ok[0])
    assert too_long[0].status == Sample.Status.FAILED and too_long[0].metadata["prompt_too_long"]
    assert "4096" in too_long[0].metadata["error"] or "context" in too_long[0].metadata["error"]
    assert too_long[0].reward == FAILED_REWARD and "infra_failure" not in too_long[0].metadata

    args = args.replace(vllm_server_args=["--max-model-len", "16"])  # known up front: no request at all
    assert max_model_len(args) == 16
    failed = await generate(args, Sample(index=2, prompt=" ".join(["word"] * 40)), sampling_params_from_args(args))
    assert failed.status == Sample.Status.FAILED and "(--vllm-max-model-len)" in failed.metadata["error"]


SLIME_HOOKS = """
import aiohttp
from transformers import AutoTokenizer

from vime.types import Sample

TOKENIZERS = {}
SEEN = {}


async def generate(args, sample, sampling_params):
    tok = TOKENIZERS.setdefault(args.hf_checkpoint, AutoTokenizer.from_pretrained(args.hf_checkpoint))
    prompt_ids = tok.encode(sample.prompt, add_special_tokens=False)
    url = f"http://{args.vllm_router_ip}:{args.vllm_router_port}/inference/v1/generate"
    payload = {"token_ids": prompt_ids, "sampling_params": {**sampling_params, "logprobs": 0}}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=payload) as resp:
            output = await resp.json()
    choice = output["choices"][0]
    new_tokens = choice["token_ids"]
    sample.tokens = prompt_ids + new_tokens
    sample.response_length = len(new_tokens)
    sample.response = tok.decode(new_tokens)
    sample.rollout_log_probs = [item["logprob"] for item in choice["logprobs"]["content"]]
    sample.loss_mask = [1] * len(new_tokens)
    sample.status = Sample.Status.TRUNCATED if choice["finish_reason"] == "length" else Sample.Status.COMPLETED
    return sample


async def reward_func(args, sample, **kwargs):
    return float(sample.label in sample.response)


async def generate_with_vime_client(args, sample, sampling_params, evaluation=False):
    from vime.rollout.generate import get_engine_client, prompt_token_ids

    SEEN[sample.index] = evaluation
    ids = prompt_token_ids(args, sample)
    out = await get_engine_client(args).generate(ids, sampling_params, session_id=sample.session_id)
    sample.tokens = list(ids)
    sample.append_response_tokens(out.token_ids, out.log_probs, text="")
    sample.status = Sample.Status.COMPLETED
    return sample
"""


@pytest.mark.vllm
async def test_a_slime_generate_and_reward_function_run_unchanged(tmp_path, vllm_server, tiny_model_dir, hook_module):
    mod = hook_module(SLIME_HOOKS)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{mod}.generate",
                     "--custom-rm-path", f"{mod}.reward_func", server=vllm_server, model=tiny_model_dir)
    group = [Sample(group_index=1, index=2 + i, prompt="import os\n", label="") for i in range(2)]
    rollouts = await run_group(args, group)
    for i, [sample] in enumerate(rollouts):
        check_consistent(sample)
        assert sample.reward == 1.0 and sample.rollout_id == str(2 + i)

    args = args.replace(custom_generate_function_path=f"{mod}.generate_with_vime_client")
    [[evaluated]] = await run_group(args, [Sample(group_index=0, index=9, prompt="x = ", label="")], evaluation=True)
    check_consistent(evaluated)
    assert importlib.import_module(mod).SEEN == {9: True}


@pytest.mark.vllm
async def test_generate_rollout_keeps_groups_with_reward_spread(tmp_path, vllm_server, tiny_model_dir, hook_module):
    mod = hook_module(FAKE_GENERATE)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"input": f"Count to {i}:"}) + "\n" for i in range(5)))
    args = make_args(tmp_path, "--prompt-data", str(data), "--n-samples-per-prompt", "2", "--rollout-batch-size", "2",
                     "--over-sampling-batch-size", "3", "--custom-rm-path", f"{mod}.by_index",
                     "--dynamic-sampling-filter-path", "vime.rollout.filters.check_reward_nonzero_std",
                     server=vllm_server, model=tiny_model_dir)
    source = RolloutDataSource(args)
    groups = await vllm_rollout.generate_rollout(args, 0, source)
    assert [g[0].group_index for g in groups] == [1, 3]
    for group in groups:
        assert [s.index for s in group] == [2 * group[0].group_index, 2 * group[0].group_index + 1]
        for sample in group:
            check_consistent(sample)
    assert source.position == 6  # two rounds of --over-sampling-batch-size 3
    # groups still running when the batch was full go back to the data source untouched
    assert all(s.status == Sample.Status.PENDING and s.response_length == 0 for g in source.buffer for s in g)


# ---- groups without an engine --------------------------------------------------------------------


FAN_OUT = """
import copy
from vime.types import Sample

RM_CALLS = []

async def fan_out(args, sample, sampling_params):
    siblings = []
    for k in range(3):
        s = copy.deepcopy(sample)
        s.tokens = [1, 2]
        s.append_response_tokens([3 + k] * (k + 1), [-0.5] * (k + 1), text="x" * (k + 1))
        s.status = Sample.Status.COMPLETED
        siblings.append(s)
    return siblings

async def length_rm(args, sample, **kwargs):
    RM_CALLS.append(sample.response)
    return float(len(sample.response))

async def batched(args, samples):
    RM_CALLS.append([s.index for s in samples])
    return [float(s.index) for s in samples]

async def own_ids(args, sample, sampling_params):
    a, b = copy.deepcopy(sample), copy.deepcopy(sample)
    a.rollout_id, b.rollout_id = "a", "b"
    return [a, b]

async def nothing(args, sample, sampling_params):
    return None

async def buggy(args, sample, sampling_params):
    raise ValueError("the agent could not parse its own tool call")

async def misconfigured(args, sample, sampling_params):
    raise __import__("vime.errors").errors.ConfigError("--my-flag is missing")
"""


async def test_fan_out_siblings_share_rollout_id_and_the_last_siblings_reward(tmp_path, hook_module):
    mod = hook_module(FAN_OUT)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{mod}.fan_out", "--custom-rm-path",
                     f"{mod}.length_rm")
    rollouts = await run_group(args, [Sample(group_index=4, index=8), Sample(group_index=4, index=9)])
    assert [[s.rollout_id for s in r] for r in rollouts] == [["8"] * 3, ["9"] * 3]
    assert all(s.reward == 3.0 and s.group_index == 4 for r in rollouts for s in r)
    assert importlib.import_module(mod).RM_CALLS == ["xxx", "xxx"]  # only the last sibling is scored
    for r in rollouts:
        for s in r:
            s.validate()


async def test_group_rm_sees_the_whole_group_once(tmp_path, hook_module):
    fake, rm = hook_module(FAKE_GENERATE), hook_module(FAN_OUT)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{fake}.fake", "--custom-rm-path",
                     f"{rm}.batched", "--group-rm")
    rollouts = await run_group(args, [Sample(group_index=0, index=i) for i in range(3)])
    assert [r[0].reward for r in rollouts] == [0.0, 1.0, 2.0]
    assert importlib.import_module(rm).RM_CALLS == [[0, 1, 2]]


async def test_a_failed_generate_becomes_a_failed_sample(tmp_path, tiny_model_dir, hook_module):
    mod = hook_module(FAN_OUT)
    args = make_args(tmp_path, "--rm-type", "exact_match", model=tiny_model_dir)  # nothing listens on port 1
    original = Sample(group_index=0, index=3, prompt="hi", label="x")
    [[down]] = await run_group(args, [copy.deepcopy(original)])
    assert down.status == Sample.Status.FAILED and down.reward is None
    assert "cannot reach vLLM at http://127.0.0.1:1" in down.metadata["infra_failure"]
    assert down.metadata["error"] == down.metadata["infra_failure"]
    assert down.rollout_id == "3" and down.prompt == "hi" and down.tokens == []
    assert failure_class(down.status.value, down.metadata) == "infra"  # its class in eval figures

    args = args.replace(custom_generate_function_path=f"{mod}.buggy")
    [[broken]] = await run_group(args, [copy.deepcopy(original)])
    assert broken.status == Sample.Status.FAILED and broken.reward == FAILED_REWARD
    assert broken.metadata["error"] == "ValueError: the agent could not parse its own tool call"
    assert "infra_failure" not in broken.metadata
    assert failure_class(broken.status.value, broken.metadata) == "generate_error"

    args = args.replace(custom_generate_function_path=f"{mod}.misconfigured")
    with pytest.raises(ConfigError, match="--my-flag is missing"):
        await run_group(args, [copy.deepcopy(original)])


async def test_hooks_that_break_the_contract_are_named(tmp_path, hook_module):
    mod = hook_module(FAN_OUT)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{mod}.nothing", "--rm-type", "exact_match")
    with pytest.raises(ConfigError, match=rf"--custom-generate-function-path '{mod}.nothing' returned NoneType"):
        await run_group(args, [Sample(index=0)])
    args = args.replace(custom_generate_function_path=f"{mod}.own_ids")
    with pytest.raises(ConfigError, match=r"siblings with rollout ids \['a', 'b'\]"):
        await run_group(args, [Sample(index=0)])


async def test_rollout_sampling_is_bounded_when_the_filter_drops_everything(tmp_path, hook_module):
    mod = hook_module(FAKE_GENERATE)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{mod}.fake", "--rm-type", "exact_match",
                     "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                     "--dynamic-sampling-filter-path", "vime.rollout.filters.check_reward_nonzero_std")
    source = RolloutDataSource(args)
    groups = await vllm_rollout.generate_rollout(args, 0, source)
    assert len(groups) == 2 and source.position <= 2 * vllm_rollout.MAX_GROUPS_FACTOR
    assert all(s.reward == 0.0 for g in groups for s in g)

    class Finite(RolloutDataSource):
        def get_samples(self, num_groups):
            return super().get_samples(min(num_groups, max(0, 3 - self.position)))

    args = args.replace(dynamic_sampling_filter_path=None, rollout_batch_size=5)
    assert len(await vllm_rollout.generate_rollout(args, 0, Finite(args))) == 3


async def test_eval_rollout_runs_every_eval_prompt_apart_from_training(tmp_path, hook_module):
    mod = hook_module(FAKE_GENERATE)
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"input": f"q{i}", "label": f"r{i}"}) + "\n" for i in range(2)))
    args = make_args(tmp_path, "--custom-generate-function-path", f"{mod}.fake", "--rm-type", "exact_match",
                     "--label-key", "label", "--eval-prompt-data", "a", str(tmp_path / "a.jsonl"),
                     "b", str(tmp_path / "b.jsonl"))
    groups = await vllm_rollout.generate_rollout(args, 0, None, evaluation=True)
    ids = sorted(s.rollout_id for g in groups for s in g)
    assert ids == ["eval-a-0", "eval-a-1", "eval-b-0", "eval-b-1"]
    results = vllm_rollout.eval_results(args, groups)
    assert results["a"]["rewards"] == [1.0, 1.0] and results["b"]["truncated"] == [False, False]
    args = args.replace(eval_prompt_data=["a"])
    with pytest.raises(ConfigError, match="name path pairs"):
        await vllm_rollout.generate_rollout(args, 0, None, evaluation=True)


def test_generate_rollout_sync_runs_from_plain_code(tmp_path, hook_module):
    mod = hook_module(FAKE_GENERATE)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{mod}.fake", "--rm-type", "exact_match",
                     "--rollout-batch-size", "2")
    groups = vllm_rollout.generate_rollout_sync(args, 0, RolloutDataSource(args))
    assert [g[0].index for g in groups] == [0, 1]


def test_prompt_token_ids_need_the_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="--hf-checkpoint is not set"):
        prompt_token_ids(make_args(tmp_path), Sample(prompt="hi"))
