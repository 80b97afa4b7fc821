"""The argument parsing and output of `vime runs`, `vime samples` and `vime show`: a table for
people by default, `--json` for scripts."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from vime.errors import ConfigError
from vime.ops.locate import add_location_flags, open_existing, store_for, temporal_for
from vime.ops.queries import SampleFilter, run_summaries, sample_lines
from vime.rundir import read_launch_info
from vime.ops.show import load, render, run_tokenizer, token_texts


def table(rows: list[list], header: list[str]) -> str:
    cells = [[_cell(v) for v in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def run_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A command about one run: RUN, then where its store is (--run-dir / --store-url) and --json."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("run", metavar="RUN", help="the run id")
    add_location_flags(parser)
    return parser


def runs_main(argv: list[str]) -> int:
    from vime.ops.run_states import run_state, workflow_statuses  # Temporal's client: not on `vime show`'s path

    parser = argparse.ArgumentParser(prog="vime runs", description="Every run in a store: its state (running, "
                                     "finished, failed, cancelled: from its Temporal; without one, as the store "
                                     "recorded it, else stopped), steps, samples, the last step's mean reward. Without "
                                     "--run-dir/--store-url: every run directory under --runs-root.")
    add_location_flags(parser)
    parser.add_argument("--runs-root", default="runs", help="where `vime train` puts run directories (default: runs)")
    parser.add_argument("--temporal-address", help="the Temporal the runs live in (default: each run directory's "
                        "running launch's)")
    parser.add_argument("--temporal-namespace", default="default")
    args = parser.parse_args(argv)
    if args.store_url or args.run_dir or args.fleet:
        locations = [store_for(args)]
    else:
        locations = sorted(str(p.parent) for p in Path(args.runs_root).glob("*/vime.db"))
        if not locations:
            raise ConfigError(f"no run directories with a store under {args.runs_root!r}; pass --runs-root, "
                              "--run-dir or --store-url")
    summaries = []
    for location in locations:
        with open_existing(location) as store:
            found = run_summaries(store)
        launch = {} if "://" in location else read_launch_info(location) or {}
        address = temporal_for(args, launch)
        statuses = asyncio.run(workflow_statuses(address, launch.get("namespace", args.temporal_namespace),
                                                 [s.run_id for s in found])) if address and found else {}
        for s in found:
            s.state = run_state(s, statuses.get(s.run_id))
        summaries += [(location, s) for s in found]
    if args.json:
        print(json.dumps([{**s.to_dict(), "store": loc} for loc, s in summaries], indent=1))
        return 0
    print(table([[s.run_id, s.state, f"{s.steps_trained}/{s.num_rollout or '?'}", s.samples, s.failed, s.last_reward,
                  s.created_at, loc] for loc, s in summaries],
                ["RUN", "STATE", "STEPS", "SAMPLES", "FAILED", "LAST REWARD", "CREATED", "STORE"]))
    return 0


def samples_main(argv: list[str]) -> int:
    parser = run_parser("vime samples", "A run's stored samples, in the order they were written: train step, "
                        "reward, status, policy version, length, failure and a preview of the response.")
    parser.add_argument("--step", type=int, help="only the samples train step STEP consumed, steps counted from 1 as "
                        "the console counts them (with --eval: the eval round at step STEP, after STEP steps)")
    parser.add_argument("--eval", action="store_true", help="the eval samples instead of the training samples "
                        "(STEP: their round)")
    parser.add_argument("--dataset", help="only the eval samples of this eval set (implies --eval)")
    parser.add_argument("--status", choices=["completed", "truncated", "aborted", "failed", "pending"])
    parser.add_argument("--rollout", help="only this rollout's samples")
    parser.add_argument("--untrained", action="store_true", help="only samples no step has trained on")
    parser.add_argument("--failed", action="store_true", help="only failed or aborted samples (a truncated sample "
                        "finished: it hit the length limit)")
    parser.add_argument("--where", help="an SQL condition on the samples table, e.g. \"reward > 0.5 AND "
                        "response_length < 8\"")
    parser.add_argument("--limit", type=int, default=20, help="at most this many (default 20; 0 for all)")
    parser.add_argument("--offset", type=int, default=0)
    args = parser.parse_args(argv)
    f = SampleFilter(step=args.step, status=args.status, rollout=args.rollout, untrained=args.untrained,
                     failed=args.failed, where=args.where, evaluation=args.eval, dataset=args.dataset,
                     limit=args.limit or 2**31 - 1, offset=args.offset)
    with open_existing(store_for(args)) as store:
        if args.run not in {r.run_id for r in run_summaries(store)}:
            raise ConfigError(f"run {args.run!r} is not in the store at {store_for(args)}; `vime runs` lists the runs")
        lines, total = sample_lines(store, args.run, f)
    if args.json:
        print(json.dumps({"total": total, "samples": [line.to_dict() for line in lines]}, indent=1))
        return 0
    print(table([[s.key, s.step, s.reward, s.status, s.version, s.length, s.failure, s.preview] for s in lines],
                ["KEY", "STEP", "REWARD", "STATUS", "VERSION", "LEN", "FAILURE", "RESPONSE"]))
    shown_to = args.offset + len(lines)
    print(f"{len(lines)} of {total} samples" + (f" (next: --offset {shown_to})" if shown_to < total else ""))
    return 0


def show_main(argv: list[str]) -> int:
    parser = run_parser("vime show", "One rollout (every sibling) or one sample (rollout/sibling): prompt, "
                        "response, tokens by loss mask, logprobs, policy versions, turns, diff and grading, failure "
                        "cause.")
    parser.add_argument("key", metavar="KEY", help="a rollout id, or rollout/sibling as `vime samples` lists them")
    parser.add_argument("--tokens", action="store_true", help="a table of the response's tokens and logprobs")
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    args = parser.parse_args(argv)
    with open_existing(store_for(args)) as store:
        shown = load(store, args.run, args.key)
        tokenizer = run_tokenizer(store, args.run)
    texts = [token_texts(tokenizer, s.sample.response_tokens) for s in shown]
    if args.json:
        print(json.dumps([s.to_dict(t) for s, t in zip(shown, texts, strict=True)], indent=1, default=str))
        return 0
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print("\n\n".join(render(s, t, color=color, token_table=args.tokens) for s, t in zip(shown, texts, strict=True)))
    return 0


def report_main(argv: list[str]) -> int:
    from vime.metrics_log import read_metrics
    from vime.ops.locate import run_dir_of
    from vime.ops.report import collect, render_html

    parser = run_parser("vime report", "One self-contained HTML page about a run: plots of its per-step metrics, "
                        "the reward distribution per step, failure classes, the longest and lowest-reward rollouts.")
    parser.add_argument("--out", help="where to write the page (default: <run-dir>/report.html)")
    args = parser.parse_args(argv)
    run_dir = run_dir_of(args.run, args.run_dir)
    with open_existing(store_for(args)) as store:
        data = collect(store, args.run, read_metrics(run_dir))
    if not data.samples and not data.metrics:
        raise ConfigError(f"run {args.run!r} has no samples in {store_for(args)} and no metrics in {run_dir}; "
                          "`vime runs` lists the runs")
    out = Path(args.out) if args.out else run_dir / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(data))
    if args.json:
        print(json.dumps({"report": str(out), "steps": len(data.trained), "samples": data.samples}))
    else:
        print(f"wrote {out} ({len(data.trained)} steps, {data.samples} samples): open it in a browser")
    return 0
