"""MLC-LLM: driver.py, runner.py (the runner the user provides: a URL or a command)."""
