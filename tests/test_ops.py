"""`vime runs`, `vime samples`, `vime show`, `vime report`: a run's store read from the shell, on
SQLite and on PostgreSQL, with no Temporal and no vLLM. (The quickstart's test runs them on a real
run too.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.runs import run_process
from tests.test_cli import REPO, one_error_line
from vime.metrics_log import MetricsLog, read_metrics
from vime.store import SampleStore
from vime.types import Sample

RUN = "exp1"


def vime(*argv: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    return subprocess.run([sys.executable, "-m", "vime.cli", *argv], capture_output=True, text=True, timeout=180,
                          cwd=REPO, env=env)


def sample(tokenizer, prompt: str, response: str, reward, *, status=Sample.Status.COMPLETED, metadata=None,
           versions=(3,)) -> Sample:
    prompt_ids, response_ids = tokenizer.encode(prompt), tokenizer.encode(response)
    n = len(response_ids)
    if n == 0:
        return Sample(prompt=prompt, tokens=prompt_ids, response="", response_length=0, reward=reward, status=status,
                      weight_versions=[], metadata=metadata or {})
    spans = [{"version": v, "start": i * n // len(versions), "end": (i + 1) * n // len(versions)}
             for i, v in enumerate(versions)]
    return Sample(prompt=prompt, tokens=prompt_ids + response_ids, response=response, response_length=n,
                  loss_mask=[1] * (n - 1) + [0], rollout_log_probs=[-0.5] * n, reward=reward, status=status,
                  weight_versions=spans, metadata=metadata or {})


@pytest.fixture
def run_store(store_location: str, tiny_model_dir: Path) -> list[str]:
    """A run of 2 trained steps, a failed rollout, an agent rollout, and one not yet trained; the
    flags that point `vime` at its store."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with SampleStore.open(store_location) as store:
        store.ensure_run(RUN, {"hf_checkpoint": str(tiny_model_dir), "num_rollout": 4})
        store.write_rollouts(RUN, {
            "g0": [sample(tok, "count to 3", "1 2 3", 1.0), sample(tok, "count to 3", "1 2", 0.0)],
            "g1": [sample(tok, "say hi", "hi there", 1.0)],
            "broken": [sample(tok, "say hi", "", None, status=Sample.Status.FAILED,
                              metadata={"infra_failure": "vLLM at http://127.0.0.1:8000 died mid-request"})],
            "agent": [sample(tok, "fix chunks()", "edited chunking.py", 0.0, versions=(3, 4),
                             metadata={"diff": "--- a/chunking.py\n+++ b/chunking.py\n",
                                       "grade": {"outcome": "tests_failed", "reason": "tests fail (exit code 1)"}})],
            "fresh": [sample(tok, "count to 2", "1 2", 1.0)],
        })
        store.write_step_manifest(RUN, 0, ["g0"])
        store.write_step_manifest(RUN, 1, ["g1", "agent"])
        store.mark_step_trained(RUN, 0)
        store.mark_step_trained(RUN, 1)
    return ["--store-url", store_location] if "://" in store_location else ["--run-dir", store_location]


def test_runs_lists_the_run_with_its_progress_and_last_reward(run_store):
    listed = vime("runs", *run_store, "--json")
    assert listed.returncode == 0, listed.stderr
    (run,) = json.loads(listed.stdout)
    assert (run["run_id"], run["samples"], run["steps_trained"], run["failed"]) == (RUN, 6, 2, 1)
    assert run["progress"] == "step 2/4" and run["last_reward"] == 0.5  # step 1: rewards 1.0 and 0.0
    table = vime("runs", *run_store).stdout
    assert table.splitlines()[0].split()[:5] == ["RUN", "STATE", "STEPS", "SAMPLES", "FAILED"]
    assert "exp1  stopped  2/4    6" in table  # no Temporal to ask: not finished, so stopped


def test_samples_lists_step_reward_status_version_failure_and_a_preview(run_store):
    listed = vime("samples", RUN, *run_store, "--json")
    assert listed.returncode == 0, listed.stderr
    got = json.loads(listed.stdout)
    assert got["total"] == 6
    by_key = {s["key"]: s for s in got["samples"]}
    # steps from 1, as the console counts them: g0 was trained by the first step (trained_step 0)
    assert (by_key["g0/1"]["step"], by_key["g0/1"]["reward"], by_key["g0/1"]["preview"]) == (1, 0.0, "1 2")
    assert by_key["broken/0"]["failure"] == "infra" and "died mid-request" in by_key["broken/0"]["cause"]
    assert by_key["agent/0"]["failure"] == "grade: tests_failed" and by_key["agent/0"]["version"] == "3-4"
    assert by_key["fresh/0"]["step"] is None

    def keys(*flags: str) -> list[str]:
        return [s["key"] for s in json.loads(vime("samples", RUN, *run_store, "--json", *flags).stdout)["samples"]]

    assert keys("--step", "2") == ["g1/0", "agent/0"]
    assert keys("--failed") == ["broken/0"]
    assert keys("--untrained") == ["broken/0", "fresh/0"]
    assert keys("--where", "reward > 0.5 AND response LIKE '1 2%'") == ["g0/0", "fresh/0"]
    assert keys("--limit", "2", "--offset", "1") == ["g0/1", "g1/0"]
    table = vime("samples", RUN, *run_store, "--limit", "3").stdout
    assert "g0/0" in table and "3 of 6 samples (next: --offset 3)" in table


