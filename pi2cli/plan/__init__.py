"""The planner and what it stands on: the hardware profile, the plan, and memory budgets made real."""
