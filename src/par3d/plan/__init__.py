"""The planner: pure arithmetic, no torch."""
