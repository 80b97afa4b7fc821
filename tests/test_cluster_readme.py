"""The README's "On a cluster" section works as written: its commands, run literally by bash on one
machine (only the two ports are swapped for free ones), start Temporal, a vLLM server, both
workers and the run, and the run finishes. The workflow is started while vLLM is still loading,
which the README promises is fine."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from vime.engine.server import free_port
from vime.store import SampleStore

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("### On a cluster", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_cluster_section_of_the_readme_trains_a_run_as_written(tiny_model_dir, tmp_path):
    script = readme_commands()
    temporal_port, vllm_port = free_port(), free_port()
    script = script.replace("7233", str(temporal_port)).replace("8000", str(vllm_port))
    (tmp_path / ".venv").symlink_to(REPO_ROOT / ".venv")
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"count to {i}", "label": "1"}) + "\n" for i in range(8)))
    (tmp_path / "readme.sh").write_text("set -euo pipefail\n" + script)
    env = {**os.environ, "MODEL": str(tiny_model_dir), "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    log = tmp_path / "readme.log"  # a file, not a pipe: the background servers keep their output open
    with open(log, "w") as out_file:
        proc = subprocess.Popen(["bash", "readme.sh"], cwd=tmp_path, env=env, stdout=out_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(timeout=900)
        out = log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the background servers and workers of the script
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"Status +COMPLETED", out), out[-4000:]
    assert out.count("ready: run exp1") == 2  # each worker says it is ready, in one line
    with SampleStore.open(tmp_path / "runs" / "exp1") as store:
        assert store.trained_counts("exp1") == {0: 8, 1: 8}
