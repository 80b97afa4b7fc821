"""`vime train --weight-sync-engine collective --update-weight-mode delta`: the launcher starts the
servers with the collective backend, the trainer broadcasts to both over gloo, delta after the
first sync, and the run trains as with the file engine."""

from __future__ import annotations

import json

import pytest

from tests.runs import TrainRun

pytestmark = pytest.mark.vllm


def test_a_run_syncs_two_servers_by_broadcast_and_sends_deltas_after_the_first(tiny_model_dir, tmp_path):
    steps = 3
    run = TrainRun(tmp_path, tiny_model_dir, "--vllm-num-servers", "2", "--weight-sync-engine", "collective",
                   "--update-weight-mode", "delta", "--vllm-max-model-len", "512",
                   "--rm-type", "random", "--lr", "1e-3",  # rewards that differ: every step moves the weights
                   steps=steps, groups=2, n=4)  # coin-flip rewards: with pairs all 6 groups tied 1 run in 64 (CI26)
    try:
        assert run.run_to_end(timeout=1200) == 0, run.tail()
        assert f"finished: {steps} steps" in run.output()
        run.assert_trained_exactly_once()
        for i in range(2):
            assert "vime_collective" in (run.run_dir / f"vllm-{i}.log").read_text()
        steps_seen = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in steps_seen] == list(range(steps))
        # each step's sync reports what changed; on a float32 wire Adam moves (nearly) every element of
        # the tiny model, whose tied LM head gives every row a gradient, so tensors go whole: never
        # more bytes than a dense sync (4 bytes per float32 element)
        for m in steps_seen:
            assert m["sync_changed"] <= m["sync_total"] and m["sync_wire_bytes"] <= 4 * m["sync_total"], m
            if m["sync_changed"] == 0:  # a step whose groups all tied: no gradient, nothing on the wire
                assert m["sync_wire_bytes"] == 0
        assert any(m["sync_changed"] for m in steps_seen), steps_seen  # the weights did move
        run.assert_nothing_left()
    finally:
        run.kill_all()
