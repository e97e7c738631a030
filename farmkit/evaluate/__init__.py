"""Evaluation: win rates, length control, correlation, history, plots, training
metrics, over-optimization, and farm-eval's leaderboard (run)."""
