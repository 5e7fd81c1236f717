"""Orchestration: inputs -> models -> traces -> figures -> files (report, zoo, sweeps, experiments).

The only room that runs models for analysis and writes many files; ``cli.py`` parses and calls
these, and the rooms below (schemes, probes, analysis, figures) never import from here.
"""
