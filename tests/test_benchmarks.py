"""A benchmark that saw a failed rollout fails: no ratio from failed work. And with a working
engine it prints its figures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vime.engine.server import free_port

REPO = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, "bench/orchestration_overhead.py", "--groups", "2", "--n", "2", "--max-tokens", "4",
         "--repeats", "1"]


def test_the_orchestration_benchmark_prints_no_ratio_when_rollouts_failed():
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every rollout fails
    result = subprocess.run([*BENCH, "--vllm-url", dead], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "ratio" not in result.stdout
    failure = [line for line in result.stderr.splitlines() if "FAILED" in line]
    assert failure and "rollouts failed" in failure[0] and "first error" in failure[0], result.stderr[-2000:]


@pytest.mark.vllm
def test_the_orchestration_benchmark_prints_its_ratio_on_a_working_engine(training_server):
    result = subprocess.run([*BENCH, "--vllm-url", training_server.url], capture_output=True, text=True, cwd=REPO,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    ratios = [line.split()[0] for line in result.stdout.splitlines() if "throughput ratio (workflows / direct):" in line]
    assert ratios == ["activity:", "local:"], result.stdout


def test_the_concurrency_benchmark_prints_no_figures_when_rollouts_failed():
    dead = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run([sys.executable, "bench/concurrency.py", "--rollouts", "8", "--turns", "1", "--delay", "0",
                             "--vllm-url", dead], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "wall time" not in result.stdout
    failure = [line for line in result.stderr.splitlines() if line.startswith("concurrency: FAILED")]
    assert failure and "rollouts failed" in failure[0], result.stderr[-2000:]


@pytest.mark.vllm
def test_the_concurrency_benchmark_keeps_every_session_in_flight_and_stores_every_sample(training_server):
    result = subprocess.run([sys.executable, "bench/concurrency.py", "--rollouts", "16", "--turns", "2", "--delay",
                             "1", "--vllm-url", training_server.url], capture_output=True, text=True, cwd=REPO,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "peak sessions in flight: workflows 16, direct 16 (of 16)" in result.stdout, result.stdout
    assert "failed rollouts 0, lost 0" in result.stdout


def test_the_session_affinity_benchmark_prints_no_table_when_requests_failed(tiny_model_dir):
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]  # nothing listens there: every request fails
    result = subprocess.run([sys.executable, "bench/session_affinity.py", "--sessions", "2", "--turns", "2",
                             "--rounds", "1", "--model", str(tiny_model_dir), "--vllm-urls", *dead],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "hit rate" not in result.stdout, result.stdout
    failure = [line for line in result.stderr.splitlines() if line.startswith("session_affinity: FAILED")]
    assert failure and "requests failed" in failure[0] and "first error" in failure[0], result.stderr[-2000:]
    assert "cannot reach vLLM" in failure[0], failure[0]


@pytest.mark.vllm
def test_the_session_affinity_benchmark_prints_every_policy_with_its_hit_rate(
        tiny_model_dir, vllm_server, long_context_server):
    """On the suite's two sampling servers (the same model, 32-token blocks) rather than two of its
    own: the benchmark resets their prefix caches before each policy's run."""
    result = subprocess.run([sys.executable, "bench/session_affinity.py", "--sessions", "4", "--turns", "2",
                             "--rounds", "1", "--model", str(tiny_model_dir),
                             "--vllm-urls", vllm_server.url, long_context_server.url],
                            capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "hit rate" in line)
    assert header.split()[:3] == ["policy", "hit", "rate"], result.stdout
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] and line.split()[0] in
            ("consistent_hash", "cache_aware", "round_robin")}
    assert set(rows) == {"consistent_hash", "cache_aware", "round_robin"}, result.stdout
    for row in rows.values():
        hits, queries = map(int, row[2].split("/"))
        assert 0 <= hits <= queries and row[1] == f"{hits / queries:.1%}", result.stdout
        assert sum(map(int, row[-1].split("/"))) == 4 * 2, result.stdout  # every turn finished on some server
    # a session's second turn extends its first on the same server: full blocks of it are cached
    hits, _ = map(int, rows["consistent_hash"][2].split("/"))
    assert hits > 0, result.stdout


