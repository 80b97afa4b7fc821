"""The Temporal Web UI, in headless Chromium (Debian's `chromium`):

- a rollout is readable after its run ended, without SQL: `vime ui` serves the run's own history,
  and each group's workflow carries its samples' reward, status, prompt and response in its memo
  (the response text is on the rendered page of the group's workflow);
- a run started from the UI's Start Workflow form with `vime config`'s JSON (docs/web-ui.md)
  trains once, and submitting the form again trains nothing (the form is driven through the
  DevTools protocol, `tests/devtools.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import update
from temporalio.client import Client
from vime.temporal.client import connect

from tests.conftest import engine_flags
from tests.devtools import Browser
from tests.runs import REPO, TrainRun, write_prompts
from tests.test_ops import chromium_binary
from vime.config.args import parse_args
from vime.config.run_input import to_json, workflow_input
from vime.ops.status import status_main
from vime.sample_summary import preview
from vime.store import SampleStore
from vime.store.models import RunRow
from vime.temporal.dev_server import TemporalDevServer
from vime.temporal.training_contract import TrainingState

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
        client = asyncio.run(connect(served["temporal"], timeout=60))
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


# ---- starting a run from the Web UI's Start Workflow form ---------------------------------------

FORM_RUN = "exp-form"
TRAINER_CALLS = {"pick_trainer", "attach_trainer", "train_step", "sync_weights", "save_checkpoint"}


async def submit_start_form(browser: Browser, ui: str, workflow_id: str, run_json: str, png=None) -> None:
    """What docs/web-ui.md tells a user to do: Workflows → Start Workflow, the four fields, the
    button; the page confirms with "Workflow started successfully"."""
    await browser.goto(f"{ui}/namespaces/default/workflows/start-workflow")
    await browser.type_into("#workflowId", workflow_id)
    await browser.type_into("#taskQueue", "vime-rollout")
    await browser.type_into("#workflowType", "TrainingWorkflow")
    await browser.type_into(".cm-content[aria-label=Data]", run_json)  # `vime config`'s output, pasted
    button = "document.querySelector('[data-testid=start-workflow-button]')"
    await browser.wait_for(f"!{button}.disabled", 30, "an enabled Start Workflow button")
    if png is not None:
        await browser.screenshot(png)
    await browser.click("[data-testid=start-workflow-button]")
    await browser.wait_for("document.body.innerText.includes('Workflow started successfully')", 60,
                           "the form's confirmation")


async def next_execution(client: Client, workflow_id: str, after: str | None, timeout: float = 300):
    """The workflow's newest execution once it is not `after` and has completed; its history's activities."""
    handle = client.get_workflow_handle(workflow_id)
    deadline = time.monotonic() + timeout
    while True:
        described = await handle.describe()
        if described.run_id != after and described.status.name != "RUNNING":
            break
        assert time.monotonic() < deadline, f"{workflow_id}: no new finished execution after {after}"
        await asyncio.sleep(0.5)
    assert described.status.name == "COMPLETED", described.status
    this = client.get_workflow_handle(workflow_id, run_id=described.run_id, result_type=TrainingState)
    activities = [e.activity_task_scheduled_event_attributes.activity_type.name
                  async for e in this.fetch_history_events() if e.HasField("activity_task_scheduled_event_attributes")]
    return described.run_id, await this.result(), await described.memo(), activities


def stored_record(store_url: str, run_dir) -> dict:
    """Everything a start could change: trained samples per step, manifests, samples, metrics, checkpoints."""
    with SampleStore.open(store_url) as store:
        return {"trained": store.trained_counts(FORM_RUN), "samples": store.count_samples(FORM_RUN),
                "manifests": [s for s in range(4) if store.read_step_manifest(FORM_RUN, s)],
                "metrics": (run_dir / "metrics.jsonl").read_text(),
                "checkpoints": sorted(p.name for p in (run_dir.parent / "ckpt").iterdir())}


def test_the_web_ui_start_form_trains_a_run_once_and_a_second_submit_trains_nothing(training_server, tiny_model_dir,
                                                                                     tmp_path):
    """The issue a new user hit: the form gave no confirmation they saw, so they submitted it three
    times and got three completed executions, the later two training the finished run's stored
    steps again. Now: the first submit trains the run; a second one completes at once, with one
    line saying the run already finished, and neither a trainer call nor anything in the store.
    Then a start from the same JSON (step 0) of a run whose end the store does not hold (a vime
    before the record) resumes where the store's trained steps and checkpoint say: step 2 of 2,
    nothing trained either; and one whose last checkpoint was never saved (its workflow failed
    after training step 1) trains step 1 once more on checkpoint 1's lineage and saves step 2's."""
    run_dir = tmp_path / "runs" / FORM_RUN
    store_url = f"sqlite:///{run_dir / 'vime.db'}"
    t0 = time.monotonic()
    with TemporalDevServer(tmp_path / "temporal") as temporal:
        flags = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(write_prompts(tmp_path / "p.jsonl", 8)),
                 "--input-key", "prompt", "--label-key", "label", "--rm-type", "exact_match",
                 "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
                 "--num-rollout", "2", "--run-id", FORM_RUN, "--run-dir", str(run_dir), "--store-url", store_url,
                 "--save", str(tmp_path / "runs" / "ckpt"), "--save-interval", "1",
                 "--temporal-address", temporal.address, *engine_flags(training_server)]
        logs = tmp_path / "workers.log"
        with open(logs, "w") as log:
            workers = [subprocess.Popen([sys.executable, "-m", f"workers.{kind}", *flags], cwd=REPO, stdout=log,
                                        stderr=subprocess.STDOUT) for kind in ("rollout", "trainer")]
        try:
            run_json = to_json(workflow_input(parse_args(flags)))  # what `vime config FLAGS > run.json` writes
            first, again, status, behind, unsaved, t_first = asyncio.run(
                _starts(temporal, run_json, tmp_path, lambda: stored_record(store_url, run_dir)))
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                worker.wait(60)
    (state, memo, activities, record) = first
    assert state.step == 2 and record["trained"] == {0: 8, 1: 8}, logs.read_text()[-3000:]
    assert record["manifests"] == [0, 1] and record["checkpoints"] == ["latest", "step_000001", "step_000002"]
    assert "notice" not in memo and activities.count("train_step") == 2

    (state, memo, activities, after) = again
    line = (f"run {FORM_RUN} already finished 2 steps; nothing trained. Start a new --run-id (with --load "
            f"{tmp_path / 'runs' / 'ckpt'} to start from its weights) to train more")
    assert memo == {"notice": line} and state.step == 2 and state.weight_version == 2
    assert not TRAINER_CALLS & set(activities), activities  # no trainer attached, nothing trained
    assert after == record  # the store, the metrics and the checkpoints as the first start left them
    assert line in status, status  # `vime status` says why the last execution trained nothing

    (state, memo, activities, after) = behind
    assert state.step == 2 and state.weight_version == 2 and "resuming at step 2" in memo["notice"], memo
    assert not TRAINER_CALLS & set(activities), activities
    assert after == record

    (state, memo, activities, after) = unsaved
    assert (state.step, state.weight_version, state.checkpoint_step) == (2, 2, 2)
    assert "resuming at step 1" in memo["notice"], memo
    assert [a for a in activities if a in TRAINER_CALLS] == ["pick_trainer", "attach_trainer", "sync_weights",
                                                            "train_step", "sync_weights", "save_checkpoint"]
    assert after == record  # step 1 trained once more on checkpoint 1's lineage, its checkpoint saved again
    print(f"\n[web ui form] a run started from the form, trained in {t_first:.0f} s; a second submit and a start "
          f"behind the store trained nothing, a start after a lost checkpoint trained 1 step; "
          f"{time.monotonic() - t0:.0f} s in all")


async def _starts(temporal: TemporalDevServer, run_json: str, tmp_path, record):
    client = await connect(temporal.address, timeout=60)
    wid = f"train-{FORM_RUN}"
    t0 = time.monotonic()
    async with Browser(tmp_path / "chromium-profile") as browser:
        await submit_start_form(browser, temporal.ui_url, wid, run_json, png=tmp_path / "start-form.png")
        first_id, state, memo, activities = await next_execution(client, wid, None)
        first = (state, memo, activities, record())
        t_first = time.monotonic() - t0
        await submit_start_form(browser, temporal.ui_url, wid, run_json)  # the same form, submitted again
        again_id, *again = await next_execution(client, wid, first_id, timeout=120)
    again = (*again, record())
    status = await asyncio.to_thread(vime_status, FORM_RUN, tmp_path / "runs" / FORM_RUN, temporal.address)
    store_url = f"sqlite:///{tmp_path / 'runs' / FORM_RUN / 'vime.db'}"
    forget_the_end(store_url)  # as a vime before migration 0006 left it
    # what the form does, through the client: Temporal's default id-reuse policy, the JSON as the input
    await client.start_workflow("TrainingWorkflow", json.loads(run_json), id=wid, task_queue="vime-rollout")
    behind_id, *behind = await next_execution(client, wid, again_id, timeout=120)
    behind = (*behind, record())
    # as a workflow that failed after training its last step, before saving its checkpoint, leaves it
    ckpt = tmp_path / "runs" / "ckpt"
    shutil.rmtree(ckpt / "step_000002")
    (ckpt / "latest").write_text("step_000001")
    forget_the_end(store_url, checkpoint={"step": 1, "path": str(ckpt / "step_000001"), "weight_version": 1,
                                          "data_position": 2})
    await client.start_workflow("TrainingWorkflow", json.loads(run_json), id=wid, task_queue="vime-rollout")
    _, *unsaved = await next_execution(client, wid, behind_id, timeout=300)
    return first, again, status, behind, (*unsaved, record()), t_first


def forget_the_end(store_url: str, **values) -> None:
    with SampleStore.open(store_url) as store, store.engine.begin() as conn:
        conn.execute(update(RunRow).where(RunRow.run_id == FORM_RUN).values(finished=None, **values))


def vime_status(run_id: str, run_dir, address: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert status_main([run_id, "--run-dir", str(run_dir), "--temporal-address", address]) == 0
    return out.getvalue()
