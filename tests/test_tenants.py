"""Several LoRA runs on one long-lived trainer: the base model is held once, each run trains its own
adapter, and a run's update is the same whether other runs trained between its steps or not.

Full fine-tunes, runs of another base model and multi-rank trainers still take the whole trainer:
a second such run waits (`TrainerBusy`) as before.
"""

from __future__ import annotations

import pytest
import torch

from activities.train import LEASE_S, TrainerActivities
from tests.runs import write_prompts
from tests.test_trainer import synthetic_batch
from vime.config.args import parse_args
from vime.config.run_args import run_configs
from vime.store import SampleStore
from vime.train.trainer_group import NotAttached, TrainerGroup

LORA = ["--lora-rank", "8", "--lora-alpha", "16", "--lr", "1e-2"]


def register(store: SampleStore, tmp_path, model, run_id: str, extra: list[str], steps: int = 2) -> None:
    """Record a run's flags (as its workflow does) and `steps` steps of stored samples."""
    write_prompts(tmp_path / "prompts.jsonl")
    argv = ["--hf-checkpoint", str(model), "--prompt-data", str(tmp_path / "prompts.jsonl"), "--input-key", "prompt",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "8",
            "--rm-type", "exact_match", "--run-id", run_id, "--run-dir", str(tmp_path / run_id), *extra]
    store.register_run(run_id, argv, {})
    for step in range(steps):
        by_rollout = {}
        for s in synthetic_batch(100 * step + len(run_id)):
            s.rollout_id = f"{step}-{s.rollout_id}"
            by_rollout[s.rollout_id] = [s]
        store.write_rollouts(run_id, by_rollout)
        store.write_step_manifest(run_id, step, list(by_rollout))


def long_lived(url: str, *flags: str) -> TrainerGroup:
    worker = parse_args(["--store-url", url, *flags])
    return TrainerGroup(worker, run_configs(worker))


def adapter(group: TrainerGroup, run_id: str) -> dict[str, torch.Tensor]:
    return group.adapter_and_probe(run_id)[0]


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-6, worst


@pytest.fixture
def store_url(tmp_path, tiny_model_dir):
    url = f"sqlite:///{tmp_path}/vime.db"
    with SampleStore.open(url) as store:
        register(store, tmp_path, tiny_model_dir, "exp-a", LORA)
        register(store, tmp_path, tiny_model_dir, "exp.b", LORA + ["--lora-rank", "4", "--use-kl-loss",
                                                                  "--kl-loss-coef", "0.1"])
        register(store, tmp_path, tiny_model_dir, "exp-c", LORA + ["--lora-dropout", "0.1", "--seed", "7"])
        register(store, tmp_path, tiny_model_dir, "full", ["--lr", "1e-3"])
    return url


def test_three_lora_runs_share_one_base_and_each_trains_as_if_it_were_alone(store_url, tmp_path):
    together = long_lived(store_url)
    for run in ("exp-a", "exp.b", "exp-c"):
        assert together.attach(run, 0, None) == 0
    for step in range(2):  # their steps interleave, as the trainer's FIFO lock takes them
        for run in ("exp-a", "exp.b", "exp-c"):
            metrics = together.train_step(run, step)
            assert metrics["samples"] == 16
    models = {id(t.trainer.model) for t in together.tenants.values()}
    assert len(models) == 1 and together.base is not None  # the base model is held once
    base_params = sum(p.numel() for n, p in together.base.model.named_parameters() if "lora_" not in n)
    from transformers import AutoModelForCausalLM
    assert base_params == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(
        together.base.path).parameters())
    shared = {run: adapter(together, run) for run in ("exp-a", "exp.b", "exp-c")}
    assert shared["exp-a"].keys() != shared["exp.b"].keys() or any(  # each run its own adapter
        not torch.equal(shared["exp-a"][k], shared["exp.b"][k]) for k in shared["exp-a"])
    assert {v.shape[0] for k, v in shared["exp.b"].items() if "lora_A" in k} == {4}  # run b's own rank

    with SampleStore.open(store_url) as store, store.engine.begin() as conn:
        trained = dict(conn.exec_driver_sql(
            "SELECT run_id, COUNT(*) FROM samples WHERE trained_step IS NOT NULL GROUP BY run_id").fetchall())
        assert trained == {"exp-a": 32, "exp.b": 32, "exp-c": 32}  # each step of each run trained once
        conn.exec_driver_sql("UPDATE samples SET trained_step = NULL")

    for run in ("exp-a", "exp.b", "exp-c"):  # the same run alone on a fresh trainer: the same adapter
        alone = long_lived(store_url)
        alone.attach(run, 0, None)
        for step in range(2):
            alone.train_step(run, step)
        assert_same(adapter(alone, run), shared[run])


