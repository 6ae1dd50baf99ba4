"""Comparing finished runs (``python -m experiments.compare``): find, group, summarize, report."""
