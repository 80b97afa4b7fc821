"""A rollout is readable in the Temporal Web UI after its run ended, without SQL: `vime ui` serves
the run's own history, and each group's workflow carries its samples' reward, status, prompt and
response in its memo. Checked in headless Chromium (Debian's `chromium`) on the UI's page for a
group's workflow: the response text is on the rendered page."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import pytest
from temporalio.client import Client

from tests.conftest import engine_flags
from tests.runs import REPO, TrainRun
from tests.test_ops import chromium_binary
from vime.sample_summary import preview
from vime.store import SampleStore

pytestmark = pytest.mark.vllm


def rendered_dom(url: str, tmp_path, budget_ms: int) -> str:
    """The page after its scripts ran for `budget_ms` of virtual time (the UI is a single-page
    app that fetches the workflow from its server)."""
    done = subprocess.run([chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={tmp_path / 'chromium-profile'}",
                           f"--virtual-time-budget={budget_ms}", "--window-size=1400,2400",
                           f"--screenshot={tmp_path / 'ui.png'}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=180)
    return done.stdout


def test_the_web_ui_shows_a_rollouts_response_after_the_run(training_server, tiny_model_dir, tmp_path):
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), steps=1)
    try:
        assert run.run_to_end() == 0, run.tail()
    finally:
        run.kill_all()
    ui = subprocess.Popen([sys.executable, "-m", "vime.cli", "ui", run.run_id, "--run-dir", str(run.run_dir), "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        served = json.loads(ui.stdout.readline())
        client = asyncio.run(Client.connect(served["temporal"]))
        group = f"{run.run_id}-rollout-0"
        described = asyncio.run(client.get_workflow_handle(group).describe())
        shown = asyncio.run(described.memo())["samples"][0]
        with SampleStore.open(run.run_dir) as store:
            (sample,) = store.read_samples(run.run_id, [shown["sample"]])
        assert shown["response"] == preview(sample.response, 320) and shown["reward"] == sample.reward
        assert sample.response.strip(), "a response to look for"

        ui_root = served["ui"].split("/namespaces/")[0]
        page = f"{ui_root}/namespaces/default/workflows/{group}/{described.run_id}/memo"  # the Memo tab
        wanted = (json.dumps(shown["response"])[1:-1][:40], shown["response"][:40])
        for budget_ms in (20_000, 60_000, 120_000):  # a loaded machine may render the app late: wait longer
            dom = rendered_dom(page, tmp_path, budget_ms)
            if any(text in dom for text in wanted):
                break
        assert any(text in dom for text in wanted), dom[-3000:]
        assert (tmp_path / "ui.png").stat().st_size > 10_000
    finally:
        ui.send_signal(signal.SIGINT)
        assert ui.wait(60) == 0, ui.stderr.read()
    run.assert_nothing_left()
