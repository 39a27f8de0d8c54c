"""The planner and what it stands on: the hardware profile, the plan, the smallest budget, the prediction."""
