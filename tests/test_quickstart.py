"""The quickstart learns: through Temporal, vLLM, the trainer and a weight sync per step, the
tiny model goes from ~0.23 mean reward (chance) to >= 0.9 within 10 minutes on 2 CPU cores.

The bar is 0.9 averaged over the last 3 of 24 steps; the figures measured here are in the
issue's closing note (0.22 at step 1, 0.91 at step 12, 1.00 from step 18 in one run).

It runs with `--eval-interval 4` (issue 23's acceptance): eval rounds on the held-out prompts at
steps 0, 4, ..., 24, whose reward rises with the train reward, in `metrics.jsonl` and in the
report, which headless Chromium renders with the eval chart on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import numpy as np
from PIL import Image

from examples.quickstart.run import HELDOUT, HELDOUT_FILE, PROMPTS, eval_flags, write_prompts
from tests.conftest import engine_flags
from tests.test_ops import chromium_screenshot
from vime.metrics_log import read_metrics


REPO = Path(__file__).resolve().parent.parent


def test_the_held_out_prompts_are_none_of_the_training_prompts_and_eval_interval_evaluates_on_them(tmp_path):
    write_prompts(tmp_path / "prompts.jsonl")
    write_prompts(tmp_path / HELDOUT_FILE, count=len(HELDOUT), phrases=HELDOUT)
    texts = {name: {json.loads(line)["prompt"][0]["content"] for line in (tmp_path / name).read_text().splitlines()}
             for name in ("prompts.jsonl", HELDOUT_FILE)}
    assert len(texts[HELDOUT_FILE]) == 8 and not texts[HELDOUT_FILE] & texts["prompts.jsonl"]
    assert not {p.split(" (")[0] for p in texts[HELDOUT_FILE]} & set(PROMPTS), "other requests, not other numbers"
    assert eval_flags(["--eval-interval", "4"], tmp_path) == [
        "--eval-prompt-data", "heldout", str(tmp_path / HELDOUT_FILE), "--n-samples-per-eval-prompt", "4"]
    assert eval_flags(["--eval-interval", "4", "--eval-prompt-data", "mine", "m.jsonl"], tmp_path) == []
    assert eval_flags([], tmp_path) == []


async def test_the_second_toy_task_rewards_capitals_in_turn_over_32_positions(tiny_model_dir):
    """bench/toy_vs_trl.py's 32-token task: alternation of capital / no capital between adjacent
    tokens, over 31 pairs whatever the response's length (a short one cannot score high)."""
    from types import SimpleNamespace

    from examples.quickstart.reward import LONG_RESPONSE, _has_capital, alternating_capitals

    table = _has_capital(str(tiny_model_dir))
    cap, low = table.index(True), table.index(False)
    args = SimpleNamespace(hf_checkpoint=str(tiny_model_dir))

    async def score(response: list[int]) -> float:
        return await alternating_capitals(args, SimpleNamespace(tokens=[low, low, *response],
                                                                response_length=len(response)))

    assert await score([cap, low] * 16) == 1.0
    assert await score([cap, low] * 20) == 1.0, "positions past 32 are not counted"
    assert await score([cap] * 32) == 0.0
    assert await score([cap, low] * 4) == 7 / (LONG_RESPONSE - 1), "a short response's missing pairs count as broken"
    assert await score([]) == 0.0


def test_the_quickstart_reward_reads_capitals_without_importing_autotokenizer(tiny_model_dir):
    """The table comes from `tokenizer.json` (the `tokenizers` library: ~0.03 s, where importing
    `AutoTokenizer` cost 2.5-3.2 s of the first step) and is the one `AutoTokenizer` gives."""
    from transformers import AutoTokenizer

    from examples.quickstart.reward import _has_capital

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    expected = tuple(any(c.isupper() for c in tok.decode([i])) for i in range(len(tok)))
    assert _has_capital(str(tiny_model_dir)) == expected and 0 < sum(expected) < len(expected)


