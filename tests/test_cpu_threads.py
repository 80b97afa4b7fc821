"""A CPU trainer leaves its local engine a core while rollouts overlap its steps."""

from __future__ import annotations

from types import SimpleNamespace

from vime.train.cpu_threads import threads_beside_rollouts


def run(**flags) -> SimpleNamespace:
    return SimpleNamespace(**{"max_staleness": 0, "fully_async": False, "vllm_router_ip": "127.0.0.1", **flags})


def test_overlapped_rollouts_beside_a_local_engine_leave_it_one_core():
    assert threads_beside_rollouts(run(max_staleness=1), cuda=False, cores=2, environ={}) == 1
    assert threads_beside_rollouts(run(fully_async=True), cuda=False, cores=8, environ={}) == 7
    assert threads_beside_rollouts(run(max_staleness=2, vllm_router_ip=None), cuda=False, cores=4, environ={}) == 3


def test_synchronous_runs_gpus_remote_engines_and_the_users_choice_keep_torchs_threads():
    assert threads_beside_rollouts(run(), cuda=False, cores=2, environ={}) is None  # training and sampling take turns
    assert threads_beside_rollouts(run(max_staleness=1), cuda=True, cores=2, environ={}) is None
    assert threads_beside_rollouts(run(max_staleness=1, vllm_router_ip="10.0.0.7"), cuda=False, cores=2,
                                   environ={}) is None
    assert threads_beside_rollouts(run(max_staleness=1), cuda=False, cores=2,
                                   environ={"OMP_NUM_THREADS": "2"}) is None
    assert threads_beside_rollouts(run(max_staleness=1), cuda=False, cores=1, environ={}) is None