def test_samples_eval_lists_the_eval_samples_by_round_and_set_apart_from_training(run_store, store_location,
                                                                                 tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with SampleStore.open(store_location) as store:
        for step in (0, 2):
            store.write_rollouts(RUN, {f"eval{step}-{name}-0": [sample(tok, "q", "1", 1.0, versions=(step,),
                                                                      metadata={"eval_set": name})]
                                       for name in ("aime", "gsm")}, eval_step=step)

    def listed(*flags: str) -> dict:
        out = vime("samples", RUN, *run_store, "--json", *flags)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert listed()["total"] == 6, "the training samples only, as before"
    evals = listed("--eval")["samples"]
    assert [(s["key"], s["step"], s["version"]) for s in evals] == [
        ("eval0-aime-0/0", 0, "0"), ("eval0-gsm-0/0", 0, "0"), ("eval2-aime-0/0", 2, "2"), ("eval2-gsm-0/0", 2, "2")]
    assert [s["key"] for s in listed("--dataset", "gsm", "--step", "2")["samples"]] == ["eval2-gsm-0/0"]
    assert listed("--dataset", "gsm", "--step", "1")["total"] == 0, "a set the run has, no round at that step"
    unknown = vime("samples", RUN, *run_store, "--dataset", "nope")
    assert unknown.returncode != 0 and unknown.stdout == ""
    assert f"--dataset 'nope': run {RUN!r} has no eval set of that name; its eval sets: aime, gsm" in unknown.stderr


def test_show_prints_prompt_response_tokens_by_loss_mask_and_the_failure(run_store):
    shown = vime("show", RUN, "agent", *run_store, "--tokens", "--color", "always")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "fix chunks()" in out and "grade: tests_failed: tests fail (exit code 1)" in out
    assert "policy version 3-4" in out and "--- a/chunking.py" in out
    assert "\033[32m" in out and "\033[90m" in out, "trained tokens green, the masked last one grey"
    assert "-0.5000" in out, "each token's logprob"
    (one,) = json.loads(vime("show", RUN, "g0/1", *run_store, "--json").stdout)
    assert (one["response"], one["trained_step"], one["step"], one["reward"]) == ("1 2", 0, 1, 0.0)
    assert "".join(t["text"] for t in one["response_tokens"]) == "1 2", "each token's text, from the run's tokenizer"
    assert [t["loss_mask"] for t in one["response_tokens"]][-1] == 0


def test_a_missing_rollout_a_bad_where_and_a_directory_without_a_store_are_one_line(run_store, tmp_path):
    assert "has no rollout 'nope'" in one_error_line(vime("show", RUN, "nope", *run_store))
    assert "--where 'rewardd > 1'" in one_error_line(vime("samples", RUN, *run_store, "--where", "rewardd > 1"))
    empty = tmp_path / "not-a-run"
    assert "no vime store in" in one_error_line(vime("samples", RUN, "--run-dir", str(empty)))
    assert not empty.exists(), "reading never creates a store"


def chromium_binary() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is not installed (Debian: apt-get install chromium; scripts/setup.sh does)"
    return binary


def chromium_screenshot(page: Path, png: Path, size: str = "1200,1600") -> None:
    """Headless Chromium (Debian's `chromium`; scripts/setup.sh installs it) renders `page`."""
    subprocess.run([chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={png.parent / 'chromium-profile'}", f"--window-size={size}",
                    f"--screenshot={png}", page.as_uri()], capture_output=True, timeout=120, check=True)


def test_report_is_one_self_contained_page_whose_plots_render_in_chromium(run_store, store_location, tmp_path):
    from PIL import Image

    run_dir = tmp_path / "metrics" if "://" in store_location else Path(store_location)
    log = MetricsLog(run_dir)
    for step, reward in enumerate([0.25, 0.5, 0.75]):
        assert log.write(step, {"reward_mean": reward, "grad_norm": 1.0 - reward, "pg_clipfrac": 0.01 * step,
                                "rollout_wait_seconds": 2.0, "train_phase_seconds": 1.0, "sync_seconds": 0.1})
    assert not MetricsLog(run_dir).write(1, {"reward_mean": 9.0}), "a step already written is not written again"
    assert [m["reward_mean"] for m in read_metrics(run_dir)] == [0.25, 0.5, 0.75]

    page = tmp_path / "report.html"
    flags = [*run_store, "--run-dir", str(run_dir)] if "://" in store_location else run_store
    done = vime("report", RUN, *flags, "--out", str(page))
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    for chart in ("Mean reward", "Grad norm", "Clip fraction", "Seconds per phase", "Reward per step"):
        assert f'aria-label="{chart}' in html, chart
    assert "infra" in html and "grade: tests_failed" in html, "the failure classes"
    assert "<script" not in html and "src=" not in html and "<link" not in html, "nothing to fetch: one file"

    if "://" in store_location:
        return  # the page does not depend on the store's kind: render it once
    png = tmp_path / "report.png"
    chromium_screenshot(page, png)
    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=int)
    line_color = int((np.abs(pixels - [0x1F, 0x77, 0xB4]).max(axis=2) < 30).sum())
    assert line_color > 500, f"the plotted lines (#1f77b4) cover {line_color} pixels of the screenshot"


