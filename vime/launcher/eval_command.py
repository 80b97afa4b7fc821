"""`vime eval`'s command line: what is evaluated, on what, under which run id.

    vime eval --hf-checkpoint DIR --eval-prompt-data NAME FILE [NAME FILE ...] [vime flags]
    vime eval RUN_DIR [--checkpoints all|last|STEP,...] [--eval-prompt-data ...] [vime flags]

(`--eval-config FILE` anywhere in place of `--eval-prompt-data`.) The first form evaluates one HF
model directory (its round is step 0, policy version 0). The second evaluates checkpoints of a
training run: its flags are read from its store (the model, the reward, the eval sets it had:
an `--eval-config` as its content was when the run started), the flags given here are laid over
them (eval sets given replace the run's, whichever flag named them), and each chosen `step_*`
checkpoint under its `--save` is one round, at the checkpoint's step.

The eval run's id is derived from what is evaluated (the checkpoints, the eval sets and every
flag that shapes an eval sample or its score), so the same command finds the same run and goes
on where it stopped, and a changed command is a new run. Its directory is `--run-dir`, else
`RUN_DIR/evals/<id>` or `runs/<id>`.

Everything is checked here, before any service starts: one line per problem.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.temporal.eval_contract import EvalCheckpoint

USAGE = """usage: vime eval --hf-checkpoint DIR --eval-prompt-data NAME FILE [NAME FILE ...] [vime flags]
       vime eval --hf-checkpoint DIR --eval-config FILE [vime flags]
       vime eval RUN_DIR [--checkpoints all|last|STEP[,STEP...]] [--eval-prompt-data ... | --eval-config FILE]
                 [vime flags]
       vime eval --compare RUN_A RUN_B [--json]"""
NO_SETS = ("vime eval needs --eval-prompt-data NAME FILE [NAME FILE ...] or --eval-config FILE: the sets to "
           "evaluate on")
EVAL_SET_FLAGS = {"--eval-prompt-data": None, "--eval-config": 1, "--eval-config-data": 1}
"""The flags that choose the eval sets: given to `vime eval RUN`, they replace all of the run's."""

# flags of the training run that say where *that* launch ran: an eval run has its own
DROPPED = {"--run-id": 1, "--run-dir": 1, "--store-url": 1, "--temporal-address": 1, "--load": 1,
           "--vllm-router-ip": 1, "--vllm-router-port": 1, "--vllm-server-urls": None, "--vllm-model-urls": None}
# what shapes an eval sample or its score: part of the eval run's id
IDENTITY_FIELDS = ("n_samples_per_eval_prompt", "eval_temperature", "eval_top_p", "eval_top_k", "eval_max_response_len",
                   "eval_input_key", "eval_label_key", "eval_tool_key", "input_key", "label_key", "metadata_key",
                   "tool_key", "apply_chat_template", "apply_chat_template_kwargs", "rollout_max_prompt_len",
                   "rollout_temperature", "rollout_top_p", "rollout_top_k", "rollout_max_response_len",
                   "rollout_seed", "rm_type", "custom_rm_path", "group_rm", "reward_key",
                   "custom_generate_function_path", "eval_function_path", "rollout_function_path", "rollout_env")


@dataclass
class EvalCommand:
    args: Any  # the eval run's VimeArgs
    checkpoints: list[EvalCheckpoint]
    source: str  # what is evaluated, for the console: a run directory or a model directory


