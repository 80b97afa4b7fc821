"""A training workflow starts where the store says its run stands (`workflows/durable_start.py`):
a finished run is not trained again, and an input state behind the store's trained steps resumes
past them, from the newest checkpoint the store recorded. The rule is pure; the store keeps what
it reads (a run's newest checkpoint and the state it finished with). The Web UI test
(tests/test_web_ui.py) shows both on a real run started from the Start Workflow form."""

from __future__ import annotations

from vime.store import SampleStore
from vime.temporal.training_contract import TrainingConfig, TrainingState
from workflows.durable_start import finished_line, finished_record, finished_state, resume_point
from workflows.steps import RunRecord

CFG = TrainingConfig(run_id="exp", num_rollout=10, rollout_batch_size=2, over_sampling_batch_size=2, save="/ckpt")


def checkpoint(step: int, version: int | None = None, position: int | None = None) -> dict:
    return {"step": step, "path": f"/ckpt/step_{step:06d}", "weight_version": step if version is None else version,
            "data_position": 2 * step if position is None else position}


def test_a_finished_run_returns_the_state_it_finished_with_and_one_line_that_says_how_to_train_more():
    ended = TrainingState(step=10, data_position=20, weight_version=10, checkpoint_step=10, checkpoint="/ckpt/s10",
                          metrics=[{"step": 9}])
    record = RunRecord(trained_steps=10, next_position=20, checkpoint=checkpoint(10), finished=finished_record(ended))
    state = finished_state(record)
    assert state == TrainingState(step=10, data_position=20, weight_version=10, checkpoint_step=10,
                                  checkpoint="/ckpt/s10")
    assert finished_line(CFG, state) == ("run exp already finished 10 steps; nothing trained. Start a new --run-id "
                                         "(with --load /ckpt to start from its weights) to train more")
    assert finished_state(RunRecord(trained_steps=10)) is None  # trained, but its end not recorded


def test_an_input_at_step_0_resumes_at_the_newest_checkpoint_when_the_store_has_one_after_the_last_trained_step():
    resume = resume_point(CFG, TrainingState(), RunRecord(6, next_position=12, checkpoint=checkpoint(6)))
    assert (resume.step, resume.checkpoint_step, resume.checkpoint) == (6, 6, "/ckpt/step_000006")
    assert (resume.weight_version, resume.data_position) == (6, 12)
    assert resume.line == ("run exp: the store records 6 trained steps and a checkpoint at step 6, but this start's "
                           "input says step 0; resuming at step 6 so that no recorded step is trained twice")


def test_the_last_trained_step_is_trained_again_on_the_lineage_replayed_from_an_older_checkpoint():
    """Steps 3 and 4 are replayed from their manifests when the trainer attaches at checkpoint 3;
    step 5 trains in the loop: the store cannot tell whether its sync, metrics and checkpoint happened."""
    resume = resume_point(CFG, TrainingState(), RunRecord(6, next_position=12, checkpoint=checkpoint(3, version=4)))
    assert (resume.step, resume.checkpoint_step, resume.weight_version) == (5, 3, 6)  # one version per step since


def test_without_a_recorded_checkpoint_the_input_s_own_checkpoint_is_the_base_of_the_replay():
    given = TrainingState(step=2, data_position=4, weight_version=2, checkpoint_step=2, checkpoint="/load/step_2")
    resume = resume_point(CFG, given, RunRecord(6, next_position=12))
    assert (resume.step, resume.weight_version, resume.data_position) == (5, 5, 12)
    assert (resume.checkpoint_step, resume.checkpoint) == (2, "/load/step_2")


def test_an_input_at_or_past_the_last_trained_step_stands():
    """`vime train`'s own resume (its checkpoint's step), a continue-as-new, a new run."""
    assert resume_point(CFG, TrainingState(step=5, checkpoint_step=4), RunRecord(6, checkpoint=checkpoint(4))) is None
    assert resume_point(CFG, TrainingState(step=6), RunRecord(6)) is None
    assert resume_point(CFG, TrainingState(), RunRecord()) is None


def test_the_store_keeps_a_run_s_newest_checkpoint_and_the_first_finished_state(tmp_path):
    with SampleStore.open(f"sqlite:///{tmp_path / 'vime.db'}") as store:
        store.ensure_run("exp")
        assert store.run_progress("exp").checkpoint is None and store.run_progress("nobody").finished is None
        store.record_checkpoint("exp", 4, "/ckpt/step_000004", weight_version=4, data_position=8)
        store.record_checkpoint("exp", 2, "/ckpt/step_000002", weight_version=2, data_position=4)  # older: kept out
        assert store.run_progress("exp").checkpoint == checkpoint(4, position=8) | {"path": "/ckpt/step_000004"}
        store.record_finished("exp", {"step": 10, "weight_version": 10})
        store.record_finished("exp", {"step": 0})  # a run finishes once
        assert store.run_progress("exp").finished == {"step": 10, "weight_version": 10}


def test_vime_train_starts_vllm_beside_temporal_unless_the_store_recorded_the_run_s_end(tmp_path):
    """vLLM is the slowest part of a launch (three processes importing torch and vLLM), so a
    launch starts it beside the Temporal dev server it starts; a run the store says finished
    starts none (Temporal's answer, the run's result, needs no server), nor does a launch given a
    Temporal address (connecting hides nothing, and a wrong address is refused first). `vime eval` keeps the old order:
    its end is known to its workflow only."""
    from vime.config.args import parse_args
    from vime.launcher.launch import Launch

    store_url = f"sqlite:///{tmp_path / 'vime.db'}"
    args = parse_args(["--hf-checkpoint", str(tmp_path), "--prompt-data", str(tmp_path / "p.jsonl"),
                       "--run-id", "exp", "--store-url", store_url])
    launch = Launch(args, checked=True)
    assert launch.starts_engines_early()  # a run the store has never seen
    with SampleStore.open(store_url) as store:
        store.ensure_run("exp")
        assert launch.starts_engines_early()
        store.record_finished("exp", {"step": 10})
    assert not launch.starts_engines_early()
    given = Launch(parse_args(["--hf-checkpoint", str(tmp_path), "--prompt-data", str(tmp_path / "p.jsonl"),
                               "--run-id", "new", "--store-url", store_url,
                               "--temporal-address", "127.0.0.1:7233"]), checked=True)
    assert not given.starts_engines_early()  # a Temporal we are given answers first (or is refused)


def test_the_launcher_imports_neither_torch_nor_vllm():
    """The launcher starts everything else; what it imports delays all of it (torch is ~2 s here,
    and it printed triton's "nanobind: leaked" lines at exit). Checkpoints are read as files."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", "import sys, vime.launcher.launch, vime.launcher.eval_launch; "
                           "print(sorted({'torch', 'vllm', 'transformers'} & set(sys.modules)))"],
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
