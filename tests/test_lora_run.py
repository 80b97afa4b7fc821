"""`vime train --lora-rank 8`: the launcher starts the run's vLLM server with LoRA on, each step's
sync moves only the adapter (loaded as `<run>-v<version>`, checked by the probe through that name),
every rollout requests its group's adapter, and every trained sample of step k was sampled by
policy version k (read from the adapter's name: vLLM's spans say `default` with LoRA)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.runs import TrainRun
from vime.store import SampleStore

pytest.importorskip("peft")
pytestmark = pytest.mark.vllm


def test_a_lora_run_syncs_only_the_adapter_samples_it_on_policy_and_a_restarted_server_serves_it(
        tiny_model_dir, tmp_path):
    """Four steps; kill -9 of the vLLM server once step 2 is done: the supervisor starts it again
    with the run's live adapters (`--lora-modules`), so the groups sampled there request
    `<run>-v<k>` and get it. Every sync moves the adapter only, every trained sample of step k
    came from `<run>-v<k>`. (One run: each launch that starts its own vLLM costs ~40-100 s here.)"""
    steps = 4
    run = TrainRun(tmp_path, tiny_model_dir, "--lora-rank", "8", "--vllm-max-model-len", "512",
                   "--rm-type", "random", "--lr", "1e-3",  # rewards that differ: every step moves the adapter
                   steps=steps, groups=2, n=2)
    try:
        run.start()
        run.wait_for_step(2, timeout=300)
        os.kill(run.pid("vllm"), signal.SIGKILL)
        run.wait_for(lambda: "is back at" in run.output(), 300, "the restarted vLLM server")
        assert run.wait(timeout=600) == 0, run.tail()
        assert f"finished: {steps} steps" in run.output()
        back = [line for line in run.output().splitlines() if "is back at" in line]
        assert "serving weight version" in back[0], back
        server_log = (run.run_dir / "vllm-0.log").read_text()
        assert "'enable_lora': True" in server_log and "POST /v1/load_lora_adapter HTTP/1.1\" 200" in server_log
        assert f"LoRAModulePath(name='{run.run_id}-v" in server_log, server_log[-3000:]  # --lora-modules at boot
        run.assert_trained_exactly_once()
        metrics = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == list(range(steps))
        for m in metrics:  # the adapter file (~131 KiB on the tiny model), not the model (~5 MB)
            assert 0 < m["sync_wire_bytes"] < 300_000 and m["sync_full_bytes"] > 20 * m["sync_wire_bytes"], m
        print("sync bytes", [(m["sync_wire_bytes"], m["sync_full_bytes"], round(m["sync_seconds"], 3))
                             for m in metrics], "restart:", back[0])
        seen = run.assert_on_policy()
        assert seen == {k: {k} for k in range(steps)}, seen
        with SampleStore.open(run.run_dir) as store:
            for step in range(1, steps):
                for sample in store.read_step_samples(run.run_id, step):
                    assert {s.get("adapter") for s in sample.weight_versions} == {f"{run.run_id}-v{step}"}
        assert not (run.run_dir / "lora-live.json").exists()  # the launch forgets its adapters at its end
        run.assert_nothing_left()
    finally:
        run.kill_all()
