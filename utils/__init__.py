"""Evaluation helpers shared by the baseline scripts."""
