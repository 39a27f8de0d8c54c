"""LLM in a Flash as a baseline: driver.py (pi2-engine with --policy llmflash)."""
