"""A run's config: the flags (`flags.VimeArgs`), their parser (`args.parse_args`), cross-flag
resolution, the checks before anything starts (`preflight`), --vllm-*/--router-* forwarding, and each
run's config read back by run id (`run_args`)."""