def test_the_weight_sync_benchmark_prints_no_ratio_when_a_sync_failed():
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the first sync fails
    result = subprocess.run([sys.executable, "bench/weight_sync.py", "--sizes", "tiny", "--file-server", dead,
                             "--collective-server", dead], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "ratio" not in result.stdout
    failure = [line for line in result.stderr.splitlines() if line.startswith("weight_sync: FAILED")]
    assert len(failure) == 1 and dead in failure[0] and "cannot reach" in failure[0], result.stderr[-2000:]


@pytest.mark.vllm
def test_the_weight_sync_benchmark_compares_the_engines_on_the_tiny_model(training_server, tiny_model_dir, tmp_path):
    """A server per engine (the engine is fixed at server start): the suite's training server is
    the file engine's, and a collective one is started here (~1 min) with the flags the benchmark
    starts its own with; each is synced a few times. The syncs leave the tiny model's weights
    rounded to bf16 in the training server: every run on it syncs its own weights on attach."""
    from vime.engine.server import VLLMServer
    from vime.engine.weight_sync.protocol import weight_sync_server_args

    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    collective = VLLMServer(tiny_model_dir, log_path=tmp_path / "vllm-collective.log", env={"PYTHONPATH": pythonpath},
                            server_args=[*weight_sync_server_args("collective"), "--max-model-len", "512",
                                         "--seed", "0"])
    try:
        collective.start().wait_healthy(900)  # the benchmark's own wait
        result = subprocess.run([sys.executable, "bench/weight_sync.py", "--sizes", "tiny", "--repeats", "1",
                                 "--file-server", training_server.url, "--collective-server", collective.url],
                                capture_output=True, text=True, cwd=REPO, timeout=900)
    finally:
        collective.stop()
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    rows = {line[:20].strip(): line[20:].split() for line in result.stdout.splitlines()
            if line.startswith(("file dense", "collective dense", "collective delta", "raw gloo broadcast"))}
    assert list(rows) == ["file dense", "collective dense", "collective delta", "raw gloo broadcast"], result.stdout
    total = rows["file dense"][3].split("/")[1]
    assert rows["file dense"][3] == rows["collective dense"][3] == f"{total}/{total}"
    changed = int(rows["collective delta"][3].split("/")[0])
    assert 0 < changed < 0.05 * int(total)  # --fraction 0.01 of the elements moved
    assert float(rows["collective delta"][2]) < 0.1 * float(rows["collective dense"][2])
    assert rows["raw gloo broadcast"][-1] == "1.0x"


def test_the_store_bulk_benchmark_round_trips_on_both_backends_and_prints_the_ratio():
    result = subprocess.run([sys.executable, "bench/store_bulk.py", "--samples", "40", "--batch", "20",
                             "--length", "256", "--prompt-length", "64"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "40 samples x 256 tokens" in result.stdout
    assert "sqlite     write" in result.stdout and "postgresql write" in result.stdout, result.stdout + result.stderr
    assert "postgresql / sqlite: write" in result.stdout


EVAL_COST = [sys.executable, str(REPO / "bench" / "eval_cost.py"), "--steps", "3", "--eval-interval", "1",
             "--eval-prompts", "4", "--n-samples-per-eval-prompt", "2"]
BOOM_ON_EVAL = '''
async def rm(args, sample):
    if "count" in str(sample.prompt):  # the bench's held-out prompts; its training prompts say "say i"
        raise ValueError("boom")
    return 1.0
'''


@pytest.mark.vllm
def test_the_eval_cost_benchmark_prints_no_ratio_when_eval_samples_failed(training_server, tmp_path):
    (tmp_path / "boom_on_eval.py").write_text(BOOM_ON_EVAL)
    result = subprocess.run([*EVAL_COST, "--vllm-url", training_server.url, "--out", str(tmp_path / "out"), "--",
                             "--custom-rm-path", "boom_on_eval.rm"], capture_output=True, text=True, cwd=tmp_path,
                            timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "steps/min" not in result.stdout
    failure = [line for line in result.stderr.splitlines() if line.startswith("eval_cost: FAILED")]
    assert failure and "the eval run" in failure[0], result.stderr[-2000:]


@pytest.mark.vllm
def test_the_eval_cost_benchmark_prints_both_runs_steps_per_minute_and_their_ratio(training_server, tmp_path):
    result = subprocess.run([*EVAL_COST, "--vllm-url", training_server.url, "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert [line.split(":")[0].strip() for line in lines if "steps/min (" in line] == ["no eval", "eval"], lines
    assert "4 round(s)" in next(line for line in lines if line.strip().startswith("eval:"))  # 0, 1, 2 and after 3
    assert any(re.search(r"training runs at \d+\.\d\dx the steps/min of the run without", line) for line in lines)


BURST = [sys.executable, "bench/activity_burst.py", "--bursts", "8", "24", "--work", "0.2"]


def test_the_activity_burst_benchmark_starts_every_activity_without_a_stall():
    """Small bursts on the file-backed dev server, the rollout activities' own bounds: every
    activity runs once, none is found late. Late here is 30 s, not the bench's 10: CI's two
    workers load this machine past what the 10 s figure assumes (a quiet machine's 64 and 256
    bursts against 10 s: docs/performance.md)."""
    result = subprocess.run([*BURST, "--fan-out", "8", "--stall", "30"], capture_output=True, text=True, cwd=REPO,
                            timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    bursts = [line for line in result.stdout.splitlines() if line.startswith("burst")]
    assert [line.split(":")[0].split() for line in bursts] == [["burst", "8"], ["burst", "24"]], result.stdout
    assert all("stalled 0, failed 0" in line for line in bursts), result.stdout
    assert "heartbeat timeout 6 s" in result.stdout and "no stall" in result.stdout


def test_a_lost_activity_start_is_found_within_the_rollout_bound_not_a_minute():
    """A group whose eight activities' starts are lost (acted out: started, never heard of): each
    is retried after the 6 s heartbeat bound and a 1 s retry interval (~8 s on a quiet machine,
    under the bench's 10 s stall; the test allows a loaded machine up to 30 s, half the 60 s bound
    of before)."""
    result = subprocess.run([*BURST[:3], "16", *BURST[5:], "--fan-out", "8", "--lose", "1", "--stall", "30"],
                            capture_output=True, text=True, cwd=REPO, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    burst = next(line for line in result.stdout.splitlines() if line.startswith("burst"))
    assert "retried 8, stalled 0, failed 0" in burst, result.stdout
    found = float(re.search(r"schedule→start +([\d.]+) s", burst).group(1))
    assert 6 <= found < 30, burst


def test_the_activity_burst_benchmark_fails_on_a_stall():
    """A stall is any activity found late: with a bound no activity meets, every one stalls."""
    result = subprocess.run([*BURST[:3], "4", *BURST[5:], "--stall", "0"], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "STALLED" in result.stdout
    failure = [line for line in result.stderr.splitlines() if line.startswith("activity_burst: FAILED")]
    assert failure and "4 stalled" in failure[0], result.stderr[-2000:]


def test_the_fast_start_benchmark_fails_in_one_line_when_a_launch_fails(tmp_path):
    """A launch that cannot start (its run directory's parent is a file) fails the bench with its
    last lines, and no launch → first step figure is printed from it."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    result = subprocess.run([sys.executable, "bench/fast_start.py", "--out", str(blocked)], capture_output=True,
                            text=True, cwd=REPO, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "launch → first step" not in result.stdout
    assert "fast_start: launch 1 failed (exit" in result.stderr, result.stderr[-2000:]


TRAIN_PHASE = [sys.executable, "bench/train_phase.py", "--repeats", "1", "--groups", "2", "--n", "4"]


def test_the_train_phase_benchmark_prints_vime_and_the_plain_loop_side_by_side_and_their_ratio():
    result = subprocess.run([*TRAIN_PHASE, "--with-fsdp2"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    medians = [line.split("median")[0].strip() for line in result.stdout.splitlines() if " median " in line]
    assert medians == ["vime", "vime, FSDP2 at world size 1", "plain"], result.stdout
    ratio = r"ratio \(vime / plain\): \d+\.\d\dx \(goal <= 1\.5x: (met|missed)\)"
    assert re.search(ratio, result.stdout), result.stdout


def test_the_train_phase_benchmark_prints_no_ratio_when_a_side_failed(tiny_model_dir, tmp_path):
    """A model directory with a config and no weights: the trainer's side fails to load it."""
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    result = subprocess.run([*TRAIN_PHASE, "--model", str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                            timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "ratio" not in result.stdout
    failure = [line for line in result.stderr.splitlines() if line.startswith("train_phase: FAILED (vime)")]
    assert failure, result.stderr[-2000:]


def test_the_rollout_overhead_benchmark_prints_no_ratio_when_the_engine_is_unreachable():
    dead = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run([sys.executable, "bench/rollout_overhead.py", "--rounds", "1", "--steps", "2",
                             "--vllm-url", dead], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "vime/direct" not in result.stdout
    failure = [line for line in result.stderr.splitlines() if line.startswith("rollout_overhead: FAILED")]
    assert failure and "cannot reach vLLM" in failure[0], result.stderr[-2000:]


@pytest.mark.vllm
def test_the_rollout_overhead_benchmark_compares_a_quickstart_step_with_the_same_requests_sent_direct(
        training_server, tmp_path):
    """One round: the quickstart for 2 steps on the suite's training server (it takes weight
    syncs), then step 1's 64 requests again, straight to it; then (`--floor`) the quickstart with
    a generate hook that samples nothing: the orchestration alone."""
    result = subprocess.run([sys.executable, "bench/rollout_overhead.py", "--rounds", "1", "--steps", "2",
                             "--vllm-url", training_server.url, "--out", str(tmp_path / "out"), "--floor"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert re.search(r"vime rollout phase \(median of 1 steps\): \d+\.\d\d s", result.stdout), result.stdout
    assert re.search(r"direct, same requests \(median of 1 batches\): \d+\.\d\d s", result.stdout), result.stdout
    assert re.search(r"rollout_overhead: vime/direct \d+\.\d\dx \(goal <= 1\.3x: (met|missed)\)", result.stdout)
    assert re.search(r"vime without an engine \(median of 1 steps\): \d+\.\d\d s", result.stdout), result.stdout


def test_the_multi_tenant_benchmark_prints_no_table_when_a_run_failed_or_missed_a_step(tmp_path):
    """Its figures come from each run's console and metrics.jsonl: a failed launch, or a run
    whose metrics miss a step, ends the bench with that run's last lines instead of a table."""
    from bench.fast_start import Launch
    from bench.multi_tenant import figures

    run_dir = tmp_path / "fleet-0"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "finished_at": 100.0 + s, "sync_wire_bytes": 134608, "sync_seconds": 0.1}) + "\n"
        for s in (0, 2)))  # step 1 is missing
    printed = Launch(run_dir, stages={"first_step": 3.0}, returncode=0, tail=["[vime] step 3/3"])
    with pytest.raises(SystemExit, match=r"run fleet-0 failed \(exit 0, steps recorded \[0, 2\]\)"):
        figures("fleet-0", printed, 10.0, run_dir, steps=3)
    with pytest.raises(SystemExit, match="exit 1"):
        figures("fleet-0", Launch(run_dir, returncode=1), 10.0, run_dir, steps=2)
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "finished_at": 100.0 + 2 * s, "sync_wire_bytes": 134608, "sync_seconds": 0.1}) + "\n"
        for s in range(3)))
    ok = figures("fleet-0", printed, 10.0, run_dir, steps=3)
    assert (ok.first_step, ok.steps_per_minute, ok.sync_bytes) == (3.0, 30.0, 134608)
