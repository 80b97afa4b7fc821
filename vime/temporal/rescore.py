"""What `vime rescore` and its worker agree on: names, the queue, and the small dataclasses that
`RescoreWorkflow` (workflows/rescore.py) passes. Standard library only: the workflow imports it."""

from __future__ import annotations

from dataclasses import dataclass

RESCORE_WORKFLOW = "RescoreWorkflow"
RESCORE_PAGE = "rescore_page"
RESCORE_TASK_QUEUE = "vime-rescore"
PAGE_HEARTBEAT_SECONDS = 60


@dataclass
class RescoreInput:
    run_id: str
    scorer: str  # names the reward code: a hash of its source
    custom_rm_path: str
    group_rm: bool = False
    page_size: int = 256
    after_id: int = 0  # where a continued-as-new workflow goes on
    samples: int = 0
    written: int = 0


@dataclass
class RescorePage:
    run_id: str
    scorer: str
    custom_rm_path: str
    group_rm: bool
    after_id: int
    limit: int


@dataclass
class RescorePageResult:
    last_id: int
    samples: int
    written: int


@dataclass
class RescoreOutput:
    samples: int  # samples scored
    written: int  # rewards stored by this rescore (0 when this code had scored them all before)
