"""Bench orchestration: a bench run end to end (run.py) and the workloads it feeds the engines."""