def test_rescore_stores_new_rewards_beside_the_old_and_the_same_code_again_changes_nothing(
        run_store, store_location, tmp_path):
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "length_reward.py").write_text(
        "async def rm(args, sample):\n    return float(len(sample.response))\n")
    (tmp_path / "hooks" / "broken_reward.py").write_text(
        "async def rm(args, sample):\n    raise KeyError('answer')\n")
    flags = [*run_store, "--run-dir", str(tmp_path / "rescore")] if "://" in store_location else run_store
    if "://" in store_location:
        (tmp_path / "rescore").mkdir()

    def rewards() -> dict:
        listed = json.loads(vime("samples", RUN, *run_store, "--json").stdout)["samples"]
        return {s["key"]: s["reward"] for s in listed}

    before = rewards()
    done = vime("rescore", RUN, *flags, "--custom-rm-path", "length_reward.rm", "--json", pythonpath=tmp_path / "hooks")
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    assert (first["samples"], first["written"], first["scored"]) == (6, 6, 6)
    by_step = {s["step"]: s for s in first["steps"]}
    assert by_step[1]["old_mean"] == 0.5 and by_step[1]["new_mean"] == len("1 2 3") / 2 + len("1 2") / 2  # step 1: g0
    assert rewards() == before, "the samples' own rewards are not touched"

    again = json.loads(vime("rescore", RUN, *flags, "--custom-rm-path", "length_reward.rm", "--json",
                            pythonpath=tmp_path / "hooks").stdout)
    assert (again["written"], again["scored"], again["steps"]) == (0, 6, first["steps"]), "the same code: a no-op"

    failed = vime("rescore", RUN, *flags, "--custom-rm-path", "broken_reward.rm", pythonpath=tmp_path / "hooks")
    line = one_error_line(failed)
    assert "broken_reward.rm" in line and "KeyError" in line
    assert rewards() == before


def test_rescore_restarts_the_run_s_temporal_when_it_dies_and_finishes(run_store, store_location, tmp_path):
    """kill -9 of the dev server `vime rescore` started, mid-page: it is restarted on the same
    port and file, and the rescore finishes with every sample scored once."""
    if "://" in store_location:
        run_dir = tmp_path / "rescore"
        run_dir.mkdir()
        flags = [*run_store, "--run-dir", str(run_dir)]
    else:
        run_dir, flags = Path(store_location), run_store
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "slow_reward.py").write_text(
        "import asyncio\nasync def rm(args, sample):\n    await asyncio.sleep(8)\n    return 2.0\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "hooks")}
    command = subprocess.Popen([sys.executable, "-m", "vime.cli", "rescore", RUN, *flags, "--custom-rm-path",
                                "slow_reward.rm", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=REPO, env=env)
    deadline = time.monotonic() + 60
    log = run_dir / "temporal.log"
    while not log.exists() or "Temporal Server" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline and command.poll() is None, command.stderr.read()
        time.sleep(0.2)
    time.sleep(3)  # the page is being scored (8 s)
    assert command.poll() is None, command.stderr.read()
    os.kill(run_process(run_dir, "temporal"), signal.SIGKILL)
    out, err = command.communicate(timeout=300)
    assert command.returncode == 0, err[-3000:]
    assert "Temporal dev server died; restarting it" in out + err
    done = json.loads(out[out.index("{\n"):])  # after the restart line
    assert (done["samples"], done["written"], done["scored"]) == (6, 6, 6)
