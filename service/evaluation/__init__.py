"""Evaluation: measurement instruments over sampled completions (deterministic, total, explainable)."""
