"""On-policy distillation: the tiny model (the student) learns to answer like a teacher that writes
CAPITAL WORDS, from the teacher's log-probs of the student's own samples.

    python -m examples.on_policy_distillation.run [vime flags that override the defaults below]

The teacher (`teacher.py`, fine-tuned once and cached) is served as a frozen model next to the
student, from a `--vllm-config` written to the run directory (`serving.yaml`): the student's
server takes the trainer's weights after every step, the teacher's never does. The reward
function (`vime.rollout.on_policy_distillation.reward_func`) asks the teacher for its log-prob of
every token the student sampled and stores them on the sample; `--use-opd` makes each token's
advantage minus its reverse KL to the teacher (`vime.train.opd`). There is no task reward.

Given servers you run instead (`--vllm-router-ip/--vllm-router-port` for the student, with
`--vllm-model-urls teacher=URL`), no `serving.yaml` is written and nothing is started for them.

After the run, each saved checkpoint (every `--save-interval` steps) and the starting student are
measured on held-out prompts (`heldout.py`: the exact per-token reverse KL to the teacher, and the
share of capital tokens); the run prints the table, writes `heldout_kl.png` and `summary.txt`.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from examples.on_policy_distillation.heldout import HELDOUT_PROMPTS, HeldoutKL
from examples.on_policy_distillation.teacher import TEACHER_PROMPTS, student_dir, teacher_dir
from examples.quickstart.plot import plot_curve
from examples.quickstart.run import refuse_if_in_use
from vime.config.args import parse_args
from vime.errors import VimeError
from vime.launcher.launch import run_to_end
from vime.log import configure_logging

TRAIN_PROMPTS = TEACHER_PROMPTS[:8]


def write_prompts(path: Path, count: int = 64) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"{TRAIN_PROMPTS[i % 8]} ({i})"}]}) + "\n")


def write_serving(path: Path, teacher: Path) -> Path:
    """The student on one server that takes the trainer's weights; the teacher, frozen, on its own
    small one (prompt + 16 tokens fit in 256)."""
    path.write_text(f"""vllm:
  - name: actor
    server_groups:
      - {{worker_type: regular, num_gpus: 1}}
  - name: teacher
    model_path: {teacher}
    update_weights: false
    server_groups:
      - {{worker_type: regular, num_gpus: 1, overrides: {{max_model_len: 256, max_num_seqs: 32}}}}
""")
    return path


def default_flags(run_dir: Path, model: str) -> list[str]:
    return [
        "--hf-checkpoint", model, "--prompt-data", str(run_dir / "prompts.jsonl"), "--input-key", "prompt",
        "--apply-chat-template", "--rollout-shuffle",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "16",
        "--rollout-temperature", "1.0", "--num-rollout", "20",
        "--use-opd", "--opd-type", "vllm", "--opd-kl-coef", "1.0",
        "--custom-rm-path", "vime.rollout.on_policy_distillation.reward_func",
        "--advantage-estimator", "grpo", "--lr", "2e-3", "--adam-beta2", "0.99",
        "--run-dir", str(run_dir), "--save", str(run_dir / "checkpoints"), "--save-interval", "2",
        "--vllm-max-model-len", "512",
    ]


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def main(argv: list[str] | None = None) -> int:
    configure_logging(level="WARNING")
    argv = list(sys.argv[1:] if argv is None else argv)
    run_dir = Path(_option(argv, "--run-dir") or Path("runs") / time.strftime("opd-%Y%m%d-%H%M%S"))
    refuse_if_in_use(run_dir, "on_policy_distillation")
    from vime.testing.tiny_model import tiny_model_dir

    print("[opd] building (or reusing) the tiny model, its teacher (answers in CAPITAL WORDS) and the student's "
          "warm start (the same words in either case)")
    base = tiny_model_dir()
    teacher = teacher_dir(base)
    model = _option(argv, "--hf-checkpoint") or str(student_dir(base))
    write_prompts(run_dir / "prompts.jsonl")
    flags = default_flags(run_dir, model)
    if _option(argv, "--vllm-router-ip") is None and "--vllm-config" not in argv:
        flags += ["--vllm-config", str(write_serving(run_dir / "serving.yaml", teacher))]
    try:
        args = parse_args(flags + argv)
    except VimeError as e:
        print(f"on_policy_distillation: error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    resume = shlex.join([sys.executable, "-m", "examples.on_policy_distillation.run", *argv,
                         *([] if "--run-dir" in argv else ["--run-dir", str(run_dir)])])
    code, state = run_to_end(args, resume)
    if state is None:
        return code
    trained = time.monotonic() - t0
    figures = measure_checkpoints(model, teacher, Path(args.save))
    summarize(Path(args.run_dir), figures, state.metrics, trained, time.monotonic() - t0 - trained)
    return 0


def measure_checkpoints(student: str, teacher: Path, save: Path) -> dict[int, HeldoutKL]:
    """The held-out figures of the starting student (step 0) and of every saved checkpoint."""
    import torch

    from examples.on_policy_distillation import heldout
    from vime.rollout.tokenization import get_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's matmuls: one thread is 10x faster than two fighting a busy host
    try:
        tok = get_tokenizer(student)
        teacher_model = heldout.load(teacher)
        steps = {0: Path(student)} | {int(p.name.split("_")[1]): p for p in sorted(save.glob("step_*"))
                                      if (p / "state.json").exists()}
        return {step: heldout.measure(heldout.load(path), teacher_model, tok) for step, path in sorted(steps.items())}
    finally:
        torch.set_num_threads(threads)


def summarize(run_dir: Path, figures: dict[int, HeldoutKL], metrics: list[dict], trained: float,
              measured: float) -> None:
    """Print the held-out table and the one-line summary (also `summary.txt`); plot `heldout_kl.png`."""
    train_kl = {m["step"] + 1: m["opd_reverse_kl"] for m in metrics if "opd_reverse_kl" in m}
    print(f"[opd] held-out prompts ({len(HELDOUT_PROMPTS)}, never trained on): reverse KL to the teacher per token")
    print("[opd]   step  held-out KL  capital share  (train-batch KL, sampled)")
    for step, f in figures.items():
        batch = f"{train_kl[step]:.3f}" if step in train_kl else "-"
        print(f"[opd]   {step:>4}  {f.reverse_kl:>11.3f}  {f.capital_share:>13.2f}  ({batch})")
    steps = sorted(figures)
    first, last = figures[steps[0]], figures[steps[-1]]
    top = max(1.0, max(f.reverse_kl for f in figures.values()) * 1.1)
    plot_curve([figures[s].reverse_kl for s in steps], run_dir / "heldout_kl.png", y_max=top,
               title="held-out reverse KL(student || teacher), nats per token",
               x_labels=(f"step {steps[0]}", f"step {steps[-1]}"))
    line = (f"on_policy_distillation: held-out reverse KL {first.reverse_kl:.3f} at step {steps[0]} -> "
            f"{last.reverse_kl:.3f} at step {steps[-1]}; capital share {first.capital_share:.2f} -> "
            f"{last.capital_share:.2f}; training took {trained:.0f} s, measuring {measured:.0f} s; "
            f"curve: {run_dir / 'heldout_kl.png'}")
    (run_dir / "summary.txt").write_text(line + "\n")
    (run_dir / "heldout.json").write_text(json.dumps(
        {str(s): {"reverse_kl": f.reverse_kl, "capital_share": f.capital_share, "tokens": f.tokens}
         for s, f in figures.items()}, indent=1) + "\n")
    print(line)


if __name__ == "__main__":
    sys.exit(main())
