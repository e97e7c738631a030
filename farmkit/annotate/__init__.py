"""Simulated and real annotators: pools, judges, backends, the cache and the cost accounting."""
