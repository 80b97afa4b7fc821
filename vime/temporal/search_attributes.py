"""The custom search attributes vime sets on its workflows, so runs are searchable in the UI:
`temporal workflow list --query "RolloutStatus='completed' AND Reward >= 0.5"`, or a run's eval
rounds: `--query "VimeRunId='X' AND VimeEval=true"`.

Stays standard-library + temporalio only: workflows import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.common import SearchAttributeKey


@dataclass(frozen=True)
class AttributeKind:
    cli_name: str  # the type name `temporal ... --search-attribute NAME=TYPE` expects


KEYWORD = AttributeKind("Keyword")
DOUBLE = AttributeKind("Double")
INT = AttributeKind("Int")
BOOL = AttributeKind("Bool")

# "RunId" would be the natural name for vime's run, but Temporal reserves it as a system
# attribute (the id of one workflow run): vime's run id is `VimeRunId`.
SEARCH_ATTRIBUTES: dict[str, AttributeKind] = {
    "VimeRunId": KEYWORD,
    "RolloutId": KEYWORD,
    "RolloutStatus": KEYWORD,
    "Reward": DOUBLE,
    "PolicyVersion": INT,
    "FailureClass": KEYWORD,
    "VimeEval": BOOL,  # true on an eval round's workflows and on `vime eval`'s run
}

RUN_ID = SearchAttributeKey.for_keyword("VimeRunId")
ROLLOUT_ID = SearchAttributeKey.for_keyword("RolloutId")
ROLLOUT_STATUS = SearchAttributeKey.for_keyword("RolloutStatus")
REWARD = SearchAttributeKey.for_float("Reward")
POLICY_VERSION = SearchAttributeKey.for_int("PolicyVersion")
FAILURE_CLASS = SearchAttributeKey.for_keyword("FailureClass")
EVAL = SearchAttributeKey.for_bool("VimeEval")

ALL_KEYS = [RUN_ID, ROLLOUT_ID, ROLLOUT_STATUS, REWARD, POLICY_VERSION, FAILURE_CLASS, EVAL]
