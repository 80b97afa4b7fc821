"""`vime report RUN`: one self-contained HTML page about a run, for a browser or a colleague.

Plots of the per-step metrics (`<run_dir>/metrics.jsonl`: reward, the eval rounds' reward and
pass@k beside it, KL, entropy, response length,
clip fraction, grad norm, staleness, seconds per phase, tokens/s, infra failures), the reward
distribution of every trained step, the failure classes, and the longest and the lowest-reward
rollouts, read from the store. The plots are inline SVG: no script, no network, no plotting
library, so the file opens anywhere and can be mailed as it is. Steps are numbered from 1 in
the plots and the tables alike (`vime.ops.steps`).
"""

from __future__ import annotations

import html
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from vime.rollout.eval_metrics import failures_by_class, round_sets
from vime.ops.steps import step_number
from vime.sample_summary import failure_of, preview
from vime.store import SampleStore
from vime.store.models import RunRow, SampleRow

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"]

# (title, [(metric key, legend), ...]): a chart is drawn when any of its keys was reported
CHARTS: list[tuple[str, list[tuple[str, str]]]] = [
    ("Mean reward", [("reward_mean", "reward")]),
    ("KL", [("kl_loss", "KL loss"), ("ref_kl", "KL to reference"), ("ppo_kl", "PPO KL")]),
    ("Entropy", [("entropy_loss", "entropy"), ("entropy", "entropy")]),
    ("Response length (tokens)", [("response_length_mean", "mean")]),
    ("Clip fraction", [("pg_clipfrac", "clipped tokens")]),
    ("Grad norm", [("grad_norm", "grad norm")]),
    ("Staleness (policy versions)", [("staleness_mean", "mean"), ("staleness_max", "max")]),
    ("Seconds per phase", [("rollout_wait_seconds", "rollout"), ("train_phase_seconds", "train"),
                           ("sync_seconds", "weight sync"), ("eval_seconds", "eval round")]),
    ("Train tokens / s", [("train_tokens_per_second", "tokens/s")]),
    ("Infra failures", [("adv_infra_failures", "rollouts")]),
]


@dataclass
class RunData:
    run_id: str
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    rewards_by_step: dict[int, list[float]] = field(default_factory=dict)
    failures: Counter = field(default_factory=Counter)
    samples: int = 0
    longest: list[dict] = field(default_factory=list)
    lowest: list[dict] = field(default_factory=list)

    @property
    def trained(self) -> list[dict[str, Any]]:
        """The metrics of trained steps: not the eval round recorded after the last step."""
        return [m for m in self.metrics if not m.get("eval_only")]


def collect(store: SampleStore, run_id: str, metrics: list[dict[str, Any]], top: int = 10) -> RunData:
    with store.engine.connect() as conn:
        config = conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).scalar_one_or_none()
        rows = conn.execute(select(SampleRow.key, SampleRow.trained_step, SampleRow.reward, SampleRow.status,
                                   SampleRow.response_length, SampleRow.response, SampleRow.sample_metadata)
                            .where(SampleRow.run_id == run_id, SampleRow.eval_step.is_(None))  # training samples
                            .order_by(SampleRow.id)).all()
    data = RunData(run_id, config or {}, metrics, samples=len(rows))
    lines = []
    for r in rows:
        failure, cause = failure_of(r.status, r.metadata or {})
        data.failures[failure or "none"] += 1
        if r.trained_step is not None and r.reward is not None:
            data.rewards_by_step.setdefault(r.trained_step, []).append(r.reward)
        lines.append({"key": r.key, "step": step_number(r.trained_step), "reward": r.reward, "length": r.response_length,
                      "failure": failure, "cause": cause, "preview": preview(r.response, 80)})
    data.longest = sorted(lines, key=lambda s: -s["length"])[:top]
    data.lowest = sorted((s for s in lines if s["reward"] is not None), key=lambda s: s["reward"])[:top]
    return data