def test_a_tenant_checkpoint_resumes_beside_other_runs_and_a_released_run_frees_its_adapter(store_url, tmp_path):
    group = long_lived(store_url)
    group.attach("exp-a", 0, None)
    group.attach("exp-c", 0, None)
    group.train_step("exp-a", 0)
    group.train_step("exp-c", 0)
    path = group.save(str(tmp_path / "ckpt-a"), {"run_id": "exp-a", "step": 1, "weight_version": 1,
                                                   "data_position": 4})
    group.train_step("exp-a", 1)
    group.train_step("exp-c", 1)
    expected = adapter(group, "exp-a")

    with SampleStore.open(store_url) as store, store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE samples SET trained_step = NULL WHERE run_id = 'exp-a'")
    again = long_lived(store_url)
    again.attach("exp-c", 0, None)  # another run is held first
    assert again.attach("exp-a", 1, path) == 1
    again.train_step("exp-a", 1)
    assert_same(adapter(again, "exp-a"), expected)

    adapters = set(group.base.adapters)
    group.release("exp-c")
    assert len(group.base.adapters) == len(adapters) - 1 and "exp-c" not in group.tenants
    with pytest.raises(NotAttached, match="not run 'exp-c'"):
        group.train_step("exp-c", 2)


def test_a_full_fine_tune_takes_the_whole_trainer_and_the_tenants_attach_again(store_url):
    group = long_lived(store_url)
    group.attach("exp-a", 0, None)
    group.attach("exp-c", 0, None)
    assert group.can_share(["exp-a", "exp-c"]) and not group.can_share(["exp-a", "full"])
    group.attach("full", 0, None)
    assert group.base is None and list(group.tenants) == ["full"]
    with pytest.raises(NotAttached):
        group.train_step("exp-a", 0)
    group.train_step("full", 0)


def test_leases_let_lora_runs_of_one_base_in_together_up_to_the_bound_and_keep_others_waiting(store_url):
    from temporalio.exceptions import ApplicationError

    acts = TrainerActivities.serving(long_lived(store_url, "--max-runs-per-trainer", "2"), "q")
    acts._hold("exp-a")
    acts._hold("exp-c")  # a second LoRA run of the same base: in beside the first
    with pytest.raises(ApplicationError, match="is training runs 'exp-a', 'exp-c'; run 'exp.b' waits") as busy:
        acts._hold("exp.b")  # the bound (--max-runs-per-trainer 2 here)
    assert busy.value.type == "TrainerBusy"
    acts._leases["exp-c"] -= LEASE_S + 1  # a run that stopped calling (terminated)
    acts._hold("exp.b")
    with pytest.raises(ApplicationError, match="waits for a free trainer"):
        acts._hold("full")  # a full fine-tune cannot sit beside the adapters
    assert acts.holders() == ["exp-a", "exp.b"]

    one = TrainerActivities(long_lived(store_url), "q")  # a trainer of one run at a time
    one._hold("exp-a")
    with pytest.raises(ApplicationError, match="is training run 'exp-a'"):
        one._hold("exp-c")


def test_a_trainer_holding_the_run_at_its_last_step_keeps_it_and_one_that_failed_part_way_does_not(store_url):
    """What the workflow's re-attach gets (after a continue-as-new, or a transient error): the
    run's state when the trainer stands where the run does (`current`), else a reload to the
    checkpoint (here: the initial weights) and a replay of the steps since."""
    from vime.train.trainer import PART_APPLIED

    group = long_lived(store_url)
    group.attach("full", 0, None)
    for step in range(2):
        group.train_step("full", step)
    trained = group.tenants["full"].trainer
    assert group.attach("full", 0, None, 2) == 2 and group.tenants["full"].trainer is trained  # nothing replayed
    assert group.attach("full", 0, None, 1) == 0 and group.tenants["full"].trainer is not trained  # reloaded

    group.train_step("full", 0)
    trainer = group.tenants["full"].trainer

    def fails_after_one_update(samples):  # two optimizer steps per rollout step: the first went in
        with torch.no_grad():
            next(trainer.model.parameters()).add_(1.0)
        raise RuntimeError("out of memory in the second micro-batch")

    trainer.train_step = fails_after_one_update
    with pytest.raises(RuntimeError, match="out of memory"):
        group.train_step("full", 1)
    assert trainer.step == PART_APPLIED
    assert group.attach("full", 0, None, 1) == 0  # its weights are no step's: reloaded, the run replays step 0
