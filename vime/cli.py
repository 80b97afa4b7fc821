"""The `vime` command: `vime <command> [flags]`.

Every command parses the same flags (`vime.config.args`), so a flag means one thing everywhere.
A `VimeError` ends the command with one line naming what to fix, and exit code 2.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable

from vime.errors import VimeError

USAGE = """usage: vime <command> [flags]

commands:
  train        start or resume a training run (Temporal, vLLM and workers are started as needed)
  eval         evaluate an HF checkpoint or a run's checkpoints on eval sets (durable, resumable); a table;
               --compare RUN_A RUN_B: two runs' recorded eval rounds side by side
  smoke        start the embedded Temporal + vLLM services and sample from the model once
  fleet        a shared fleet until Ctrl-C: Temporal, store, one LoRA-enabled vLLM server and long-lived workers;
               `vime train --fleet DIR --lora-rank R ...` then starts a run on it in seconds
  sft          supervised warm start on --sft-data traces (their loss_mask tokens); saves an HF model to --save
  engine       run one vLLM server with every flag vime needs (--engine-port; --print-command to see it)
  config       print the training workflow's input for a run, for `temporal workflow start --input-file`
  runs         every run in a store: progress, samples, failures, the last step's mean reward
  samples      a run's stored samples: step, reward, status, policy version, failure, response preview
  show         one rollout or sample: prompt, response, tokens by loss mask, logprobs, turns, diff, failure
  report       one self-contained HTML page: metric plots, reward distribution, failures, notable rollouts
  status       where a run stands: live from its workflow while it runs, else from its store
  ui           the Temporal Web UI on a finished (or stopped) run's history, until Ctrl-C
  cancel       cancel a run: its training workflow and the rollouts in flight (sandboxes torn down)
  rescore      score a run's stored rollouts with new reward code (no sampling); old vs new per step
  tiny-model   build (or find in the cache) the tiny test model and print its directory

`vime <command> --help` lists the flags, grouped (data, rollout, reward, training, ...,
vLLM: every vLLM engine flag as --vllm-<flag>, router: every router flag as --router-<flag>).
"""


def _smoke(argv: list[str]) -> int:
    from vime.config.args import parse_args
    from vime.launcher.smoke import main

    return main(parse_args(argv))


def _train(argv: list[str]) -> int:
    """Every check first, then the launch: a mistake is on the console in a second or two, not
    after the launcher's imports (torch, vLLM, Temporal: 30-70 s on a loaded machine)."""
    from vime.config.preflight import checked_args
    from vime.launcher.fleet_info import checked_fleet_args, wants_fleet

    if wants_fleet(argv):
        args, fleet_dir = checked_fleet_args(argv)
    else:
        args, fleet_dir = checked_args(argv), None
    from vime.log import configure_logging

    configure_logging()  # not before: structlog and rich are a third of the checks' CPU
    if fleet_dir is not None:
        from vime.launcher.fleet_launch import main as fleet_main

        return fleet_main(args, fleet_dir)
    from vime.launcher.launch import main

    return main(args, checked=True)


def _fleet(argv: list[str]) -> int:
    from vime.launcher.fleet import main

    return main(argv)


def _sft(argv: list[str]) -> int:
    from vime.config.args import parse_args
    from vime.train.sft import main

    return main(parse_args(argv))


def _engine(argv: list[str]) -> int:
    from vime.config.args import parse_args
    from vime.engine.serve import main

    return main(parse_args([a for a in argv if a != "--print-command"]), argv)


def _config(argv: list[str]) -> int:
    from vime.config.args import parse_args
    from vime.config.run_input import main

    return main(parse_args(argv))


def _operate(module: str, function: str) -> Callable[[list[str]], int]:
    """A command that reads or operates a run (vime.ops): its own flags, imported when called."""
    def command(argv: list[str]) -> int:
        return getattr(importlib.import_module(module), function)(argv)
    return command


def _eval(argv: list[str]) -> int:
    """`vime eval`: evaluate (vime.launcher), or `--compare` two runs' recorded rounds (vime.ops)."""
    if any(a == "--compare" or a.startswith("--compare=") for a in argv):
        from vime.ops.eval_compare import compare_main

        return compare_main(argv)
    from vime.launcher.eval_launch import main

    return main(argv)


def _tiny_model(argv: list[str]) -> int:
    from vime.testing.tiny_model import main

    return main(argv) or 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": _train,
    "eval": _eval,
    "smoke": _smoke,
    "fleet": _fleet,
    "sft": _sft,
    "engine": _engine,
    "config": _config,
    "runs": _operate("vime.ops.commands", "runs_main"),
    "samples": _operate("vime.ops.commands", "samples_main"),
    "show": _operate("vime.ops.commands", "show_main"),
    "report": _operate("vime.ops.commands", "report_main"),
    "ui": _operate("vime.ops.ui", "ui_main"),
    "status": _operate("vime.ops.status", "status_main"),
    "rescore": _operate("vime.ops.rescore", "rescore_main"),
    "cancel": _operate("vime.ops.cancel", "cancel_main"),
    "tiny-model": _tiny_model,
}


READERS = ("runs", "samples", "show")
"""The commands that read a store and answer at once: they configure logging when they first log."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        if argv:
            from vime.config.args import build_parser

            build_parser(vllm=True, router=True).print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"vime: error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    from vime.log import configure_logging, configure_logging_on_first_log

    if command in READERS:  # they answer from the store in a second: structlog only if they log
        configure_logging_on_first_log()
    elif command != "train":  # `vime train` configures it after its checks, which log nothing (see _train)
        configure_logging()
    try:
        return COMMANDS[command](rest)
    except VimeError as e:
        print(f"vime {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vime {command}: interrupted", file=sys.stderr)
        return 130
    finally:
        # A Temporal client kept alive by a reference cycle (an error's traceback holding the frame
        # that holds it) was otherwise freed while the interpreter finalized, and its Rust threads
        # then aborted the process ("PyGILState_Release ... must be current", exit 134).
        gc.collect()


if __name__ == "__main__":
    sys.exit(main())