def eval_curves(metrics: list[dict]) -> str:
    """The eval rounds' mean reward (and top pass@k) per set beside the train reward, against steps
    trained: step N's train reward at N (`step_number`), the round at step k (the policy after k
    steps) at k. Empty when the run has no eval round."""
    sets = sorted({k.split("/")[1] for m in metrics for k in m if k.startswith("eval/") and k.endswith("/reward_mean")})
    if not sets:
        return ""
    series = [("train reward", [(step_number(m["step"]), float(m["reward_mean"])) for m in metrics
                                if not m.get("eval_only") and isinstance(m.get("reward_mean"), int | float)])]
    for name in sets:
        series.append((f"eval {name}", [(m["step"], float(m[f"eval/{name}/reward_mean"])) for m in metrics
                                        if isinstance(m.get(f"eval/{name}/reward_mean"), int | float)]))
        ks = sorted({int(k.rsplit("@", 1)[1]) for m in metrics for k in m if k.startswith(f"eval/{name}/pass@")})
        if ks and ks[-1] > 1:
            key = f"eval/{name}/pass@{ks[-1]}"
            series.append((f"eval {name} pass@{ks[-1]}", [(m["step"], float(m[key])) for m in metrics
                                                          if isinstance(m.get(key), int | float)]))
    return svg_chart("Eval reward beside train reward", [s for s in series if s[1]])


def _eval_failures(metrics: list[dict]) -> list[str]:
    """The eval rounds' failed samples by class, per round and set (none: one line saying so)."""
    rounds = [m for m in metrics if round_sets(m)]
    if not rounds:
        return []
    rows = [[m["step"], name, cls, count] for m in rounds for name in round_sets(m)
            for cls, count in failures_by_class(m, name).items()]
    return ["<h2>Eval failures by class</h2>",
            _table(["round (step)", "set", "failure", "samples"], rows) if rows else
            f"<p>No failed eval sample in {len(rounds)} round(s).</p>"]


