"""Preference-learning methods written on torch/transformers, one module and config dataclass each."""