@pytest.mark.vllm
def test_the_quickstart_raises_mean_reward_to_0_9_within_10_minutes(training_server, tmp_path):
    run_dir = tmp_path / "quickstart"
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "examples.quickstart.run", "--run-dir", str(run_dir),
                             "--eval-interval", "4", *engine_flags(training_server)],
                            capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    elapsed = time.monotonic() - t0
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = (run_dir / "summary.txt").read_text()
    first = float(summary.split("mean reward ")[1].split(" ")[0])
    last = float(summary.split("-> ")[1].split(" ")[0])
    assert first < 0.5, summary
    assert last >= 0.9, summary
    assert elapsed < 600
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert (run_dir / "temporal.db").exists()  # the histories stay browsable
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000024"
    assert result.stdout.count("] step ") == 24

    # after it ended, from its directory alone: the run, its samples, one rollout
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "shorter_is_better.py").write_text(
        "async def rm(args, sample):\n    return 1.0 / (1 + sample.response_length)\n")
    hooks_env = {**env, "PYTHONPATH": str(tmp_path / "hooks")}

    def vime(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", "vime.cli", *argv, "--run-dir", str(run_dir)],
                              capture_output=True, text=True, cwd=REPO, env=hooks_env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "finished" in vime("runs").splitlines()[1]
    listed = json.loads(vime("samples", "quickstart", "--step", "24", "--json"))  # the last: steps count from 1
    assert listed["total"] == 64 and all(s["step"] == 24 for s in listed["samples"])
    (shown,) = json.loads(vime("show", "quickstart", listed["samples"][0]["key"], "--json"))
    assert shown["prompt"] and shown["response_tokens"] and (shown["step"], shown["trained_step"]) == (24, 23)
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(25)), "metrics.jsonl: one line per step, and the last round"
    assert metrics[24]["eval_only"] and "reward_mean" not in metrics[24]
    rounds = {m["step"]: m for m in metrics if "eval/heldout/reward_mean" in m}
    assert sorted(rounds) == [0, 4, 8, 12, 16, 20, 24]
    assert all(r["eval/heldout/samples"] == 8 * 4 and r["eval/heldout/failed"] == 0 for r in rounds.values())
    eval_reward = [rounds[s]["eval/heldout/reward_mean"] for s in sorted(rounds)]
    assert eval_reward[0] < 0.5 and eval_reward[-1] >= eval_reward[0] + 0.3, f"held-out reward by round: {eval_reward}"
    for step in sorted(rounds)[:-1]:  # the same policy (version k) on held-out and on training prompts
        assert abs(rounds[step]["eval/heldout/reward_mean"] - rounds[step]["reward_mean"]) < 0.2, (step, eval_reward)
    assert rounds[24]["eval/heldout/pass@4"] >= rounds[24]["eval/heldout/pass@1"]
    assert f"eval heldout {eval_reward[0]:.2f} at step 0 -> {eval_reward[-1]:.2f} at step 24" in summary
    assert "(24 steps, " in vime("report", "quickstart")
    page = (run_dir / "report.html").read_text()
    assert 'aria-label="Mean reward"' in page and 'aria-label="Eval reward beside train reward"' in page
    assert ">eval heldout</text>" in page and ">eval heldout pass@4</text>" in page
    assert "No failed eval sample in 7 round(s)." in page
    png = tmp_path / "report.png"
    chromium_screenshot(run_dir / "report.html", png, size="1200,760")  # the facts and the first row of charts
    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=int)
    # the first row holds "Mean reward" (blue only) and the eval chart, whose eval series are red and green
    for name, rgb in (("eval heldout", [0xD6, 0x27, 0x28]), ("eval heldout pass@4", [0x2C, 0xA0, 0x2C])):
        drawn = int((np.abs(pixels - rgb).max(axis=2) < 30).sum())
        assert drawn > 300, f"the {name} series covers {drawn} pixels of the report's first screen"
    before = vime("samples", "quickstart", "--json", "--limit", "0")
    evals = json.loads(vime("samples", "quickstart", "--eval", "--json", "--limit", "0"))["total"]
    assert evals == 7 * 8 * 4, "vime samples --eval: the rounds' samples, apart from the trained ones"
    rescored = json.loads(vime("rescore", "quickstart", "--custom-rm-path", "shorter_is_better.rm", "--json"))
    stored = json.loads(before)["total"] + evals  # rescore scores the eval samples too
    assert rescored["written"] == rescored["samples"] == stored and len(rescored["steps"]) == 24
    assert vime("samples", "quickstart", "--json", "--limit", "0") == before, "rescore changes no stored sample"
    again = json.loads(vime("rescore", "quickstart", "--custom-rm-path", "shorter_is_better.rm", "--json"))
    assert again["written"] == 0 and again["steps"] == rescored["steps"], "the same code again: a no-op"


def test_the_summary_counts_every_step_of_a_run_longer_than_the_state_keeps(tmp_path, capsys):
    """The training state keeps the last 100 steps' metrics; the closing line and the curve read
    metrics.jsonl, which has them all (a 130-step run said "100 steps" from step 31's reward)."""
    import json

    from examples.quickstart.run import summarize

    lines = [{"step": s, "reward_mean": s / 1000, "finished_at": 1.0 + s} for s in range(130)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    summarize("quickstart", tmp_path, lines[-100:], 1.0)
    out = capsys.readouterr().out
    assert "mean reward 0.00 at step 1 -> 0.13 over the last 3 steps, 130 steps" in out
    (tmp_path / "elsewhere").mkdir()
    summarize("quickstart", tmp_path / "elsewhere", lines[-100:], 1.0)
    assert "mean reward 0.03 at step 1" in capsys.readouterr().out  # no metrics.jsonl: what the state kept
