"""vllm-router in front of vLLM: token ids in and out through it, sessions pinned by header."""

from __future__ import annotations

import pytest

from vime.engine.client import EngineClient
from vime.router.launch import Router

pytestmark = pytest.mark.vllm


async def test_token_in_token_out_through_the_router_with_a_session(vllm_server, tmp_path):
    with Router([vllm_server.url], ["--policy", "consistent_hash"], log_path=tmp_path / "router.log") as router:
        async with EngineClient(router.url) as client:
            outs = [await client.generate([1, 10, 20, 30], {"max_tokens": 4, "ignore_eos": True, "seed": 1},
                                          session_id="session-a") for _ in range(2)]
    assert all(len(o.token_ids) == len(o.log_probs) == 4 for o in outs)
    assert outs[0].token_ids == outs[1].token_ids


def test_a_router_that_cannot_start_says_why(tmp_path):
    from vime.errors import ServiceError

    with pytest.raises(ServiceError, match="vllm-router exited"):
        with Router(["http://127.0.0.1:1"], ["--policy", "no-such-policy"], log_path=tmp_path / "router.log"):
            pass
