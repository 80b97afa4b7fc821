"""examples/on_policy_distillation learns: a short run of it moves the student toward the teacher on
prompts it never trained on, through Temporal, vLLM (student and a frozen teacher), the trainer and
a weight sync per step. Four steps show the reverse KL falling; the capitals come later (the
README's 20-step run: the capital share dips first, then rises from step 6 on).

The student runs on the session's weight-syncing server (`training_server`); the teacher, a model
of its own, gets its own small server here (256-token context, 1 GiB of KV cache), passed to the
run as `--vllm-model-urls teacher=URL`: the same route a `--vllm-config` teacher takes.
The full run and its figures are in examples/on_policy_distillation/README.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from vime.store import SampleStore

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def teacher_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from examples.on_policy_distillation.teacher import student_dir, teacher_dir
    from vime.engine.server import VLLMServer

    server = VLLMServer(teacher_dir(tiny_model_dir), server_args=["--max-model-len", "256", "--max-num-seqs", "32"],
                        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                        log_path=tmp_path_factory.mktemp("vllm-teacher") / "vllm.log")
    try:
        server.start()  # boots while the student builds and, when it is not up yet, training_server boots
        student_dir(tiny_model_dir)
        yield server
    finally:
        server.stop()


def test_the_students_reverse_kl_to_the_teacher_on_held_out_prompts_falls(teacher_server, training_server,
                                                                           tmp_path):
    teacher_server.wait_healthy()
    run_dir = tmp_path / "opd"
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    result = subprocess.run(
        [sys.executable, "-m", "examples.on_policy_distillation.run", "--run-dir", str(run_dir),
         *engine_flags(training_server), "--vllm-model-urls", f"teacher={teacher_server.url}",
         "--num-rollout", "4", "--save-interval", "2"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]

    assert result.stdout.count("| teacher kl ") == 4, result.stdout  # every step prints the batch's KL
    figures = {int(step): f for step, f in json.loads((run_dir / "heldout.json").read_text()).items()}
    assert sorted(figures) == [0, 2, 4]  # the starting student and each checkpoint, measured
    assert figures[2]["reverse_kl"] < 0.8 * figures[0]["reverse_kl"], figures
    assert figures[4]["reverse_kl"] < 0.8 * figures[0]["reverse_kl"], figures  # measured here: 3.36, 1.64, 1.15
    assert "held-out reverse KL" in result.stdout and (run_dir / "heldout_kl.png").stat().st_size > 1000

    with SampleStore.open(run_dir) as store:
        samples = [sample for _, sample in store.iter_samples("opd")]
    assert len(samples) == 4 * 8 * 4
    assert all(len(s.teacher_log_probs) == s.response_length for s in samples)  # stored with each sample
    assert all(s.reward == 0.0 for s in samples)  # pure distillation: the signal is the KL, not a reward
