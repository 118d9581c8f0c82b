"""Judging measurements: verdicts with intervals, regression detection over nights, CI gates.

Pure library code (numpy, scipy, pydantic): the server, the CLI and the bench call it; nothing
here talks to a database or the network. See docs/statistics.md.
"""
