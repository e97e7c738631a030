"""The project's own tooling, not shipped in the wheel: the docs generator (python -m
dev.docs), the mutation gate (dev/mutants.py) and the relayout script."""
