"""The figures of an eval round, per set: mean reward, pass@k, response length, truncation.

pass@k is the unbiased estimator (Chen et al., 2021): with n samples of a prompt of which c
pass, the chance that k of them drawn without replacement hold at least one pass is
`1 - C(n - c, k) / C(n, k)`, averaged over the set's prompts. It is reported for k = 1, 2, 4, ...
up to the samples per prompt, and for k = n itself. A sample passes when its reward reaches 1
(full marks: 0/1 and -1/1 rewards alike; partial credit does not pass). A sample without a
scalar reward (failed: its generate or reward hook raised) counts as reward 0, not passed, and
is counted in `failed`, so a broken hook shows instead of quietly raising the mean, and in
`failed/<class>` by its failure class (`vime.sample_summary.failure_class`: infra, timeout,
reward_error, ...; only the classes that occurred), so the figure says what to fix.

Pure functions, standard library only: the metrics activity and the tests call them on plain values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

PASS_REWARD = 1.0


@dataclass(frozen=True)
class ScoredSample:
    """What the figures need of one eval sample."""

    prompt: int  # the prompt's index in its set (the sample's group_index)
    reward: float | None  # the scalar reward (`--reward-key` applied); None when there is none
    status: str  # Sample.Status value: completed, truncated, failed, ...
    response_length: int
    failure: str = ""  # its failure class (`failure_class`), read only when it has no reward


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with `n` samples of which `c` passed (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every draw of k holds a pass
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def reported_ks(n: int) -> list[int]:
    """The k of the pass@k reported for `n` samples per prompt: 1, 2, 4, ... <= n, and n."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else [*ks, n]


def passed(sample: ScoredSample) -> bool:
    return sample.reward is not None and sample.reward >= PASS_REWARD


def set_metrics(samples: Iterable[ScoredSample]) -> dict[str, float | int]:
    """One eval set's figures: reward_mean, pass@k, response_length_mean, truncated_ratio,
    failed, samples, prompts. pass@k averages over the prompts with at least k samples."""
    samples = list(samples)
    if not samples:
        return {"samples": 0, "prompts": 0}
    by_prompt: dict[int, list[ScoredSample]] = {}
    for s in samples:
        by_prompt.setdefault(s.prompt, []).append(s)
    out: dict[str, float | int] = {
        "reward_mean": sum(s.reward or 0.0 for s in samples) / len(samples),
        "response_length_mean": sum(s.response_length for s in samples) / len(samples),
        "truncated_ratio": sum(s.status == "truncated" for s in samples) / len(samples),
        "failed": sum(s.reward is None for s in samples),
        "samples": len(samples),
        "prompts": len(by_prompt),
    }
    for s in samples:
        if s.reward is None:
            key = f"failed/{s.failure or 'error'}"
            out[key] = out.get(key, 0) + 1
    for k in reported_ks(max(len(g) for g in by_prompt.values())):
        estimates = [pass_at_k(len(g), sum(map(passed, g)), k) for g in by_prompt.values() if len(g) >= k]
        out[f"pass@{k}"] = sum(estimates) / len(estimates)
    return out


def round_metrics(by_set: dict[str, Iterable[ScoredSample]]) -> dict[str, float | int]:
    """A round's figures, flat, as `metrics.jsonl` keys them: `eval/<set>/<figure>`."""
    return {f"eval/{name}/{key}": value for name, samples in by_set.items()
            for key, value in set_metrics(samples).items()}


def round_sets(figures: Mapping[str, object]) -> list[str]:
    """The eval sets of a round's flat figures (a `metrics.jsonl` line, a recorded round)."""
    return sorted({k.split("/")[1] for k in figures if k.startswith("eval/") and k.endswith("/samples")})


def top_pass(figures: Mapping[str, object], name: str) -> tuple[int, float] | None:
    """`(k, pass@k)` of set `name` for the largest k reported, None when there is none."""
    ks = sorted(int(k.rsplit("@", 1)[1]) for k in figures if k.startswith(f"eval/{name}/pass@"))
    return (ks[-1], float(figures[f"eval/{name}/pass@{ks[-1]}"])) if ks else None


def failures_by_class(figures: Mapping[str, object], name: str) -> dict[str, int]:
    """Set `name`'s failed samples by class, most first: `{"infra": 2, "timeout": 1}`."""
    prefix = f"eval/{name}/failed/"
    found = {k.removeprefix(prefix): int(v) for k, v in figures.items() if k.startswith(prefix)}
    return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))


def failures_text(figures: Mapping[str, object], name: str) -> str:
    """`3 (infra 2, timeout 1)`, `0`, or `-` for a round recorded without the count."""
    failed = figures.get(f"eval/{name}/failed")
    if failed is None:
        return "-"
    classes = failures_by_class(figures, name)
    return f"{failed} ({', '.join(f'{c} {n}' for c, n in classes.items())})" if classes else str(failed)
