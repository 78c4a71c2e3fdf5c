"""Rollout side: the `RolloutEngine` seam and its vLLM backend (in-process, weight pushes, sleep),
agentic multi-turn rollouts with partial rollout, and the Ray `RolloutActor`. See docs/ROLLOUT.md."""