def split_argv(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """`(RUN_DIR or None, --checkpoints or None, the vime flags)`."""
    rest = list(argv)
    run_dir = rest.pop(0) if rest and not rest[0].startswith("-") else None
    spec = None
    out = []
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "--checkpoints":
            if i + 1 >= len(rest):
                raise ConfigError("--checkpoints needs a value: all, last or STEP[,STEP...]")
            spec, i = rest[i + 1], i + 2
            continue
        if token.startswith("--checkpoints="):
            spec = token.split("=", 1)[1]
        else:
            out.append(token)
        i += 1
    if spec is not None and run_dir is None:
        raise ConfigError("--checkpoints chooses checkpoints of a run: give its directory first (vime eval RUN_DIR "
                          "--checkpoints ...)")
    return run_dir, spec, out


def without_flags(argv: list[str], dropped: dict[str, int | None]) -> list[str]:
    """`argv` less the flags in `dropped` (name -> number of values; None: every value up to the next flag)."""
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in dropped:
            if "=" in argv[i]:
                i += 1
                continue
            count = dropped[name]
            i += 1
            if count is None:
                while i < len(argv) and not argv[i].startswith("--"):
                    i += 1
            else:
                i += count
            continue
        out.append(argv[i])
        i += 1
    return out


def run_of(run_dir: Path) -> tuple[str, list[str]]:
    """The run id and the flags of the training run in `run_dir` (from its store)."""
    from vime.store import SampleStore
    from vime.store.database import DB_FILENAME

    if not (run_dir / DB_FILENAME).is_file():
        raise ConfigError(f"vime eval {run_dir}: no vime store in it (no {DB_FILENAME}); pass a run directory "
                          "`vime train` wrote, or --hf-checkpoint DIR")
    run_id = run_dir.name
    summary = run_dir / "summary.json"
    if summary.is_file():
        run_id = json.loads(summary.read_text()).get("run_id") or run_id
    with SampleStore.open(run_dir) as store:
        argv = store.run_argv(run_id)
    if not argv:
        raise ConfigError(f"vime eval {run_dir}: run {run_id!r} has no recorded flags in its store; evaluate its "
                          "checkpoints one by one with --hf-checkpoint DIR")
    return run_id, list(argv)


def checkpoint_roots(args: Any, run_dir: Path) -> list[Path]:
    """Where the run's `step_*` checkpoints may be: its --save (absolute, or relative to here or to
    the run directory's parent), and the directory of the checkpoint its summary names."""
    roots = []
    if args.save:
        save = Path(args.save)
        roots += [save] if save.is_absolute() else [save.resolve(), run_dir.parent / save, run_dir / save]
    summary = run_dir / "summary.json"
    if summary.is_file() and (ckpt := json.loads(summary.read_text()).get("checkpoint")):
        roots.append(Path(ckpt).parent)
    return list(dict.fromkeys(p.resolve() for p in roots))


def run_checkpoints(args: Any, run_dir: Path, spec: str | None) -> list[EvalCheckpoint]:
    """The run's checkpoints `spec` chooses (all, last, or steps), oldest first."""
    found: dict[int, tuple[Path, dict]] = {}
    for root in checkpoint_roots(args, run_dir):
        for path in sorted(root.glob("step_*")):
            if (path / "state.json").is_file() and re.fullmatch(r"step_\d+", path.name):
                state = json.loads((path / "state.json").read_text())
                found.setdefault(int(state["step"]), (path, state))
    if not found:
        where = ", ".join(map(str, checkpoint_roots(args, run_dir))) or "nowhere: the run has no --save"
        raise ConfigError(f"vime eval {run_dir}: no checkpoint found (looked in {where}); train with --save DIR")
    spec = (spec or "all").strip()
    if spec == "all":
        steps = sorted(found)
    elif spec == "last":
        steps = [max(found)]
    else:
        try:
            steps = sorted({int(s) for s in spec.split(",") if s.strip()})
        except ValueError:
            raise ConfigError(f"--checkpoints {spec!r}: give all, last or steps like 2,4") from None
        missing = [s for s in steps if s not in found]
        if missing or not steps:
            raise ConfigError(f"--checkpoints {spec!r}: no checkpoint at step {', '.join(map(str, missing))}; the run "
                              f"has steps {', '.join(map(str, sorted(found)))}")
    return [EvalCheckpoint(step, found[step][0].name, str(found[step][0]), int(found[step][1]["weight_version"]))
            for step in steps]


def eval_run_id(prefix: str, args: Any, checkpoints: list[EvalCheckpoint]) -> str:
    """`<prefix>-eval-<hash>`: the hash of what is evaluated and every flag that shapes an eval sample
    (and the content of `--eval-config`: an edited file is a new eval run, a moved one is not)."""
    from vime.rollout.eval_data import eval_sets

    what = {"checkpoints": [(c.step, c.path, c.weight_version) for c in checkpoints],
            "model": str(Path(args.hf_checkpoint).resolve()),
            "sets": [(name, str(Path(path).resolve())) for name, path in eval_sets(args)],
            **{f: getattr(args, f, None) for f in IDENTITY_FIELDS}}
    if args.eval_config_data is not None:  # --eval-config by its content (sets, settings, paths), not its path
        what["eval_config"] = args.eval_config_data["datasets"]
    if args.env_args is not None:  # an environment's own flags (--agent-max-turns, ...) shape its eval samples too
        what["env_args"] = str(args.env_args)
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '-', prefix)[:60]}-eval-{digest}"


def eval_preflight(args: Any) -> None:
    """`vime train`'s checks that apply to an eval run: the run directory, hooks, the model,
    the servers, and every eval set's records."""
    from vime.config.preflight import check_checkpoint, check_eval_sets, check_hooks, check_run_dir, check_serving

    if not args.eval_prompt_data:
        raise ConfigError(NO_SETS)
    check_run_dir(args)
    check_hooks(args)
    check_checkpoint(args)
    check_serving(args)
    check_eval_sets(args)


def parse_eval_command(argv: list[str]) -> EvalCommand:
    """`vime eval`'s argv parsed and checked (`vime train`'s `checked_args`, for an eval run)."""
    from vime.config.args import check_vllm_flags, parse_args

    run_dir, spec, flags = split_argv(argv)
    if run_dir is not None:
        path = Path(run_dir).resolve()
        run_id, stored = run_of(path)
        base = without_flags(stored, DROPPED)
        given = {t.split("=", 1)[0] for t in flags}
        if given & set(EVAL_SET_FLAGS):
            base = without_flags(base, EVAL_SET_FLAGS)
        first = parse_args([*base, *flags], vllm_flags=False)
        checkpoints = run_checkpoints(first, path, spec)
        prefix, default_dir, source = run_id, path / "evals", f"run {run_id} ({path})"
    else:
        base = []
        first = parse_args(flags, vllm_flags=False)
        if not first.hf_checkpoint:
            raise ConfigError(f"vime eval needs a run directory or --hf-checkpoint DIR\n{USAGE}")
        external = bool(first.vllm_router_ip and first.vllm_router_port)
        model = str(Path(first.hf_checkpoint).resolve())
        # servers vime starts boot on the model: nothing to load; servers you run are loaded with it
        checkpoints = [EvalCheckpoint(0, Path(model).name, model if external else None, 0)]
        prefix, default_dir, source = Path(model).name, Path("runs"), f"model {model}"
    if not first.eval_prompt_data:
        raise ConfigError(NO_SETS)
    user_dir = _flag_value(flags, "--run-dir")
    run_id = _flag_value(flags, "--run-id") or eval_run_id(prefix, first, checkpoints)
    location = ["--run-id", run_id] + ([] if user_dir else ["--run-dir", str(default_dir / run_id)])
    args = parse_args([*base, *flags, *location], vllm_flags=False)
    eval_preflight(args)
    return EvalCommand(check_vllm_flags(args), checkpoints, source)


def _flag_value(argv: list[str], name: str) -> str | None:
    for i, token in enumerate(argv):
        if token == name and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return None
