"""What people read about steps and samples says the same thing everywhere.

- One step numbering: steps count from 1 (`vime.ops.steps`). The first step trained is "step 1"
  on the console, at x = 1 in `vime report`'s plots, in its tables, in `vime samples` (its STEP
  column, `--step 1`, `--json`) and in `vime show`; the store's `trained_step` and
  `metrics.jsonl`'s `step` keep its 0-based index (their keys are read by scripts).
- A truncated sample (it hit the length limit) finished: its status and finish reason say so,
  and no view calls it a failure (`vime samples --failed` never listed it; the memo did).
- `vime show` and `vime samples` answer in about a second of CPU: a subprocess runs each
  command on a store and checks that neither torch, transformers nor vLLM was imported (the
  token texts come from `tokenizer.json`), nor alembic (the store is at head) nor structlog
  (nothing logged).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vime.envs.contract import sample_previews
from vime.launcher.follow import format_progress
from vime.ops.queries import SampleFilter, sample_lines
from vime.ops.report import _reward_distribution, eval_curves
from vime.ops.show import load, render
from vime.sample_summary import failure_of, finish_of
from vime.store import SampleStore
from vime.types import Sample

REPO = Path(__file__).resolve().parent.parent
RUN = "views"


def sample(response: str, status: Sample.Status = Sample.Status.COMPLETED, reward: float | None = 1.0) -> Sample:
    return Sample(prompt="count to 3", tokens=[1, 2, 3, 4], response=response, response_length=2, loss_mask=[1, 1],
                  rollout_log_probs=[-0.5, -0.5], reward=reward, status=status, weight_versions=[0], metadata={})


def stored_run(path: Path, hf_checkpoint: str = "") -> str:
    """A run whose first step trained rollout "a" (one stopped, one truncated sample); rollout "b"
    failed. Returns the store's directory."""
    with SampleStore.open(str(path)) as store:
        store.ensure_run(RUN, {"hf_checkpoint": hf_checkpoint, "num_rollout": 4})
        store.write_rollouts(RUN, {"a": [sample("1 2 3"), sample("1 2", Sample.Status.TRUNCATED, 0.0)],
                                   "b": [sample("", Sample.Status.FAILED, None)]})
        store.write_step_manifest(RUN, 0, ["a"])
        store.mark_step_trained(RUN, 0)
    return str(path)


def test_the_first_step_trained_is_step_1_on_the_console_in_plots_tables_samples_and_show(tmp_path):
    store_dir = stored_run(tmp_path / "run")
    first = {"step": 0, "reward_mean": 0.5}  # metrics.jsonl's line of the first step: its 0-based index
    assert "step 1/4" in format_progress(first, 4)
    assert ">step 1<" in _reward_distribution({0: [1.0, 0.0]}), "the reward-per-step plot's first box is step 1"
    curves = eval_curves([first, {"step": 1, "eval/gsm/reward_mean": 0.7, "eval_only": True}])
    assert ">step 1<" in curves and ">step 0<" not in curves, "the train reward of step 1 at x = 1"
    with SampleStore.open(store_dir) as store:
        lines, _ = sample_lines(store, RUN, SampleFilter(step=1))
        assert [(s.key, s.step) for s in lines] == [("a/0", 1), ("a/1", 1)]
        assert sample_lines(store, RUN, SampleFilter(step=0))[1] == 0, "there is no step 0"
        shown = render(load(store, RUN, "a/0")[0], None, color=False, token_table=False)
    assert "trained at step 1," in shown


def test_a_truncated_sample_finished_at_the_length_limit_and_no_view_calls_it_a_failure(tmp_path):
    truncated = sample("1 2", Sample.Status.TRUNCATED, 0.0)
    assert failure_of("truncated", {}) == ("", "") and finish_of("truncated") == "length"
    (preview,) = sample_previews(["a"], [[truncated]])
    assert (preview["status"], preview["finish"]) == ("truncated", "length") and "failure" not in preview
    with SampleStore.open(stored_run(tmp_path / "run")) as store:
        failed, _ = sample_lines(store, RUN, SampleFilter(failed=True))
        listed, _ = sample_lines(store, RUN, SampleFilter(rollout="a"))
        shown = render(load(store, RUN, "a/1")[0], None, color=False, token_table=False)
    assert [s.key for s in failed] == ["b/0"]
    assert [(s.key, s.status, s.failure) for s in listed] == [("a/0", "completed", ""), ("a/1", "truncated", "")]
    assert "a/1  truncated (hit the length limit)," in shown and "failure" not in shown


def test_vime_show_and_samples_import_neither_torch_transformers_nor_vllm_nor_what_they_do_not_use(tmp_path, tiny_model_dir):
    store_dir = stored_run(tmp_path / "run", str(tiny_model_dir))
    script = f"""
import json, sys
from vime.cli import main
for argv in (["show", {RUN!r}, "a", "--run-dir", {store_dir!r}, "--json"],
             ["samples", {RUN!r}, "--run-dir", {store_dir!r}, "--json"]):
    assert main(argv) == 0
print(json.dumps([m for m in ("torch", "transformers", "vllm", "alembic", "structlog") if m in sys.modules]))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert done.returncode == 0, done.stderr
    decoder, out, at, docs = json.JSONDecoder(), done.stdout, 0, []
    while at < len(out.rstrip()):
        doc, at = decoder.raw_decode(out, at)
        docs.append(doc)
        at += len(out[at:]) - len(out[at:].lstrip())
    shown, listed, imported = docs
    assert all(isinstance(t["text"], str) for s in shown for t in s["response_tokens"]), \
        "each token's text, from the checkpoint's tokenizer.json"
    assert listed["total"] == 3
    assert imported == []