def render_html(data: RunData) -> str:
    charts = [chart for title, keys in CHARTS if (chart := _metric_chart(title, keys, data.metrics))]
    if curves := eval_curves(data.metrics):
        charts.insert(1, curves)
    trained = data.trained
    steps = len(trained)
    last = trained[-1] if trained else {}
    facts = [("run", data.run_id), ("model", data.config.get("hf_checkpoint", "?")),
             ("steps reported", steps), ("samples stored", data.samples),
             ("last mean reward", _num(last.get("reward_mean"))),
             ("group size", data.config.get("n_samples_per_prompt", "?")),
             ("prompts per step", data.config.get("rollout_batch_size", "?"))]
    body = [
        f"<h1>vime run {_e(data.run_id)}</h1>",
        "<table class=facts>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts) + "</table>",
        "<h2>Per-step metrics</h2>",
        ("<div class=grid>" + "".join(charts) + "</div>") if charts else
        "<p>No per-step metrics: this run wrote no metrics.jsonl (runs before vime wrote one, or no finished step).</p>",
        "<h2>Reward distribution per step</h2>", _reward_distribution(data.rewards_by_step),
        "<h2>Failure classes</h2>", _table(["failure", "samples"], data.failures.most_common()),
        *_eval_failures(data.metrics),
        "<h2>Longest responses</h2>", _sample_table(data.longest),
        "<h2>Lowest rewards</h2>", _sample_table(data.lowest),
    ]
    return (f"<!doctype html><html><head><meta charset=utf-8><title>vime run {_e(data.run_id)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { border: 1px solid #ddd; border-radius: 4px; padding: 6px; background: #fff; }
table { border-collapse: collapse; } td, th { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; }
.facts th { color: #666; font-weight: normal; } td.preview { font-family: monospace; font-size: 12px; }
"""


def svg_chart(title: str, series: list[tuple[str, list[tuple[float, float]]]], *, width: int = 420,
              height: int = 220, boxes: list[tuple[float, list[float]]] | None = None) -> str:
    """A line chart (and optional per-x box plots) as inline SVG, axes labelled at the extremes."""
    left, right, top, bottom = 52, 12, 26, 30
    xs = [x for _, points in series for x, _ in points] + [x for x, _ in boxes or []]
    ys = [y for _, points in series for _, y in points] + [y for _, values in boxes or [] for y in values]
    if not xs:
        return ""
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if boxes:  # half a step of room, so the first and last boxes stay inside the axes
        x0, x1 = x0 - 0.5, x1 + 0.5
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    parts = [f'<svg class=chart xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{_e(title)}">',
             f'<text x="{left}" y="16" font-size="13" font-weight="bold">{_e(title)}</text>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#999"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#999"/>',
             f'<text x="{left - 4}" y="{py(y1) + 4:.1f}" font-size="11" text-anchor="end">{_num(y1)}</text>',
             f'<text x="{left - 4}" y="{py(y0) + 4:.1f}" font-size="11" text-anchor="end">{_num(y0)}</text>',
             f'<text x="{px(min(xs)):.1f}" y="{height - 12}" font-size="11">step {_num(min(xs))}</text>',
             f'<text x="{px(max(xs)):.1f}" y="{height - 12}" font-size="11" text-anchor="end">step {_num(max(xs))}'
             '</text>']
    for x, values in boxes or []:
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        cx, w = px(x), max(2.0, (width - left - right) / (x1 - x0) * 0.6)
        parts += [f'<line x1="{cx:.1f}" y1="{py(max(values)):.1f}" x2="{cx:.1f}" y2="{py(min(values)):.1f}" '
                  'stroke="#888"/>',
                  f'<rect x="{cx - w / 2:.1f}" y="{py(q[2]):.1f}" width="{w:.1f}" '
                  f'height="{max(1.0, py(q[0]) - py(q[2])):.1f}" fill="#aec7e8" stroke="#1f77b4"/>',
                  f'<line x1="{cx - w / 2:.1f}" y1="{py(q[1]):.1f}" x2="{cx + w / 2:.1f}" y2="{py(q[1]):.1f}" '
                  'stroke="#d62728" stroke-width="2"/>']
    for i, (name, points) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        parts.append(f'<polyline class=series fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        if len(series) > 1:
            parts.append(f'<text x="{width - right - 4}" y="{top + 4 + 14 * i}" font-size="11" fill="{color}" '
                         f'text-anchor="end">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _metric_chart(title: str, keys: list[tuple[str, str]], metrics: list[dict]) -> str:
    series = []
    for key, legend in keys:
        points = [(step_number(m["step"]), float(m[key])) for m in metrics if isinstance(m.get(key), int | float)]
        if points:
            series.append((legend, points))
    return svg_chart(title, series) if series else ""


def _reward_distribution(rewards_by_step: dict[int, list[float]]) -> str:
    if not rewards_by_step:
        return "<p>No trained samples with a numeric reward.</p>"
    boxes = [(step_number(step), values) for step, values in sorted(rewards_by_step.items())]
    means = [(x, statistics.fmean(values)) for x, values in boxes]
    return svg_chart("Reward per step: quartiles, median (red), mean (line)", [("mean", means)], width=860,
                     height=260, boxes=boxes)


def _sample_table(samples: list[dict]) -> str:
    rows = [[s["key"], s["step"], _num(s["reward"]), s["length"], s["failure"] or "", s["preview"]] for s in samples]
    return _table(["sample", "step", "reward", "tokens", "failure", "response"], rows, preview_column=5)


def _table(header: list[str], rows: list, preview_column: int | None = None) -> str:
    if not rows:
        return "<p>None.</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td{' class=preview' if i == preview_column else ''}>{_e(v)}</td>"
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _num(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _e(value) -> str:
    return html.escape("-" if value is None else str(value))

