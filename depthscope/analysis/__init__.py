"""Estimators: pure functions of traces (dilution, patterns, collective rank, theory)."""
