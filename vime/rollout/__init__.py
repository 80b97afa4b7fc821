"""Rollouts: prompts in, scored `Sample`s out.

- `data_source`: prompt groups by position (`RolloutDataSource.prompt_group`), slime's data source;
- `dataset`: JSONL / Parquet prompt files (`PromptDataset`);
- `sampling`: vLLM sampling parameters from the `--rollout-*` flags;
- `generate`: the default generate function (token ids in, token ids and logprobs out);
- `rewards`: the reward hub (`--custom-rm-path`, `--rm-url`, built-in `--rm-type`s);
- `filters`: dynamic-sampling filters (`check_reward_nonzero_std`);
- `group`: `run_group`, one prompt group generated and scored, the unit a rollout activity runs;
- `vllm_rollout`: `generate_rollout`, the default `--rollout-function-path`.

Submodules are imported where used; this package imports nothing heavy on its own.
"""
