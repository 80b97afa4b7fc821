"""SmokeWorkflow: one activity that samples from the rollout engine; proves the wiring.

`vime smoke` runs it against the embedded services. Like every workflow module it imports
nothing heavy: the activity is called by name, its input and output are small dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy


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


@workflow.defn(name="SmokeWorkflow")
class SmokeWorkflow:
    @workflow.run
    async def run(self, inp: SmokeInput) -> SmokeResult:
        return await workflow.execute_activity(
            "smoke_generate",
            inp,
            result_type=SmokeResult,
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
