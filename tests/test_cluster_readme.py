"""The README's "On a cluster" section works as written: its commands, run literally by bash on one
machine (only the two ports are swapped for free ones), start Temporal, a vLLM server, both
workers and the run, and the run finishes. The workflow is started while vLLM is still loading,
which the README promises is fine."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.readme import bash_script, readme_block
from vime.engine.server import free_port
from vime.store import SampleStore

pytestmark = pytest.mark.vllm


def test_the_cluster_section_of_the_readme_trains_a_run_as_written(tiny_model_dir, tmp_path):
    script = readme_block("### On a cluster")
    temporal_port, vllm_port = free_port(), free_port()
    script = script.replace("7233", str(temporal_port)).replace("8000", str(vllm_port))
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"count to {i}", "label": "1"}) + "\n" for i in range(8)))
    env = {**os.environ, "MODEL": str(tiny_model_dir), "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    with bash_script(tmp_path, script, env) as (proc, log):
        proc.wait(timeout=900)
        out = log.read_text()
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"Status +COMPLETED", out), out[-4000:]
    assert out.count("ready: run exp1") == 2  # each worker says it is ready, in one line
    with SampleStore.open(tmp_path / "runs" / "exp1") as store:
        assert store.trained_counts("exp1") == {0: 8, 1: 8}
