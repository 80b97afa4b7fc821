"""What `vime smoke` and its worker agree on: the workflow's and activity's names, its input and
result. Standard library only: `workflows/smoke.py` imports it in the sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field

SMOKE_WORKFLOW = "SmokeWorkflow"
SMOKE_GENERATE = "smoke_generate"


@dataclass
class SmokeInput:
    engine_url: str
    model_dir: str
    prompts: list[str]
    max_tokens: int = 16
    temperature: float = 1.0


@dataclass
class SmokeCompletion:
    prompt: str
    prompt_tokens: int
    token_ids: list[int]
    mean_logprob: float
    finish_reason: str
    text: str = ""


@dataclass
class SmokeResult:
    completions: list[SmokeCompletion] = field(default_factory=list)
