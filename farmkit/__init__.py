"""farmkit: simulated preference data, preference-learning methods and their evaluation, as Unix tools."""

__version__ = "0.1.0"
