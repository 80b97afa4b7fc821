"""The advantage estimators' names, apart from their math (`vime.train.advantages`, which imports
torch), so the flag parser can offer them as choices without importing torch."""

ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
GROUP_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")  # normalized within a prompt's group
