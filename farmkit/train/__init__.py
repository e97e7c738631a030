"""Training machinery every method shares: the on-policy loop and its rollouts and
rollout backends, checkpoints, schedules, the policy wrapper, the estimators and losses, the
gold evaluation, launch and tracking, the options' config dataclasses and the metrics writer.
Below the pillars (methods/ holds one module per method and imports this), above farmkit.lm."""
